"""Which trial gets the next free slot: FIFO, round-robin or convergence-aware.

FIFO runs every trial to its end, in the order the search proposes them.
The other two policies run trials in resumable segments of a few reports
(epochs): at the end of a segment the trial checkpoints and is *suspended*;
when a slot frees, a policy picks which suspended trial runs its next segment.
New trials come first, so every trial has a measured first segment.

Convergence-aware scheduling follows Hermes (Electronics 2021, "A GPU
scheduling framework to accelerate hyper-parameter optimization in deep
learning clusters"): a segment's representative loss is ``(max + min) / 2`` of
its losses, and a trial's convergence is

    C = (previous representative loss - current representative loss) / n

with ``n`` the reports in the segment; after a first segment, ``(max - min) / n``.
The trial with the highest C runs next. Segments double in length each time
the trial passes one of the study's milestones, as a converging trial gains
less from being switched often. The "loss" is the study's metric, negated
when it is maximised.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from hpo.registry import POLICIES
from hpo.store import StudyStore
from hpo.store.records import SegmentRecord, TrialStatus, best_reported, grouped_attrs, status_of

__all__ = [
    "Waiting", "Policy", "RoundRobin", "ConvergenceAware", "make_policy", "waiting_of",
    "representative_loss", "convergence", "segment_steps",
]


@dataclass(frozen=True)
class Waiting:
    """A suspended trial waiting for a slot, and what the policies judge it by."""

    number: int
    trial_id: int
    since: float  # when its last segment ended
    convergence: float
    segment_steps: int  # length of its next segment


class Policy(abc.ABC):
    """Chooses the suspended trial that runs next; users never call it directly."""

    name: str

    @abc.abstractmethod
    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        """The trial to resume, out of a non-empty ``waiting``."""

    def why(self, chosen: Waiting, waiting: Sequence[Waiting]) -> str:
        """The reason recorded on the resumed trial."""
        return f"{self.name}: next of {len(waiting)} waiting"


class RoundRobin(Policy):
    """Every trial in turn: the one that has waited longest."""

    name = "round_robin"

    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        return min(waiting, key=lambda w: (w.since, w.number))


class ConvergenceAware(Policy):
    """The trial whose loss fell fastest per report in its last segment."""

    name = "convergence"

    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        return max(waiting, key=lambda w: (w.convergence, -w.since, -w.number))

    def why(self, chosen: Waiting, waiting: Sequence[Waiting]) -> str:
        return (f"convergence: C={chosen.convergence:.4g}, highest of {len(waiting)} waiting "
                f"(next C {_runner_up(chosen, waiting)})")


def _runner_up(chosen: Waiting, waiting: Sequence[Waiting]) -> str:
    others = [w.convergence for w in waiting if w is not chosen]
    return f"{max(others):.4g}" if others else "none"


def make_policy(name: str) -> Policy | None:
    """The policy for a space's ``scheduling.policy``; None for FIFO (no segments)."""
    return POLICIES.make(name)


def waiting_of(trial: optuna.trial.FrozenTrial, base_steps: int, milestones: Sequence[float],
               maximize: bool) -> Waiting:
    """A suspended (or lost) trial as the policies see it, from its stored record."""
    trial_id = StudyStore.trial_id(trial)
    if status_of(trial) is TrialStatus.RUNNING:  # lost: goes first
        return Waiting(trial.number, trial_id, since=0.0, convergence=math.inf,
                       segment_steps=base_steps)
    segments = grouped_attrs(trial).segments
    losses = _segment_losses(trial, segments, maximize)
    return Waiting(
        number=trial.number, trial_id=trial_id,
        since=segments[-1]["ended_at"] if segments else 0.0,
        convergence=convergence(losses[-1] if losses else [], losses[-2] if len(losses) > 1 else None),
        segment_steps=segment_steps(base_steps, milestones, best_reported(trial, maximize), maximize),
    )


def _segment_losses(trial: optuna.trial.FrozenTrial, segments: list[SegmentRecord],
                    maximize: bool) -> list[list[float]]:
    """The losses (the metric, negated when maximised) of each segment, in order."""
    values = trial.intermediate_values
    sign = -1.0 if maximize else 1.0
    losses = []
    for segment in segments:
        first, last = segment.get("first_step"), segment.get("last_step")
        if first is not None:
            losses.append([sign * values[s] for s in range(first, last + 1) if s in values])
    return [seg for seg in losses if seg]


def representative_loss(losses: Sequence[float]) -> float:
    """A segment's representative loss: the middle of its range."""
    return (max(losses) + min(losses)) / 2


def convergence(losses: Sequence[float], previous: Sequence[float] | None) -> float:
    """Hermes' C for a segment with ``losses``, after a segment with ``previous``.

    >>> convergence([1.0, 0.6], None)          # first segment: (max - min) / n
    0.2
    >>> convergence([0.5, 0.3], [1.0, 0.6])    # (0.8 - 0.4) / 2
    0.2
    """
    if not losses:
        return 0.0
    if not previous:
        return (max(losses) - min(losses)) / len(losses)
    return (representative_loss(previous) - representative_loss(losses)) / len(losses)


def segment_steps(base: int, milestones: Sequence[float], best: float | None, maximize: bool) -> int:
    """Segment length for a trial whose best metric so far is ``best``: ``base``
    doubled once per milestone passed.

    >>> segment_steps(2, [0.5, 0.8, 0.9], 0.85, maximize=True)
    8
    """
    if best is None:
        return base
    passed = sum(1 for m in milestones if (best >= m if maximize else best <= m))
    return base * 2 ** passed
