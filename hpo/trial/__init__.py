"""Trials: the handle objectives receive and the task engines run."""

from hpo.trial._handle import Trial
from hpo.trial._objective import resolve_objective
from hpo.trial._state import TrialState
from hpo.trial._task import TrialOutcome, TrialTask, run_trial

__all__ = ["Trial", "TrialState", "TrialTask", "TrialOutcome", "run_trial", "resolve_objective"]
