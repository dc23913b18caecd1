"""The master's side of allocation: proposals in, placed trial tasks out.

The controller hands over each trial ready to run; the allocator predicts
it (the cost model), refuses one that cannot fit a GPU's memory or any node,
asks the :class:`Planner` which start now, records every allocation on its
trial (shape, place, predicted rate and time, reason), grows running trials
onto GPUs that free up (rate allocation), and refines the GPUs' speeds from
the rates trials measure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import optuna

from hpo.allocation._inventory import Inventory
from hpo.allocation._oracle import Oracle
from hpo.allocation._planner import Candidate, Planner, Start, curve_from
from hpo.allocation._shape import TrialShape
from hpo.machine import gpu_memory_gb
from hpo.store import StudyStore
from hpo.store.records import ALLOCATION_ATTR, allocations_of, profiles_of, run_of

__all__ = ["Allocator", "PassThrough", "make_allocator"]

_GROW_EVERY_S = 2.0
_SPEED_WEIGHT = 0.5  # how much one measured rate moves a GPU's speed estimate


class Allocator:
    """Allocation for one study (see the module docstring)."""

    def __init__(self, store: StudyStore, planner: Planner, oracle: Oracle | None,
                 make_task: Callable[..., Any], spec: Any) -> None:
        self.store, self.planner, self.oracle = store, planner, oracle
        self._make_task, self._spec = make_task, spec
        self.refused: list[int] = []  # trial numbers failed before they ran
        self._placed: dict[int, Start] = {}
        self._grown_at = 0.0
        # What a GPU holds, for the model's memory check (nvidia-smi asked once).
        self._gpu_memory_gb = spec.allocation.gpu_memory_gb or (gpu_memory_gb() if oracle else None)

    @property
    def pending(self) -> int:
        return self.planner.pending

    def propose(self, number: int, trial_id: int, params: dict[str, Any], new: bool = False) -> None:
        """A trial ready to run (``new``: created just now; its task reads the
        replica when it is placed either way)."""
        self._add(Candidate(number, trial_id, params, self._spec.shape_of(params),
                            config={**self._spec.fixed, **params}))

    def resume(self, trial: optuna.trial.FrozenTrial, after_segment: int, why: str | None) -> None:
        """A suspended or lost trial, on the GPU count it last had."""
        shape = self._spec.shape_of(trial.params)
        last = allocations_of(trial)
        if last and last[-1].get("gpus") and shape.gpus >= 1:
            shape = replace(shape, gpus=int(last[-1]["gpus"]))
        if self.planner.policy == "rate":  # a grow asked for is done by this resumption
            self.store.set_resize(StudyStore.trial_id(trial), None)
        self._add(Candidate(trial.number, StudyStore.trial_id(trial), dict(trial.params), shape,
                            after_segment=after_segment, resume=True, why=why,
                            config={**self._spec.fixed, **trial.params}, allocated=len(last)),
                  measured=profiles_of(trial))

    def starts(self, room: int) -> list[tuple[Any, bool]]:
        """The tasks to submit now, each with its priority."""
        for misfit in self.planner.never_fits():
            self._refuse(misfit, "Unschedulable", f"no node offers {misfit.shape.describe()}")
        tasks = []
        for start in self.planner.starts(room):
            self._placed[start.candidate.number] = start
            tasks.append((self._task(start), start.candidate.resume))
        return tasks

    def finished(self, number: int, trial: optuna.trial.FrozenTrial) -> None:
        """Trial ``number``'s task is over (``trial`` as stored then): free its
        place, learn its GPU's speed."""
        start = self._placed.pop(number, None)
        if start is not None and start.placement is not None and self.oracle is not None:
            self._learn_speed(start, trial)
        self.planner.release(number)

    def drain(self) -> list[Candidate]:
        return self.planner.drain()

    def ahead(self, parallel: int, queued: int) -> int:
        """Trials held ready beyond the running ones: enough to choose the
        longest or form a flotilla from (a whole grid up to 256)."""
        if not self._spec.allocation.planned:
            return parallel
        return max(parallel, min(self._spec.max_trials, 256))

    def grow(self, running: dict[int, int]) -> None:
        """Rate allocation: grow a running trial onto free GPUs when it saves
        more than its restart (``running``: trial number -> trial id)."""
        if self.planner.policy != "rate" or self.oracle is None or self.planner.pending:
            return
        if time.monotonic() - self._grown_at < _GROW_EVERY_S:
            return
        self._grown_at = time.monotonic()
        state = {}
        for number, start in self._placed.items():
            if number not in running or start.candidate.curve is None or not start.shape.gpus >= 1:
                continue
            trial = self.store.trial(running[number])
            config = start.candidate.config
            done = len(trial.intermediate_values) / max(self.oracle.cost(config).epochs, 1)
            left = self.oracle.samples(config) * max(1.0 - done, 0.0)
            state[number] = (start.candidate.curve, int(start.shape.gpus), left, _restart_s(trial))
        choice = self.planner.grow(state)
        if choice is not None:
            number, gpus = choice
            trial_id = running[number]
            self.store.record_event(trial_id, "allocated", None,
                                    f"rate allocation: grow to {gpus} GPU(s) from its checkpoint "
                                    "(the time saved exceeds the restart)")
            self.store.set_resize(trial_id, gpus)

    # -- inside --------------------------------------------------------------------

    def _add(self, candidate: Candidate, measured: dict | None = None) -> None:
        oracle = self.oracle
        if oracle is not None:
            config = candidate.config
            candidate.predicted_s = oracle.trial_s(config)
            if not self._fits_memory(candidate):
                return
            per_node = self.planner.inventory.gpus_per_node if self.planner.inventory else 1
            rates = {int(k): v["rate"] for k, v in (measured or {}).items()
                     if k >= 1 and v.get("unit") == "samples/s" and float(k).is_integer()}
            candidate.curve = curve_from(lambda m: oracle.rate(config, m), per_node, rates)
        self.planner.add(candidate)

    def _fits_memory(self, candidate: Candidate) -> bool:
        """Refuse, before it runs, a trial the cost model says overflows its GPU."""
        limit = self._gpu_memory_gb
        shape = candidate.shape
        if not limit or not shape.gpus:
            return True
        if self.oracle is None:
            raise RuntimeError("hpo internal error: asked by _add() with a cost model only")
        need = self.oracle.memory_gb(candidate.config, max(int(shape.gpus), 1))
        room = limit * (shape.gpus if shape.shared else 1.0)
        if need <= room:
            return True
        self._refuse(candidate, "PredictedOutOfMemory",
                     f"the cost model predicts {need:.3g} GB per GPU and the trial has {room:.3g} GB "
                     "(lower its batch size or model, or give it more or bigger GPUs)")
        return False

    def _refuse(self, candidate: Candidate, kind: str, message: str) -> None:
        self.store.fail(candidate.trial_id, {"type": kind, "message": message})
        self.refused.append(candidate.number)

    def _task(self, start: Start) -> Any:
        candidate, shape = start.candidate, start.shape
        shape = self._time_limited(candidate, shape, start)
        self._record(start, shape)
        alloc = self._spec.allocation
        return self._make_task(candidate.number, candidate.trial_id, candidate.params,
                               after_segment=candidate.after_segment, shape=shape,
                               placement=start.placement, profile_batches=alloc.profile_batches,
                               resizable=self.planner.policy == "rate" and shape.gpus >= 1)

    def _time_limited(self, candidate: Candidate, shape: TrialShape, start: Start) -> TrialShape:
        factor = self._spec.allocation.time_limit_factor
        if factor is None or self.oracle is None:
            return shape
        speed = start.placement.speed if start.placement else 1.0
        predicted = self.oracle.trial_s(candidate.config, max(int(shape.gpus), 1), speed)
        limit = factor * predicted
        return replace(shape, time_limit_s=min(limit, shape.time_limit_s or limit))

    def _record(self, start: Start, shape: TrialShape) -> None:
        """The allocation on the trial: shape, place, prediction, reason."""
        candidate, placement = start.candidate, start.placement
        index, candidate.allocated = candidate.allocated, candidate.allocated + 1
        speed = placement.speed if placement else 1.0
        record: dict[str, Any] = {
            "at": time.time(), "gpus": shape.gpus, "cpus": shape.cpus, "nodes": shape.nodes,
            "hosts": list(placement.hosts) if placement else None,
            "devices": list(placement.devices) if placement else None,
            "speed": speed, "reason": start.reason, "policy": self.planner.policy,
            "time_limit_s": shape.time_limit_s,
        }
        if self.oracle is not None:
            gpus = max(int(shape.gpus), 1)
            config = candidate.config
            record.update(predicted_rate=self.oracle.rate(config, gpus, speed),
                          predicted_step_s=self.oracle.step_s(config, gpus, speed),
                          predicted_s=self.oracle.trial_s(config, gpus, speed))
        self.store.note(candidate.trial_id, f"{ALLOCATION_ATTR}{index:03d}", record)
        where = f" on {placement.describe()}" if placement else ""
        self.store.record_event(candidate.trial_id, "allocated", None,
                                f"{shape.describe()}{where}: {start.reason}")

    def _learn_speed(self, start: Start, trial: optuna.trial.FrozenTrial) -> None:
        """A one-GPU trial's measured rate against the model's at speed 1 says
        how fast its GPU is: the estimate moves halfway there."""
        # finished() asks with a placement (the planner's inventory gave it) and a cost model.
        if start.placement is None or self.oracle is None or self.planner.inventory is None:
            raise RuntimeError("hpo internal error: finished() without a placement or a cost model")
        if start.shape.gpus != 1 or len(start.placement.devices) != 1:
            return
        profile = profiles_of(trial).get(1.0)
        if not profile or profile.get("unit") != "samples/s":
            return
        observed = profile["rate"] / self.oracle.rate(start.candidate.config, 1, 1.0)
        node = next(n for n in self.planner.inventory.nodes if n.host == start.placement.hosts[0]
                    and n.worker == start.placement.workers[0])
        device = next(d for d in node.devices if d.id == start.placement.devices[0])
        device.speed += _SPEED_WEIGHT * (observed - device.speed)


def _restart_s(trial: optuna.trial.FrozenTrial) -> float | None:
    """What restarting the trial costs, as it measured its own start: from
    its segment's start to its first batch (process, imports, checkpoint)."""
    started = run_of(trial).get("segment_started_at")
    firsts = [p["first_batch_at"] for p in profiles_of(trial).values() if p.get("first_batch_at")]
    return max(firsts[-1] - started, 0.0) if started and firsts else None


class PassThrough:
    """The allocator of a study whose trials simply run on their configured
    shape wherever the engine puts them (as Optuna's ``NopPruner``): every
    trial handed over starts at the next :meth:`starts`, in order, so the
    master has one mode."""

    def __init__(self, make_task: Callable[..., Any]) -> None:
        self._make_task = make_task
        self._held: list[tuple[Candidate, bool]] = []  # with whether it is new
        self.refused: list[int] = []  # never filled: nothing is refused here

    @property
    def pending(self) -> int:
        return len(self._held)

    def propose(self, number: int, trial_id: int, params: dict[str, Any], new: bool = False) -> None:
        """A trial ready to run (``new``: created just now, nothing to read of it)."""
        # Its candidates have no shape (None): none is asked of them here.
        self._held.append((Candidate(number, trial_id, params, None), new))  # type: ignore[arg-type]

    def resume(self, trial: optuna.trial.FrozenTrial, after_segment: int, why: str | None) -> None:
        """A suspended or lost trial: it goes ahead of queued tasks."""
        self._held.append((Candidate(trial.number, StudyStore.trial_id(trial), dict(trial.params),
                                     None,  # type: ignore[arg-type]
                                     after_segment=after_segment, resume=True, why=why), False))

    def starts(self, room: int) -> list[tuple[Any, bool]]:
        """Every trial held, whatever the room: the master's window bounds them."""
        held, self._held = self._held, []
        return [(self._make_task(c.number, c.trial_id, c.params, after_segment=c.after_segment, new=new),
                 c.resume) for c, new in held]

    def finished(self, number: int, trial: optuna.trial.FrozenTrial) -> None:
        """Nothing to free: the engine placed the trial."""

    def grow(self, running: dict[int, int]) -> None:
        """No rate allocation without an allocator."""

    def drain(self) -> list[Candidate]:
        held, self._held = self._held, []
        return [c for c, _ in held]

    def ahead(self, parallel: int, queued: int) -> int:
        """The engine's own queue: ``queued`` tasks, so that a freed slot
        starts its next trial without waiting for the master."""
        return queued


def make_allocator(spec: Any, inventory: Callable[[], Inventory | None], store: StudyStore,
                   objective: Any, cache: Any, make_task: Callable[..., Any]) -> Allocator | PassThrough:
    """The allocator of a study: a :class:`PassThrough` when trials simply
    run on their configured shape wherever the engine puts them.
    ``inventory`` asks the engine for its nodes and GPUs (None: it places
    trials itself); asked only when the study needs it."""
    alloc = spec.allocation
    largest = spec.shape_bounds[1]
    nodes = inventory() if (largest.gpus or largest.nodes > 1 or alloc.planned) else None
    if not (alloc.planned or spec.resources.varies or nodes is not None):
        return PassThrough(make_task)
    needs_model = alloc.policy != "fifo" or alloc.time_limit_factor or alloc.placement == "speed"
    oracle = Oracle.of(alloc.cost_model, objective, cache) if needs_model or alloc.cost_model else None
    planner = Planner(alloc.policy, alloc.placement == "speed", nodes)
    return Allocator(store, planner, oracle, make_task, spec)
