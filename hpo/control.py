"""The master loop: keep ``parallel`` trials in flight until the study is done.

Asynchronous, not batch-synchronous: as soon as one trial finishes, the next
configuration is asked and submitted. Completion is learned from the engine
where it can tell (Dask), else from the store (COMPSs has no wait-any); results
are always read from the store, which the worker wrote before its task ended.

The study ends when the budget (``max_trials``) is used, the space is
exhausted, the metric reaches its ``target``, or the wall-clock budget
(``timeout_s``) runs out. On a target or timeout stop, no new trial starts,
tasks not yet started are cancelled, and running trials see
``trial.should_stop()`` at their next check.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property, partial
from typing import Any

import optuna

from hpo.engines import Engine
from hpo.errors import StopRequested
from hpo.progress import ProgressLine
from hpo.recovery import await_live_trials, cancel_never_started, end_trial, fail_lost_trial, unfinished
from hpo.results import StudyResult
from hpo.scheduling import Policy, RoundRobin, Waiting, convergence, make_policy, segment_steps
from hpo.search import Searcher, open_search
from hpo.space import StudySpec
from hpo.store import RunDir, open_storage
from hpo.trial import TrialState, TrialTask
from hpo.trial._objective import Objective
from hpo.trial._handle import record_event
from hpo.trial._state import HEARTBEAT_ATTR, RUN_ATTR, STOP_ATTR, grouped_attrs

__all__ = ["Controller"]

_POLL_S = 0.5  # longest wait between looks at the engine or the store


@dataclass
class _InFlight:
    trial_id: int
    handle: Any
    # The trial's last segment index when this task was submitted (-1: none):
    # a later suspended segment means this task is done.
    segment_before: int = -1

    def is_done(self, trial: optuna.trial.FrozenTrial) -> bool:
        if trial.state.is_finished():
            return True
        run = trial.user_attrs.get(RUN_ATTR) or {}
        return bool(run.get("suspended")) and run.get("segment", -1) > self.segment_before


@dataclass
class Controller:
    """Runs one study of ``spec`` on ``engine``, storing everything in ``run_dir``."""

    spec: StudySpec
    run_dir: RunDir
    storage_url: str
    engine: Engine
    objective: str | Objective | None = None
    progress: bool = True
    _in_flight: dict[int, _InFlight] = field(default_factory=dict, init=False)
    _trial_ids: dict[int, int] = field(default_factory=dict, init=False)

    @cached_property
    def _policy(self) -> Policy | None:
        return make_policy(self.spec.scheduling.policy)

    def run(self) -> StudyResult:
        storage = open_storage(self.storage_url)
        await_live_trials(storage, self.spec.name, self.progress)
        cancel_never_started(storage, self.spec.name)
        searcher = open_search(self.spec, storage)
        study = searcher.study
        if (study.user_attrs.get(STOP_ATTR) or {}).get("reason") == "target":
            return StudyResult.from_study(study, self.spec.metric.name)  # already done
        study.set_user_attr(STOP_ATTR, None)
        with self.engine:
            try:
                self._loop(searcher, study)
            except (KeyboardInterrupt, StopRequested) as exc:
                self._suspend_running(study, "SIGINT" if isinstance(exc, KeyboardInterrupt) else str(exc))
                raise
        return StudyResult.from_study(study, self.spec.metric.name)

    def _suspend_running(self, study: optuna.Study, signal_name: str) -> None:
        """A clean stop: running trials checkpoint and suspend at their next
        check, for up to ``HPO_STOP_GRACE_S`` (30 s); the next run resumes them."""
        storage = study._storage
        study.set_user_attr(STOP_ATTR, {"reason": signal_name, "resume": True})
        grace = float(os.environ.get("HPO_STOP_GRACE_S", "30"))
        self._cancel_pending(storage, signal_name)
        if self._in_flight:
            print(f"\nhpo: {signal_name}: letting {len(self._in_flight)} running trials checkpoint "
                  f"(up to {grace:g} s)", file=sys.stderr)
        deadline = time.monotonic() + grace
        while self._in_flight and time.monotonic() < deadline:
            for number, flight in list(self._in_flight.items()):
                trial = storage.get_trial(flight.trial_id)
                if TrialState.of(trial).is_finished or flight.is_done(trial):
                    del self._in_flight[number]
            time.sleep(0.2)
        for flight in self._in_flight.values():
            # Still running when the engine goes: lost with it, to be resumed
            # from its checkpoint at once by the next run (no heartbeat to wait out).
            storage.set_trial_user_attr(flight.trial_id, HEARTBEAT_ATTR, {"abandoned_at": time.time()})

    def _loop(self, searcher: Searcher, study: optuna.Study) -> None:
        parallel = self.spec.search.parallel or self.engine.slots
        # Segmented policies choose when a slot frees, so nothing is queued ahead.
        window = parallel + (0 if self._policy else self._queued(parallel))
        progress = ProgressLine(self.spec.max_trials, self.spec.metric.name, enabled=self.progress)
        deadline = time.monotonic() + (self.spec.search.timeout_s or float("inf"))
        stopping = exhausted = False
        tally = _Tally.of(study)
        # Trials an earlier run left suspended or lost go on first, from their checkpoints.
        leftovers = {w.number: w for w in map(partial(self._waiting, study), unfinished(study))}
        waiting: dict[int, Waiting] = {}
        progress.update(*tally.line(0))
        while True:
            while not stopping and len(self._in_flight) < window:
                opened = tally.counted + len(self._in_flight) + len(waiting) + len(leftovers)
                if leftovers:
                    self._resume(study, leftovers, "left unfinished by an earlier run")
                elif not exhausted and opened < self.spec.max_trials:
                    exhausted = not self._start_new(study, searcher)
                elif waiting:
                    self._resume(study, waiting)
                else:
                    break
            if not self._in_flight:
                break
            for number in self._finished(study):
                state, value = self._collect(study, number)
                if state is TrialState.SUSPENDED:
                    waiting[number] = self._waiting(study, study._storage.get_trial(
                        self._trial_ids[number]))
                    continue
                tally.add(number, state, value, study.direction)
                if not stopping and self._reached_target(state, value):
                    stopping = self._stop(study, {"reason": "target", "trial": number, "value": value})
            if not stopping and time.monotonic() > deadline:
                stopping = self._stop(study, {"reason": "timeout_s", "timeout_s": self.spec.search.timeout_s})
            progress.update(*tally.line(len(self._in_flight)))
        if stopping:
            _stop_suspended(study, [*waiting.values(), *leftovers.values()],
                            study.user_attrs.get(STOP_ATTR) or {})
        progress.close()

    def _start_new(self, study: optuna.Study, searcher: Searcher) -> bool:
        """Submit the next proposed configuration; False when the space is exhausted."""
        proposal = searcher.ask()
        if proposal is None:
            return False
        segment = self.spec.scheduling.segment_steps if self._policy else None
        task = self._task(study, proposal.number, proposal.trial_id, proposal.params, segment)
        self._submit(proposal.number, proposal.trial_id, task)
        return True

    def _resume(self, study: optuna.Study, waiting: dict[int, Waiting], why: str | None = None) -> None:
        """Run the next segment of the suspended trial the policy picks."""
        policy = self._policy or RoundRobin()  # suspended by an earlier run, now FIFO
        chosen = policy.pick(list(waiting.values()))
        record_event(study._storage, chosen.trial_id, "resumed", None,
                     why or policy.why(chosen, list(waiting.values())))
        del waiting[chosen.number]
        stored = study._storage.get_trial(chosen.trial_id)
        segment = chosen.segment_steps if self._policy else None
        task = self._task(study, chosen.number, chosen.trial_id, stored.params, segment)
        before = (stored.user_attrs.get(RUN_ATTR) or {}).get("segment", -1)
        self._submit(chosen.number, chosen.trial_id, task, priority=True, segment_before=before)

    def _submit(self, number: int, trial_id: int, task: TrialTask, priority: bool = False,
                segment_before: int = -1) -> None:
        self._trial_ids[number] = trial_id
        handle = self.engine.submit(task, priority=priority)
        self._in_flight[number] = _InFlight(trial_id, handle, segment_before)

    def _waiting(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Waiting:
        """A suspended (or lost) trial as the policies see it, from its record in the store."""
        if TrialState.of(trial) is TrialState.RUNNING:  # lost: goes first
            return Waiting(trial.number, trial._trial_id, since=0.0, convergence=math.inf,
                           segment_steps=self.spec.scheduling.segment_steps)
        maximize = self.spec.metric.direction == "maximize"
        losses = _segment_losses(trial, maximize)
        best = _best_reported(trial, maximize)
        sched = self.spec.scheduling
        last = losses[-1] if losses else []
        previous = losses[-2] if len(losses) > 1 else None
        _, _, segments = grouped_attrs(trial)
        return Waiting(
            number=trial.number, trial_id=trial._trial_id,
            since=segments[-1]["ended_at"] if segments else 0.0,
            convergence=convergence(last, previous),
            segment_steps=segment_steps(sched.segment_steps, sched.milestones, best, maximize),
        )

    def _queued(self, parallel: int) -> int:
        """How many trials to prepare ahead and queue in the engine.

        A slot that frees then starts its next trial at once instead of waiting
        for the master. Grid and random search lose nothing by asking early
        (one per slot); Bayesian search would propose with less information
        (one in all). None when queued tasks could start early, i.e. when the
        engine has more slots than ``parallel``.
        """
        if parallel < self.engine.slots:
            return 0
        return parallel if self.spec.search.algorithm in ("grid", "random") else 1

    def _task(self, study: optuna.Study, number: int, trial_id: int, params: dict[str, Any],
              segment: int | None) -> TrialTask:
        spec, resources = self.spec, self.spec.resources
        return TrialTask(
            storage=self.storage_url, study_name=spec.name, study_id=study._study_id,
            trial_id=trial_id, number=number, config={**spec.fixed, **params},
            objective=self.objective or spec.objective, metric=spec.metric.name,
            checkpoint_dir=str(self.run_dir.checkpoint_dir(number)),
            cpus=resources.cpus, gpus=resources.gpus, time_limit_s=resources.time_limit_s,
            early_stopping=asdict(spec.early_stopping), direction=spec.metric.direction,
            segment_steps=segment, retries=spec.retries,
            isolate=resources.time_limit_s is not None or resources.gpus > 0,
        )

    def _finished(self, study: optuna.Study) -> list[int]:
        """Numbers of in-flight trials that are finished."""
        numbers = list(self._in_flight)
        handles = [self._in_flight[n].handle for n in numbers]
        if self.engine.reports_completion:
            done = {id(h) for h in self.engine.wait(handles, _POLL_S)}
            return [n for n, h in zip(numbers, handles) if id(h) in done]
        self.engine.wait(handles, _POLL_S)
        storage = study._storage
        return [n for n in numbers
                if self._in_flight[n].is_done(storage.get_trial(self._in_flight[n].trial_id))]

    def _collect(self, study: optuna.Study, number: int) -> tuple[TrialState, float | None]:
        flight = self._in_flight.pop(number)
        try:
            self.engine.settle(flight.handle)
        except Exception as exc:  # the task itself failed: worker lost too often, etc.
            fail_lost_trial(study._storage, flight.trial_id, f"{type(exc).__name__}: {exc}")
        trial = study._storage.get_trial(flight.trial_id)
        return TrialState.of(trial), trial.value if trial.values else None

    def _reached_target(self, state: TrialState, value: float | None) -> bool:
        target = self.spec.metric.target
        if target is None or state is not TrialState.COMPLETE:
            return False
        return value >= target if self.spec.metric.direction == "maximize" else value <= target

    def _stop(self, study: optuna.Study, reason: dict[str, Any]) -> bool:
        """Tell running trials to stop, and cancel the tasks not started yet."""
        study.set_user_attr(STOP_ATTR, reason)
        storage = study._storage
        self._cancel_pending(storage, reason["reason"])
        for number, flight in list(self._in_flight.items()):
            trial = storage.get_trial(flight.trial_id)
            if TrialState.of(trial) is TrialState.SUSPENDED and not flight.is_done(trial):
                self.engine.cancel(flight.handle)  # its next segment has not started
                _stop_suspended(study, [self._waiting(study, trial)], reason)
                del self._in_flight[number]
        return True

    def _cancel_pending(self, storage: optuna.storages.BaseStorage, why: str) -> None:
        """Cancel the queued tasks of trials no worker has started."""
        for number, flight in list(self._in_flight.items()):
            if TrialState.of(storage.get_trial(flight.trial_id)) is TrialState.PENDING:
                self.engine.cancel(flight.handle)
                end_trial(storage, flight.trial_id, "cancelled", f"study stopped ({why})")
                del self._in_flight[number]


@dataclass
class _Tally:
    """Counts for the budget and the progress line."""

    counted: int = 0
    failed: int = 0
    best: tuple[int, float] | None = None

    @classmethod
    def of(cls, study: optuna.Study) -> "_Tally":
        tally = cls()
        for trial in study.get_trials(deepcopy=False):
            state = TrialState.of(trial)
            if state.is_finished:
                tally.add(trial.number, state, trial.value if trial.values else None, study.direction)
        return tally

    def add(self, number: int, state: TrialState, value: float | None,
            direction: optuna.study.StudyDirection) -> None:
        if state is TrialState.CANCELLED:
            return  # its configuration was not used up
        self.counted += 1
        self.failed += state in (TrialState.FAILED, TrialState.TIMEOUT)
        if state is TrialState.COMPLETE:
            maximize = direction == optuna.study.StudyDirection.MAXIMIZE
            if self.best is None or (value > self.best[1] if maximize else value < self.best[1]):
                self.best = (number, value)

    def line(self, running: int) -> tuple[int, int, int, tuple[int, float] | None]:
        return self.counted, running, self.failed, self.best


def _segment_losses(trial: optuna.trial.FrozenTrial, maximize: bool) -> list[list[float]]:
    """The losses (the metric, negated when maximised) of each segment, in order."""
    values = trial.intermediate_values
    sign = -1.0 if maximize else 1.0
    losses = []
    for segment in grouped_attrs(trial)[2]:
        first, last = segment.get("first_step"), segment.get("last_step")
        if first is not None:
            losses.append([sign * values[s] for s in range(first, last + 1) if s in values])
    return [seg for seg in losses if seg]


def _best_reported(trial: optuna.trial.FrozenTrial, maximize: bool) -> float | None:
    """The best metric value a trial has reported so far."""
    values = trial.intermediate_values.values()
    return (max(values) if maximize else min(values)) if values else None


def _stop_suspended(study: optuna.Study, waiting: list[Waiting], stop: dict[str, Any]) -> None:
    """The study stopped: suspended trials end as STOPPED, with their best value so far."""
    storage = study._storage
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    for w in waiting:
        trial = storage.get_trial(w.trial_id)
        value = _best_reported(trial, maximize)
        reason = f"stopped: {stop.get('reason')}"
        record_event(storage, w.trial_id, "stopped", None, f"the study stopped while suspended ({reason})")
        run = dict(trial.user_attrs.get(RUN_ATTR) or {})
        storage.set_trial_user_attr(w.trial_id, RUN_ATTR, {**run, "suspended": False, "stop_reason": reason})
        try:
            storage.set_trial_state_values(w.trial_id, optuna.trial.TrialState.PRUNED,
                                           None if value is None else [value])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
