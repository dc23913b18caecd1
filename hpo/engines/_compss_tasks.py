"""The trial tasks as COMPSs sees them; imported only under the COMPSs runtime.

COMPSs workers find a task by importing its module and looking the function up
by name, so the tasks live at module level here. Per-study resources reach
them as ``"$HPO_TRIAL_*"`` values that the runtime resolves from the
environment; which keys exist at all (GPUs, memory) and the time-out are read
when the master imports this module, after :class:`CompssEngine` has set them.
"""

from __future__ import annotations

import os
from typing import Any

from pycompss.api.constraint import constraint
from pycompss.api.task import task

from hpo.trial import TrialOutcome, TrialTask, run_trial

# Seconds beyond the trial's own time limit before COMPSs kills the task: the
# wrapper enforces the limit itself and records a TIMEOUT; this is a backstop.
_TIME_OUT_GRACE_S = 60


def constraints_from_env() -> dict[str, Any]:
    """The @constraint keywords for the study's resources."""
    declared: dict[str, Any] = {"computing_units": "$HPO_TRIAL_CPUS"}
    if int(os.environ.get("HPO_TRIAL_GPUS", "0")) > 0:
        declared["processors"] = [
            {"processorType": "CPU", "computingUnits": "$HPO_TRIAL_CPUS"},
            {"processorType": "GPU", "computingUnits": "$HPO_TRIAL_GPUS"},
        ]
    if os.environ.get("HPO_TRIAL_MEMORY_GB"):
        declared["memory_size"] = "$HPO_TRIAL_MEMORY_GB"  # a string: COMPSs rejects floats
    return declared


def time_out_from_env() -> int:
    """COMPSs ``time_out`` in whole seconds (0: none)."""
    limit = float(os.environ.get("HPO_TRIAL_TIME_LIMIT_S", "0") or 0)
    return int(limit) + _TIME_OUT_GRACE_S if limit > 0 else 0


# on_failure="RETRY" is for infrastructure faults only: run_trial turns user
# errors into failed-trial records and never raises because of them.
@constraint(**constraints_from_env())
@task(returns=1, on_failure="RETRY", time_out=time_out_from_env())
def compss_trial(trial_task: TrialTask) -> TrialOutcome:
    """One trial (or one segment of it) as a COMPSs task."""
    return run_trial(trial_task)


# The same task with COMPSs' priority flag: the runtime schedules it before
# queued tasks. The scheduling policies submit their chosen segment with it.
@constraint(**constraints_from_env())
@task(returns=1, on_failure="RETRY", time_out=time_out_from_env(), priority=True)
def compss_trial_first(trial_task: TrialTask) -> TrialOutcome:
    """A trial segment chosen by the scheduling policy, as a prioritised COMPSs task."""
    return run_trial(trial_task)
