"""Which waiting trials start now, on what shape, and where.

The master hands the planner every trial ready to run (new ones, and
suspended or lost ones to resume); the planner answers with those that start
now, each with its shape and, on engines that let hpo choose, its place:

- ``fifo``: in the order proposed, each on the shape its configuration asks for;
- ``longest_first``: the longest predicted trial first (the cost model), the
  rest backfilling what is free; a grid then needs far fewer slots to finish
  in about the same time;
- ``rate`` (FLEET): trials get GPU counts so that those started together train
  at the rate of the fastest of them on one GPU (a flotilla), packed onto
  nodes; GPUs that free up with nobody waiting grow a running trial from its
  checkpoint when the predicted time saved exceeds the restart.

With ``placement: speed`` (heterogeneous devices) a GPU of relative speed
``s`` goes to the waiting trial whose predicted time is nearest ``s`` times the
longest's: the fastest GPUs to the trials that gain most, the slowest to
short ones.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hpo.allocation._fleet import RateCurve, flotilla, grow_choice, grow_saving, pack_nodes
from hpo.allocation._inventory import Inventory, Placement
from hpo.allocation._shape import TrialShape

__all__ = ["Candidate", "Start", "Planner"]


@dataclass
class Candidate:
    """A trial ready to run, and what the planner knows of it."""

    number: int
    trial_id: int
    params: dict[str, Any]
    shape: TrialShape  # what its configuration asks for
    after_segment: int = -1
    resume: bool = False  # suspended or lost: goes before new trials
    why: str | None = None
    predicted_s: float | None = None  # its whole run on one GPU of speed 1 (cost model)
    curve: RateCurve | None = None  # its training rate by GPU count
    config: dict[str, Any] = field(default_factory=dict)  # what its objective and cost model get
    allocated: int = 0  # allocations recorded on it so far (by earlier runs too)


@dataclass(frozen=True)
class Start:
    """A trial the planner starts now."""

    candidate: Candidate
    shape: TrialShape
    placement: Placement | None
    reason: str


@dataclass
class Planner:
    """Decides starts for one study (see the module docstring)."""

    policy: str = "fifo"
    speed_aware: bool = False
    inventory: Inventory | None = None
    restart_s: float = 10.0  # a grow's cost before a trial measured its own
    _pending: list[Candidate] = field(default_factory=list)
    _grow_to: dict[int, int] = field(default_factory=dict)
    _ends: dict[int, float] = field(default_factory=dict)  # running trials' predicted ends

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, candidate: Candidate) -> None:
        grown = self._grow_to.pop(candidate.number, None)
        if grown is not None:
            candidate.shape = replace(candidate.shape, gpus=grown)
            candidate.why = f"grown to {grown} GPUs from its checkpoint (rate allocation)"
        self._pending.append(candidate)

    def drain(self) -> list[Candidate]:
        """Every waiting candidate, taken out (the study stops)."""
        taken, self._pending = self._pending, []
        return taken

    def never_fits(self) -> list[Candidate]:
        """Candidates no node of the cluster could ever run, taken out."""
        if self.inventory is None:
            return []
        misfits = [c for c in self._pending if not self.inventory.fits_ever(c.shape)]
        self._pending = [c for c in self._pending if c not in misfits]
        return misfits

    def starts(self, room: int) -> list[Start]:
        """The candidates that start now (at most ``room``), resumed ones first."""
        resumed = [c for c in self._pending if c.resume]
        fresh = [c for c in self._pending if not c.resume]
        chosen = self._place_in_order(resumed, room, strict=True)
        room -= len(chosen)
        if self.policy == "rate" and self.inventory is not None and fresh:
            chosen += self._flotilla(fresh, room)
        elif self.policy in ("longest_first", "rate"):
            chosen += self._place_in_order(sorted(fresh, key=_longest_first), room, strict=False)
        else:
            chosen += self._place_in_order(fresh, room, strict=True)
        started = {id(s.candidate) for s in chosen}
        self._pending = [c for c in self._pending if id(c) not in started]
        return chosen

    def release(self, number: int) -> None:
        self._ends.pop(number, None)
        if self.inventory is not None:
            self.inventory.release(number)

    def grow(self, running: dict[int, tuple[RateCurve, int, float, float | None]]) -> tuple[int, int] | None:
        """With nobody waiting and whole GPUs free: the running trial to grow
        and its new GPU count (FLEET's reallocation), or None. ``running``:
        trial number -> (rate curve, GPUs now, samples left, its measured
        restart in seconds or None for ``restart_s``)."""
        if self.policy != "rate" or self._pending or self.inventory is None:
            return None
        per_node, free = self.inventory.gpus_per_node, self.inventory.free_gpus()
        best, best_saving = None, 0.0
        for number, (curve, now, left, restart) in running.items():
            restart = self.restart_s if restart is None else restart
            room = min(free, per_node - now, self._as_fast_free(number))  # within one node
            choice = grow_choice({number: (curve, now, left)}, room, restart) if room > 0 else None
            if choice is None or number in self._grow_to:
                continue
            saving = grow_saving(left, curve.rate(now), curve.rate(choice[1]), restart)
            if saving > best_saving:
                best, best_saving = choice, saving
        if best is not None:
            self._grow_to[best[0]] = best[1]
        return best

    # -- placing ----------------------------------------------------------------

    def _worth_starting(self, candidate: Candidate, speed: float, top: float) -> bool:
        """Whether ``candidate`` ends sooner on a GPU of ``speed`` now than on
        a faster one later: once the faster GPUs have run what they run and
        the longer waiting trials (their GPU-seconds shared among them), as
        predicted. One that would not waits for a faster GPU."""
        if speed >= top or candidate.predicted_s is None:
            return True
        if self.inventory is None:
            raise RuntimeError("hpo internal error: only a planner with an inventory gets here")
        now = time.monotonic()
        faster = [d for n in self.inventory.nodes for d in n.devices if d.speed > speed]
        busy_until = [end for number, end in self._ends.items()
                      if (held := self.inventory.held(number)) and held[0].speed > speed]
        ahead = sum(c.predicted_s for c in self._pending
                    if c.predicted_s is not None and c.predicted_s > candidate.predicted_s)
        backlog = sum(max(end - now, 0.0) for end in busy_until) + ahead / top
        frees_at = now + backlog / max(len(faster), 1)
        return now + candidate.predicted_s / speed <= frees_at + candidate.predicted_s / top

    def _one_speed_fits(self, shape: TrialShape) -> bool:
        """Whether some node has ``shape``'s GPUs all of one speed (else it takes mixed ones)."""
        if shape.devices <= 1:
            return False
        if self.inventory is None:
            raise RuntimeError("hpo internal error: only a planner with an inventory gets here")
        return any(sum(1 for d in n.devices if d.speed == s) >= shape.devices
                   for n in self.inventory.nodes for s in {d.speed for d in n.devices})

    def _as_fast_free(self, number: int) -> int:
        """GPUs trial ``number`` could grow by on one node: with speed
        awareness, counting only those at least as fast as its own (a slower
        one would set its pace), its own included."""
        if self.inventory is None:
            raise RuntimeError("hpo internal error: only a planner with an inventory gets here")
        held = self.inventory.held(number)
        if not self.speed_aware or held is None:
            return self.inventory.gpus_per_node
        placement, shape = held
        usable = [sum(1 for d in n.devices if d.speed >= placement.speed and
                      (d.used <= 1e-9 or (n.host == placement.hosts[0] and d.id in placement.devices)))
                  for n in self.inventory.nodes]
        return max(max(usable, default=0) - int(shape.gpus), 0)

    def _place_in_order(self, candidates: list[Candidate], room: int, strict: bool) -> list[Start]:
        """Place candidates in order while there is room; ``strict`` stops at
        the first that does not fit (FIFO), else later ones backfill."""
        chosen: list[Start] = []
        waiting = list(candidates)
        while waiting and len(chosen) < room:
            candidate = self._next_for_speed(waiting) if self.speed_aware else waiting[0]
            waiting.remove(candidate)
            start = self._start(candidate, candidate.shape)
            if start is not None:
                chosen.append(start)
            elif strict:
                break
        return chosen

    def _next_for_speed(self, waiting: list[Candidate]) -> Candidate:
        """The waiting trial for the fastest free GPU: nearest in predicted
        time to that GPU's speed times the longest waiting trial's."""
        speed = self._fastest_free_speed()
        known = [(c, c.predicted_s) for c in waiting if c.predicted_s is not None]
        if speed is None or not known:
            return waiting[0]
        if self.inventory is None:
            raise RuntimeError("hpo internal error: only a planner with an inventory gets here")
        longest = max(predicted for _, predicted in known)
        top = max((d.speed for n in self.inventory.nodes for d in n.devices), default=1.0)
        target = longest * speed / top
        return min(known, key=lambda cp: (abs(cp[1] - target), cp[0].number))[0]

    def _fastest_free_speed(self) -> float | None:
        if self.inventory is None:
            return None
        free = [d.speed for n in self.inventory.nodes for d in n.devices if d.used < 1.0]
        return max(free, default=None)

    def _start(self, candidate: Candidate, shape: TrialShape, on=None,
               speed: float | None = None) -> Start | None:
        if self.inventory is None:
            return Start(candidate, shape, None, candidate.why or self._reason(candidate, shape))
        if self.speed_aware and speed is None and on is None and self._one_speed_fits(shape):
            # GPUs of one speed, the fastest kind that has enough free: the slowest sets the pace.
            speeds = sorted({d.speed for n in self.inventory.nodes for d in n.devices}, reverse=True)
            placement = next((p for s in speeds
                              if (p := self.inventory.place(shape, prefer_fast=True, speed=s))), None)
        else:
            placement = self.inventory.place(shape, prefer_fast=True if self.speed_aware else None,
                                             on=on, speed=speed)
        if placement is None:
            return None
        self.inventory.hold(candidate.number, placement, shape)
        if candidate.predicted_s is not None:  # when it should end, at its pace
            self._ends[candidate.number] = time.monotonic() + _time_on(
                candidate, max(int(shape.gpus), 1)) / placement.speed
        return Start(candidate, shape, placement, candidate.why or self._reason(candidate, shape))

    def _flotilla(self, fresh: list[Candidate], room: int) -> list[Start]:
        """FLEET's flotilla over the whole GPUs free now: trials with a rate
        curve get GPU counts to train together at the fastest one's rate,
        packed on nodes; the others start on their own shape. The candidates
        are the longest waiting trials, as many as GPUs are free: a study must
        end every trial, so the long ones go first (FLEET's ensemble picks by
        rate). With ``speed_aware``, one flotilla per GPU speed, fastest
        first, each trial's GPUs of one speed (the slowest would set a
        data-parallel trial's pace), and the trials nearest in predicted time
        to the speed times the longest's on each (the longest on the fastest)."""
        rated = sorted((c for c in fresh if c.curve is not None and c.shape.gpus >= 1
                        and c.shape.nodes == 1), key=_longest_first)
        chosen: list[Start] = []
        if self.inventory is None:
            raise RuntimeError("hpo internal error: the rate policy with an inventory only (starts())")
        if self.speed_aware:
            longest = _time_on(rated[0], 1) if rated else 0.0
            top = max((d.speed for n in self.inventory.nodes for d in n.devices), default=1.0)
            for speed, (count, widest) in self.inventory.speed_classes().items():
                pool = [c for c in rated if all(s.candidate is not c for s in chosen)
                        and self._worth_starting(c, speed, top)]
                pool.sort(key=lambda c: abs(_time_on(c, 1) - longest * speed / top))
                chosen += self._fleet(pool[:min(count, room - len(chosen))], count, widest, speed)
        else:
            free = self.inventory.free_gpus()
            chosen = self._fleet(rated[:min(room, free)], free, self.inventory.gpus_per_node, None)
        rest = [c for c in fresh if c.curve is None]
        return chosen + self._place_in_order(rest, room - len(chosen), strict=False)

    def _fleet(self, members: list[Candidate], gpus: int, widest: int, speed: float | None) -> list[Start]:
        """One flotilla of ``members`` over ``gpus`` GPUs (of ``speed``), at
        most ``widest`` per trial; FLEET's node packing when nodes are idle."""
        if not members or gpus < 1:
            return []
        members = _as_many_as_fit(members, gpus)
        curves = {c.number: c.curve for c in members if c.curve is not None}  # all of them: rated
        counts = {n: min(m, widest) for n, m in flotilla(curves, gpus).items()}
        target = max(curves[n].rate(1) for n in counts)
        slots = self._packed(counts) if speed is None else {}
        chosen = []
        for candidate in (c for c in members if c.number in counts):
            count = counts[candidate.number]
            shape = replace(candidate.shape, gpus=count)
            start = self._start(candidate, shape, on=slots.get(candidate.number), speed=speed)
            if start is not None:
                chosen.append(replace(start, reason=(
                    f"rate allocation: {count} GPU(s){'' if speed is None else f' of speed {speed:g}'} "
                    f"to train at the flotilla's pace, {target:.3g} samples/s "
                    f"(predicted {curves[candidate.number].rate(count):.3g} at speed 1)")))
        return chosen

    def _packed(self, counts: dict[int, int]) -> dict[int, list[tuple[int, list[int]]]]:
        """FLEET's node packing (whole-node counts, then pairs filling a node,
        then a bounded search) when the flotilla starts on idle, alike nodes;
        a member it would split over nodes is placed best-fit instead."""
        inventory = self.inventory
        if inventory is None:
            raise RuntimeError("hpo internal error: only a planner with an inventory gets here")
        per_node = inventory.gpus_per_node
        idle = inventory.free_gpus() == inventory.gpus and all(
            len(n.devices) == per_node for n in inventory.nodes)
        if not idle or sum(counts.values()) > inventory.gpus:
            return {}
        slots = pack_nodes(counts, per_node, len(inventory.nodes))
        return {n: [(node, [gpu for _, gpu in where])] for n, where in slots.items()
                for node in {node for node, _ in where} if len({node for node, _ in where}) == 1}

    def _reason(self, candidate: Candidate, shape: TrialShape) -> str:
        if self.policy == "fifo" or candidate.predicted_s is None:
            reason = f"{self.policy}: in proposal order, on its configured shape"
        else:
            reason = (f"{self.policy.replace('_', ' ')}: the cost model predicts "
                      f"{candidate.predicted_s:.3g} s on one GPU of speed 1")
        return reason + ("; GPUs matched to it by speed" if self.speed_aware else "")


def _longest_first(candidate: Candidate) -> tuple[float, int]:
    known = candidate.predicted_s if candidate.predicted_s is not None else -math.inf
    return -known, candidate.number


def _as_many_as_fit(members: list[Candidate], gpus: int) -> list[Candidate]:
    """The longest prefix of ``members`` (longest first) whose flotilla takes
    every one of them: FLEET's greedy choice would leave the slowest, which
    need the most GPUs to keep the pace, for later, and a study's makespan
    is set by its longest trials."""
    for k in range(len(members), 0, -1):
        chosen = members[:k]
        if len(flotilla({c.number: c.curve for c in chosen if c.curve is not None}, gpus)) == k:
            return chosen
    return members[:1]


def _time_on(candidate: Candidate, gpus: int) -> float:
    """Predicted time of ``candidate`` on ``gpus`` GPUs of speed 1."""
    if candidate.predicted_s is None or candidate.curve is None:
        return 0.0
    return candidate.predicted_s * candidate.curve.rate(1) / candidate.curve.rate(gpus)


def curve_from(rate_of: Callable[[int], float], per_node: int, measured: dict[int, float] | None = None
               ) -> RateCurve:
    """A rate curve: the measured rates, scaled by ``rate_of`` (a cost model)
    to the counts not measured."""
    rate_of = functools.lru_cache(maxsize=None)(rate_of)  # flotillas ask the same counts again
    measured = dict(measured or {})
    measured.setdefault(1, rate_of(1))
    return RateCurve(measured, max(per_node, 1), scaling=lambda m: rate_of(m) / rate_of(1))
