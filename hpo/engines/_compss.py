"""PyCOMPSs: the engine used when the program runs under runcompss/enqueue_compss.

Kept thin: it declares nothing itself (see ``_compss_tasks``) and only maps the
engine interface onto ``compss_wait_on``, ``TaskGroup`` and
``compss_cancel_group``. COMPSs has no wait-any, so ``reports_completion`` is
False: the master learns that a trial finished from the store, then calls
``compss_wait_on`` only on futures already known to be finished.
"""

from __future__ import annotations

import importlib
import itertools
import os
import time
from collections.abc import Sequence

from hpo.engines._base import Engine
from hpo.trial import TrialTask

__all__ = ["CompssEngine", "under_compss_runtime"]


def under_compss_runtime() -> bool:
    """True when this program runs inside the COMPSs runtime (runcompss)."""
    try:
        from pycompss.util import context
    except ImportError:
        return False
    if hasattr(context, "CONTEXT"):  # COMPSs 3.x
        return bool(context.CONTEXT.in_pycompss())
    return bool(context.in_pycompss())  # COMPSs 2.x


class CompssEngine(Engine):
    """Trials as PyCOMPSs tasks with @constraint (CPUs, GPUs, memory) and time_out."""

    name = "compss"
    reports_completion = False

    def __init__(self, cpus: int = 1, gpus: int = 0, memory_gb: float | None = None,
                 time_limit_s: float | None = None, slots: int | None = None) -> None:
        self._env = {
            "HPO_TRIAL_CPUS": str(cpus), "HPO_TRIAL_GPUS": str(gpus),
            "HPO_TRIAL_MEMORY_GB": "" if memory_gb is None else str(memory_gb),
            "HPO_TRIAL_TIME_LIMIT_S": "" if time_limit_s is None else str(time_limit_s),
        }
        self._slots = slots
        self._tasks = self._api = None
        self._count = itertools.count()

    def start(self) -> None:
        os.environ.update(self._env)  # read by _compss_tasks' decorators, and by the runtime
        self._tasks = importlib.import_module("hpo.engines._compss_tasks")
        self._api = importlib.import_module("pycompss.api.api")
        if self._slots is None:
            self._slots = max(1, int(self._api.compss_get_number_of_resources()))

    @property
    def slots(self) -> int:
        return self._slots or 1

    def submit(self, task: TrialTask, priority: bool = False):
        # A group per task (not per trial): a trial run in segments has several.
        group = f"hpo-{task.study_name}-{task.number}-{next(self._count)}"
        function = self._tasks.compss_trial_first if priority else self._tasks.compss_trial
        with self._api.TaskGroup(group, implicit_barrier=False):
            future = function(task)
        return group, future

    def wait(self, handles: Sequence, timeout: float) -> list:
        time.sleep(timeout)  # no wait-any in COMPSs: the caller polls the store
        return []

    def settle(self, handle) -> None:
        self._api.compss_wait_on(handle[1])  # finished already: the store said so

    def cancel(self, handle) -> None:
        self._api.compss_cancel_group(handle[0])
