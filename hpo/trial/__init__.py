"""Trials: the handle objectives receive and the task engines run."""

from hpo.store.records import TrialStatus
from hpo.trial._handle import Trial
from hpo.trial._local_stop import request_suspend, stop_grace_s, suspend_requested
from hpo.trial._objective import Objective, preflight, reference_of, resolve_objective
from hpo.trial._task import (
    SILENT_HEARTBEATS, TrialOutcome, TrialTask, fell_silent, heartbeat_s, open_trial, run_trial,
)

# The name used before TrialStatus; kept for scripts written against it.
TrialState = TrialStatus

__all__ = ["Trial", "TrialStatus", "TrialTask", "TrialOutcome", "run_trial",
           "open_trial", "resolve_objective", "preflight", "reference_of", "Objective", "heartbeat_s",
           "fell_silent", "SILENT_HEARTBEATS", "request_suspend", "suspend_requested",
           "stop_grace_s"]
