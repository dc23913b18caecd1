"""A time-shared trial's clock: when its quantum ends, and whether it yields.

At the end of each quantum the trial judges itself by Hermes' convergence
and compares it with the best waiting trial's (the master publishes it in the
store). It keeps its slot and its process unless the waiting one is ahead;
only then does it checkpoint and suspend. Preemption only when it pays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpo.trial._clock import now

__all__ = ["QuantumClock", "QuantumRule", "milestones_passed", "representative_loss", "convergence"]


@dataclass(frozen=True)
class QuantumRule:
    """How long a trial runs before it may be preempted: ``steps`` reports, or
    ``seconds`` (grown by ``growth`` of itself per preemption, and never so
    short that checkpointing takes more than ``max_checkpoint_share``); doubled
    at each milestone passed."""

    steps: int | None = None
    seconds: float | None = None
    growth: float = 0.5
    max_checkpoint_share: float = 0.05
    milestones: tuple[float | str, ...] = ()
    maximize: bool = False

    @classmethod
    def of(cls, scheduling, maximize: bool) -> QuantumRule:
        """The rule of a space's ``scheduling`` section."""
        return cls(steps=scheduling.segment_steps, seconds=scheduling.quantum_s,
                   growth=scheduling.quantum_growth,
                   max_checkpoint_share=scheduling.max_checkpoint_share,
                   milestones=scheduling.milestones, maximize=maximize)

    def length(self, preemptions: int, losses: Sequence[float], checkpoint_s: float = 0.0
               ) -> tuple[int | None, float | None]:
        """(reports, seconds) of the next quantum of a trial preempted
        ``preemptions`` times whose losses so far are ``losses``.

        >>> QuantumRule(seconds=10, milestones=("50%",)).length(2, [1.0, 0.4], checkpoint_s=0.1)
        (None, 40.0)
        >>> QuantumRule(seconds=10).length(0, [], checkpoint_s=1.0)  # 1 s is 5% of 20 s
        (None, 20.0)
        """
        doubled = 2 ** milestones_passed(self.milestones, losses, self.maximize)
        if self.steps is not None:
            return self.steps * doubled, None
        if self.seconds is None:
            raise RuntimeError("hpo internal error: a rule has steps or seconds")
        seconds = self.seconds * (1 + self.growth * preemptions) * doubled
        return None, max(seconds, checkpoint_s / self.max_checkpoint_share)


def milestones_passed(milestones: Sequence[float | str], losses: Sequence[float], maximize: bool) -> int:
    """How many milestones a trial with ``losses`` (its metric, negated when
    maximised) passed: a metric value reached, or a percentage decrease of
    the loss from its first report ("50%": halved).

    >>> milestones_passed([0.5, 0.8, 0.9], [-0.3, -0.85], maximize=True)
    2
    >>> milestones_passed(["10%", "50%"], [2.0, 1.5], maximize=False)
    1
    """
    if not losses:
        return 0
    best = min(losses)
    first = losses[0]
    passed = 0
    for milestone in milestones:
        if isinstance(milestone, str):
            decrease = (first - best) / abs(first) if first else 0.0
            passed += decrease * 100 >= float(milestone.rstrip("%"))
        else:
            passed += best <= (-milestone if maximize else milestone)
    return passed


def representative_loss(losses: Sequence[float]) -> float:
    """A quantum's representative loss: the middle of its range."""
    return (max(losses) + min(losses)) / 2


def convergence(losses: Sequence[float], previous: Sequence[float] | float | None) -> float:
    """Hermes' C for a quantum with ``losses``, after a quantum with
    ``previous`` losses (or their representative loss).

    >>> convergence([1.0, 0.6], None)          # first quantum: (max - min) / n, falling
    0.2
    >>> convergence([0.6, 1.0], None)          # rising: the same size, negative
    -0.2
    >>> convergence([0.5, 0.3], [1.0, 0.6])    # (0.8 - 0.4) / 2
    0.2
    """
    if not losses:
        return 0.0
    if previous is None or (not isinstance(previous, (int, float)) and not previous):
        spread = (max(losses) - min(losses)) / len(losses)
        return spread if losses[-1] <= losses[0] else -spread
    before = previous if isinstance(previous, (int, float)) else representative_loss(previous)
    return (before - representative_loss(losses)) / len(losses)


@dataclass
class QuantumClock:
    """Tracks one task's quanta for a trial preempted ``preemptions`` times
    before, whose earlier losses are ``history`` and whose last quantum's
    representative loss was ``previous_loss``."""

    rule: QuantumRule
    preemptions: int = 0
    history: list[float] = field(default_factory=list)
    previous_loss: float | None = None
    checkpoint_s: float = 0.0  # save + restore, as last measured
    quanta: int = 0  # quanta ended in this task
    judged: float | None = None  # the convergence of the last quantum ended
    save_s: float = 0.0
    restore_s: float = 0.0
    _losses: list[float] = field(default_factory=list)
    _started: float = field(default_factory=now)

    def add(self, loss: float | None) -> None:
        """A report of the study's metric (as a loss), or None when it lacks it."""
        if loss is not None:
            self._losses.append(loss)
            self.history.append(loss)

    def add_checkpoint_time(self, kind: str, seconds: float) -> None:
        """Time spent saving ("save") or restoring ("restore") a checkpoint."""
        if kind == "save":
            self.save_s = seconds  # the last save: what one preemption costs
        else:
            self.restore_s += seconds

    def due(self) -> bool:
        """Whether the current quantum is over (a first quantum needs two
        losses, to have a slope; later ones one)."""
        if len(self._losses) < (2 if self.previous_loss is None else 1):
            return False
        steps, seconds = self.rule.length(self.preemptions, self.history, self._checkpoint_cost())
        if steps is not None:
            return len(self._losses) >= steps
        return seconds is not None and now() - self._started >= seconds  # length(): steps or seconds

    def end(self, contender: Callable[[], float | None]) -> str | None:
        """End the quantum: the reason to yield the slot, or None to keep it."""
        judged = convergence(self._losses, self.previous_loss)
        self.judged, self.quanta = judged, self.quanta + 1
        rival = contender()
        if rival is not None and rival > judged:
            shown = "a new or lost trial" if rival == float("inf") else f"a waiting trial (C={rival:.4g})"
            return f"quantum {self.quanta} done, C={judged:.4g}; {shown} goes first; checkpointed"
        self.previous_loss = representative_loss(self._losses)
        self._losses, self._started = [], now()
        return None

    def record(self) -> dict[str, Any]:
        """What the segment record keeps of this task's quanta."""
        steps, seconds = self.rule.length(self.preemptions, self.history, self._checkpoint_cost())
        loss = representative_loss(self._losses) if self._losses else self.previous_loss
        return {"quanta": self.quanta, "convergence": self.judged, "loss": loss,
                "quantum_s": seconds, "quantum_steps": steps,
                "save_s": round(self.save_s, 6), "restore_s": round(self.restore_s, 6)}

    def _checkpoint_cost(self) -> float:
        measured = self.save_s + self.restore_s
        return measured if measured > 0 else self.checkpoint_s
