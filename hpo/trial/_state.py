"""The small state vocabulary of a trial, and the keys it is stored under.

Optuna's storage knows RUNNING, COMPLETE, PRUNED and FAIL. ``hpo`` keeps two
more facts apart, both derived from what the worker wrote:

- PENDING: created by the master, not started by any worker yet (no run record);
- TIMEOUT: failed because it exceeded its time limit (kept apart from FAILED,
  as walltime expiry is an ordinary event on a cluster, not a bug);
- CANCELLED: ended by the master without a result (the study stopped before it
  started, or the master running it died); its configuration is not used up;
- SUSPENDED: run in resumable segments and waiting, checkpointed, for its next
  segment (convergence-aware or round-robin scheduling);
- STOPPED: ended early because the study stopped (target reached, time budget
  spent), with the value it had; stored as Optuna's PRUNED.
"""

from __future__ import annotations

import enum
from typing import Any

import optuna

# Trial user attributes (one journal line each write).
RUN_ATTR = "hpo:run"  # dict: host, pid, attempt, started_at, ended_at, cost, error...
REPORT_ATTR = "hpo:report:"  # + step number, zero padded: all metrics of that step
# Set by the master on a trial it ended without a result: {"reason", "message"},
# reason "cancelled" (never started; the study stopped) or "interrupted" (left
# behind by a master that died; its configuration is run again).
ENDED_BY_ATTR = "hpo:ended_by"
# Every decision taken about a trial, one attribute each so that the master and
# the worker never overwrite each other: EVENT_ATTR + time in ns + writer pid ->
# {"time", "kind", "step", "reason", "host"}; kind is one of EVENT_KINDS.
EVENT_ATTR = "hpo:event:"
EVENT_KINDS = ("pruned", "stopped", "suspended", "resumed", "retried", "unresumable",
               "interrupted", "cancelled")
# One per segment of a trial run in resumable pieces (or per attempt): + index,
# zero padded -> {"index", "host", "pid", "worker", "started_at", "ended_at",
# "first_step", "last_step", "outcome"}.
SEGMENT_ATTR = "hpo:segment:"
# Written by the worker every few seconds while the objective runs (a time):
# a RUNNING trial whose heartbeat is stale was lost with its worker or master.
HEARTBEAT_ATTR = "hpo:heartbeat"
# Study user attribute: set when the study must stop ({"reason": ..., ...}).
STOP_ATTR = "hpo:stop"


class TrialState(str, enum.Enum):
    """Where a trial is in its life; the values are what ``hpo status`` prints."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"

    @property
    def is_finished(self) -> bool:
        return self not in (TrialState.PENDING, TrialState.RUNNING, TrialState.SUSPENDED)

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> "TrialState":
        """The state of a stored trial."""
        run = trial.user_attrs.get(RUN_ATTR)
        state = trial.state
        if state == optuna.trial.TrialState.RUNNING:
            if not run:
                return cls.PENDING
            return cls.SUSPENDED if run.get("suspended") else cls.RUNNING
        if state == optuna.trial.TrialState.COMPLETE:
            return cls.COMPLETE
        if state == optuna.trial.TrialState.PRUNED:
            stopped = str((run or {}).get("stop_reason") or "").startswith("stopped")
            return cls.STOPPED if stopped else cls.PRUNED
        if trial.user_attrs.get(ENDED_BY_ATTR):
            return cls.CANCELLED
        if run and run.get("timed_out"):
            return cls.TIMEOUT
        return cls.FAILED if state == optuna.trial.TrialState.FAIL else cls.PENDING


def grouped_attrs(trial: optuna.trial.FrozenTrial) -> tuple[
        list[tuple[int, dict[str, float]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A trial's reports ``(step, metrics)``, events and segments, each in
    order, from one pass over its attributes (it runs for every trial)."""
    reports, events, segments = [], [], []
    for key, value in trial.user_attrs.items():
        if not key.startswith("hpo:") or not isinstance(value, dict):
            continue
        if key.startswith(REPORT_ATTR):
            reports.append((int(key[len(REPORT_ATTR):]), value))
        elif key.startswith(EVENT_ATTR):
            events.append((key, value))
        elif key.startswith(SEGMENT_ATTR):
            segments.append((key, value))
    reports.sort(key=lambda item: item[0])
    return (reports, [v for _, v in sorted(events, key=lambda item: item[0])],
            [v for _, v in sorted(segments, key=lambda item: item[0])])
