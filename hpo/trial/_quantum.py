"""A time-shared trial's clock: when its quantum ends, and whether it yields.

At the end of each quantum the trial judges itself by Hermes' convergence
and compares it with the best waiting trial's (the master publishes it in the
store). It keeps its slot and its process unless the waiting one is ahead;
only then does it checkpoint and suspend. Preemption only when it pays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpo.scheduling import QuantumRule, convergence, representative_loss

__all__ = ["QuantumClock"]


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
    _started: float = field(default_factory=time.monotonic)

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
        return time.monotonic() - self._started >= seconds

    def end(self, contender: Callable[[], float | None]) -> str | None:
        """End the quantum: the reason to yield the slot, or None to keep it."""
        judged = convergence(self._losses, self.previous_loss)
        self.judged, self.quanta = judged, self.quanta + 1
        rival = contender()
        if rival is not None and rival > judged:
            shown = "a new or lost trial" if rival == float("inf") else f"a waiting trial (C={rival:.4g})"
            return f"quantum {self.quanta} done, C={judged:.4g}; {shown} goes first; checkpointed"
        self.previous_loss = representative_loss(self._losses)
        self._losses, self._started = [], time.monotonic()
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
