"""Which trial gets the next free slot: FIFO, round-robin, SLAQ or convergence-aware.

FIFO runs every trial to its end, in the order the search proposes them.
The others time-share the slots in *quanta* (Hermes: 10 s; or a number of
reports): at the end of a quantum the trial compares itself with the trials
waiting for a slot. It keeps its slot, and its process, unless the policy
ranks a waiting trial higher; then it checkpoints and is *suspended*, and
the master resumes the waiting trial the policy picks. New trials wait with
the highest rank, so every trial has a measured first quantum.

Convergence-aware scheduling follows Hermes (Electronics 2021, "A GPU
scheduling framework to accelerate hyper-parameter optimization in deep
learning clusters"): a quantum's representative loss is ``(max + min) / 2``
of its losses, and a trial's convergence is

    C = (previous representative loss - current representative loss) / n

with ``n`` the reports in the quantum; after a first quantum, ``(max - min) / n``
signed by the direction the loss went (the paper's unsigned form ranks a
diverging curve as high as a converging one). The waiting trial with the
highest C runs next, and preempts a running trial only if its C is higher.
A trial's quantum grows with its preemptions and doubles at each milestone
it passes (metric values, or percentage decreases of its loss), as slopes
flatten and a converging trial gains less from being switched often. The
"loss" is the study's metric, negated when it is maximised.

SLAQ (Zhang et al., SoCC 2017), as the Hermes paper describes and measures
it: quality-driven time-sharing that gives the slot to the trial with the
most loss left to reduce, its latest loss relative to its first.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from hpo.registry import POLICIES
from hpo.store import StudyStore
from hpo.store.records import SegmentRecord, TrialStatus, grouped_attrs, status_of

# The quantum rule and Hermes' convergence are applied by the worker too: they live with the trial.
from hpo.trial import QuantumRule, convergence, milestones_passed, representative_loss

__all__ = [
    "Waiting", "Policy", "Fifo", "RoundRobin", "ConvergenceAware", "Slaq", "QuantumRule", "make_policy",
    "waiting_of", "representative_loss", "convergence", "milestones_passed",
]


@dataclass(frozen=True)
class Waiting:
    """A suspended trial waiting for a slot, and what the policies judge it by."""

    number: int
    trial_id: int
    since: float  # when its last quantum ended
    convergence: float
    # Its latest representative loss relative to its first loss (SLAQ's "quality left").
    loss_left: float = 1.0


class Policy(abc.ABC):
    """Chooses the suspended trial that runs next; users never call it directly."""

    name: str
    #: Whether trials run in quanta and yield their slots (FIFO runs each to its end).
    time_shares: bool = True

    @abc.abstractmethod
    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        """The trial to resume, out of a non-empty ``waiting``."""

    def contender(self, waiting: Sequence[Waiting], new_waits: bool = False) -> float | None:
        """The convergence a running trial must reach to keep its slot at the
        end of its quantum; None when nobody waits. A new trial waiting
        (``new_waits``) beats anyone; time-sharing policies preempt whenever
        someone waits."""
        return math.inf if waiting or new_waits else None

    def why(self, chosen: Waiting, waiting: Sequence[Waiting]) -> str:
        """The reason recorded on the resumed trial."""
        return f"{self.name}: next of {len(waiting)} waiting"


class RoundRobin(Policy):
    """Every trial in turn: the one that has waited longest."""

    name = "round_robin"

    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        return min(waiting, key=lambda w: (w.since, w.number))


class Fifo(RoundRobin):
    """Each trial runs to its end, in the order the search proposes them; a
    trial suspended anyway (by an earlier run, or to grow onto more GPUs)
    goes on when it has waited longest."""

    name = "fifo"
    time_shares = False

    def contender(self, waiting: Sequence[Waiting], new_waits: bool = False) -> float | None:
        return None  # no quanta: running trials never compare themselves


class Slaq(Policy):
    """The trial with the most of its loss left to reduce (SLAQ's priority
    to low-quality jobs), in turn with the others at every quantum."""

    name = "slaq"

    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        return max(waiting, key=lambda w: (w.loss_left, -w.since, -w.number))

    def why(self, chosen: Waiting, waiting: Sequence[Waiting]) -> str:
        return f"slaq: {chosen.loss_left:.3g} of its first loss left, most of {len(waiting)} waiting"


class ConvergenceAware(Policy):
    """The trial whose loss fell fastest per report in its last quantum."""

    name = "convergence"

    def pick(self, waiting: Sequence[Waiting]) -> Waiting:
        return max(waiting, key=lambda w: (w.convergence, -w.since, -w.number))

    def contender(self, waiting: Sequence[Waiting], new_waits: bool = False) -> float | None:
        return math.inf if new_waits else max((w.convergence for w in waiting), default=None)

    def why(self, chosen: Waiting, waiting: Sequence[Waiting]) -> str:
        return (f"convergence: C={chosen.convergence:.4g}, highest of {len(waiting)} waiting "
                f"(next C {_runner_up(chosen, waiting)})")


def _runner_up(chosen: Waiting, waiting: Sequence[Waiting]) -> str:
    others = [w.convergence for w in waiting if w is not chosen]
    return f"{max(others):.4g}" if others else "none"


def make_policy(name: str) -> Policy:
    """The policy for a space's ``scheduling.policy``."""
    return POLICIES.make(name)


def waiting_of(trial: optuna.trial.FrozenTrial, maximize: bool) -> Waiting:
    """A suspended (or lost) trial as the policies see it, from its stored record."""
    trial_id = StudyStore.trial_id(trial)
    if status_of(trial) is TrialStatus.RUNNING:  # lost: goes first
        return Waiting(trial.number, trial_id, since=0.0, convergence=math.inf, loss_left=math.inf)
    segments = grouped_attrs(trial).segments
    losses = _segment_losses(trial, segments, maximize)
    last = segments[-1] if segments else {}
    recorded = last.get("convergence")  # what its worker judged itself by
    judged = recorded if recorded is not None else convergence(
        losses[-1] if losses else [], losses[-2] if len(losses) > 1 else None)
    return Waiting(number=trial.number, trial_id=trial_id, since=last.get("ended_at", 0.0),
                   convergence=judged, loss_left=_loss_left(trial, maximize))


def _loss_left(trial: optuna.trial.FrozenTrial, maximize: bool) -> float:
    values = trial.intermediate_values
    if not values:
        return 1.0
    sign = -1.0 if maximize else 1.0
    steps = sorted(values)
    first, last = sign * values[steps[0]], sign * values[steps[-1]]
    return last / first if first else 1.0


def _segment_losses(trial: optuna.trial.FrozenTrial, segments: list[SegmentRecord],
                    maximize: bool) -> list[list[float]]:
    """The losses (the metric, negated when maximised) of each segment, in order."""
    values = trial.intermediate_values
    sign = -1.0 if maximize else 1.0
    losses = []
    for segment in segments:
        first, last = segment.get("first_step"), segment.get("last_step")
        if first is not None and last is not None:  # a segment that reported has both
            losses.append([sign * values[s] for s in range(first, last + 1) if s in values])
    return [seg for seg in losses if seg]
