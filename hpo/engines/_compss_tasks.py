"""The trial tasks as COMPSs sees them; imported only under the COMPSs runtime.

COMPSs fixes a task's constraints when the task is declared, and resolves a
``"$VAR"`` value from the environment its JVM read before the program ran, so
per-study resources must be literal values in the decorators. Each resource
shape is one task, named after it (``compss_trial__cpus4_gpus1_mem2048mb_timeout160s``,
``..._nodes2`` for a ``@multinode`` task on two nodes), and declared on first
use: trials of different shapes are tasks of different names. A COMPSs worker finds a task by importing this
module and looking the name up: the module's ``__getattr__`` reads the shape
back from the name and declares the same task there, without the master's
settings.

Nothing a trial does may fail its task: a task that fails past its retries
ends the whole application. ``on_failure="IGNORE"`` keeps the study alive
when a worker dies (the future then holds None), and the wrapper never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pycompss.api.constraint import constraint
from pycompss.api.task import task

from hpo.engines._compss import CompssEngine
from hpo.trial import TrialOutcome, TrialStatus, TrialTask, run_trial

__all__ = ["TaskShape", "trial_task"]

# Seconds beyond the trial's own time limit before COMPSs interrupts the task:
# the wrapper enforces the limit itself and records a TIMEOUT; this is a backstop.
_TIME_OUT_GRACE_S = 60

_PREFIX = "compss_trial__"
_NAME = re.compile(r"compss_trial__cpus(\d+)_gpus(\d+)_mem(\d+)mb_timeout(\d+)s(?:_nodes(\d+))?(_first)?")


@dataclass(frozen=True)
class TaskShape:
    """What COMPSs is told one trial needs: the constraints and the time-out."""

    cpus: int = 1
    gpus: int = 0
    memory_mb: int = 0  # 0: no limit
    time_out_s: int = 0  # 0: none
    nodes: int = 1  # more: a @multinode task; the constraints hold on each node

    @classmethod
    def of(cls, cpus: int, gpus: int = 0, memory_gb: float | None = None,
           time_limit_s: float | None = None, nodes: int = 1) -> TaskShape:
        """The shape of trials with these resources; memory in whole GB,
        rounded up (:meth:`CompssEngine.whole_gb`: the binding cuts the rest)."""
        memory_mb = CompssEngine.whole_gb(memory_gb) * 1024
        time_out = int(time_limit_s) + _TIME_OUT_GRACE_S if time_limit_s else 0
        return cls(int(cpus), int(gpus), memory_mb, time_out, int(nodes))

    def task_name(self, priority: bool = False) -> str:
        nodes = f"_nodes{self.nodes}" if self.nodes > 1 else ""
        return (f"{_PREFIX}cpus{self.cpus}_gpus{self.gpus}_mem{self.memory_mb}mb"
                f"_timeout{self.time_out_s}s{nodes}{'_first' if priority else ''}")

    def constraints(self) -> dict[str, Any]:
        """The @constraint keywords: literal ints and strings only (COMPSs rejects
        floats), memory as a string of digits (whole GB), which the binding
        keeps as it is. With GPUs, the CPUs go in ``processors`` alone: a
        top-level ``computing_units`` as well would be added to them."""
        if self.gpus:
            declared: dict[str, Any] = {"processors": [
                {"processorType": "CPU", "computingUnits": self.cpus},
                {"processorType": "GPU", "computingUnits": self.gpus},
            ]}
        else:
            declared = {"computing_units": self.cpus}
        if self.memory_mb:
            declared["memory_size"] = str(math.ceil(self.memory_mb / 1024))  # whole GB
        return declared


def trial_task(shape: TaskShape, priority: bool = False) -> Callable[[TrialTask], Any]:
    """The COMPSs task running trials of ``shape``; ``priority`` tasks (the
    segment a scheduling policy chose) go ahead of queued ones."""
    name = shape.task_name(priority)
    declared = globals().get(name)
    if declared is None:
        declared = globals()[name] = _declare(name, shape, priority)
    return declared


def __getattr__(name: str) -> Any:
    """A worker looking up a task by name: declare it from the shape the name carries."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cpus, gpus, memory_mb, time_out = map(int, match.groups()[:4])
    shape = TaskShape(cpus, gpus, memory_mb, time_out, int(match.group(5) or 1))
    return trial_task(shape, priority=bool(match.group(6)))


def _declare(name: str, shape: TaskShape, priority: bool) -> Callable[[TrialTask], Any]:
    def body(trial_task: TrialTask) -> TrialOutcome:
        return _never_failing(trial_task)

    # COMPSs registers a task as module.__name__; a __qualname__ that differs
    # would be read as a class.
    body.__name__ = body.__qualname__ = name
    body.__module__ = __name__
    body.__doc__ = f"One trial (or one segment of it) as a COMPSs task of {shape}."
    declared = task(returns=1, on_failure="IGNORE", time_out=shape.time_out_s, priority=priority)(body)
    if shape.nodes > 1:  # COMPSS_HOSTNAMES and SLURM_* tell the trial its nodes
        from pycompss.api.multinode import multinode

        declared = multinode(computing_nodes=shape.nodes)(declared)
    return constraint(**shape.constraints())(declared)


def _never_failing(trial_task: TrialTask) -> TrialOutcome:
    """``run_trial``, whose own faults (the store unreachable, an interruption
    outside the objective) leave the trial to be resumed instead of failing
    the task (``run_trial`` gave the trial up before it raised)."""
    # COMPSs keeps each task's output in jobs/job<N>_NEW.out: say whose it is.
    print(f"hpo: trial {trial_task.number} of study {trial_task.study_name!r}", flush=True)
    try:
        return run_trial(trial_task)
    except BaseException:  # COMPSs would end the study
        return TrialOutcome(trial_task.number, TrialStatus.RUNNING)
