"""Stop a study whose first trials all fail the same way.

When every trial fails alike, the cause is a mistake in the space or the
objective (a metric name the objective never returns, a module or a file it
cannot find), not a configuration's bad luck: running the rest of the budget
only spends core-hours on the same error. The rule:

- it watches while no trial of the study has a value (completed, pruned or
  stopped): one trial with a value turns it off for good;
- when the first ``max(3, parallel + 1)`` trials this run finishes (a whole
  wave of slots and one more, at least 3) all FAILED with the same error
  type and the same message once numbers and addresses are blanked, the
  study stops: queued trials are cancelled, running ones stop at their next
  check, and the master raises :class:`~hpo.errors.SameFailure` (exit 2);
- a trial that times out, or fails another way, ends the watch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from hpo.errors import SameFailure
from hpo.store.records import TrialStatus, run_of, status_of

__all__ = ["FailFast", "MIN_SAME_FAILURES", "failures_to_stop"]

#: The fewest alike failures that stop a study (parallel + 1 when larger).
MIN_SAME_FAILURES = 3

_NUMBER = re.compile(r"0x[0-9a-fA-F]+|[-+]?\d+(\.\d*)?([eE][-+]?\d+)?")


def failures_to_stop(parallel: int) -> int:
    """How many first trials must fail alike before the study stops.

    >>> failures_to_stop(1), failures_to_stop(2), failures_to_stop(8)
    (3, 3, 9)
    """
    return max(MIN_SAME_FAILURES, parallel + 1)


def shape_of(error: Mapping[str, Any]) -> tuple[str, str]:
    """An error's type and its message with numbers blanked: what two
    trials failing for the same reason with different values share.

    >>> shape_of({"type": "BadReturnValue", "message": "returned {'acc': 0.93} at 0x7f3a"})
    ('BadReturnValue', "returned {'acc': #} at #")
    """
    return str(error.get("type")), _NUMBER.sub("#", str(error.get("message", "")))


@dataclass
class FailFast:
    """Watches the trials a run finishes; :meth:`add` says when to stop."""

    needed: int
    off: bool = False
    failed: list[optuna.trial.FrozenTrial] = field(default_factory=list)

    @classmethod
    def of(cls, store, parallel: int) -> FailFast:
        """Off when a trial of the study already has a value."""
        worked = any(status_of(t) in _WORKED for t in store.trials())
        return cls(failures_to_stop(parallel), off=worked)

    def add(self, trial: optuna.trial.FrozenTrial, state: TrialStatus) -> bool:
        """Count a finished trial; True once the first ``needed`` failed alike."""
        if self.off or state is TrialStatus.CANCELLED:
            return False
        error = run_of(trial).get("error") or {}
        if state is not TrialStatus.FAILED or not error.get("type") or (
                self.failed and shape_of(error) != shape_of(run_of(self.failed[0])["error"] or {})):
            self.off = True  # a value, a time-out, or another failure: not one mistake
            return False
        self.failed.append(trial)
        if len(self.failed) < self.needed:
            return False
        self.off = True
        return True

    def error(self, source: str, run_dir: Path, metric: str) -> SameFailure:
        """What to tell the user: the error, the trials, and what to change."""
        first = self.failed[0]
        error = run_of(first)["error"] or {}
        numbers = ", ".join(str(n) for n in sorted(t.number for t in self.failed))
        return SameFailure(
            f"{source}: the first {len(self.failed)} trials (numbers {numbers}) all failed the same "
            f"way, so the study stopped: the cause is the space or the objective, not one "
            f"configuration.\n  {error['type']}: {error['message']}\n"
            f"  fix: {_fix(error, run_of(first).get('metrics') or {}, metric, source)}; then "
            f"start afresh (rm -r {run_dir}: none of its trials has a result) and run the same "
            f"command again. The whole traceback and the trial's log: "
            f"hpo status {run_dir} --trial {first.number}")


# States that show the objective can run (each ended with a value).
_WORKED = (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.STOPPED)


def _fix(error: Mapping[str, Any], metrics: dict[str, float], metric: str, source: str) -> str:
    """The fix for the commonest mistakes; else where to look."""
    if error.get("type") == "BadReturnValue" and "multi-objective" not in error.get("message", ""):
        if metrics:
            names = ", ".join(sorted(metrics))
            return (f"the objective reports or returns {names} and no {metric!r}: set "
                    f"\"metric\": {{\"name\": ...}} in {source} to one of them, or return "
                    f"{{{metric!r}: value}}")
        return f"return a number or a dict with {metric!r} from the objective"
    if error.get("type") in ("ModuleNotFoundError", "ImportError"):
        return ("install the missing package into the environment the workers use, or put the "
                "module beside the space file or in the current directory")
    return "correct the objective or the space so that a trial can run"
