"""One attempt of a trial's objective in this process, and what it means.

:func:`run_here` calls the objective with a store-backed :class:`Trial`
(reports and decisions through the attempt's link to the store), capturing
its output in the trial's log and its failure as a record, never raised;
:func:`classify` turns what happened into the trial's state and value.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from hpo.data import StagedData, StagingError
from hpo.store import Halted, TrialContext, TrialLink
from hpo.store.records import ErrorRecord, TrialStatus
from hpo.trial._cpus import CpuBinding, limit_threads, pin_cpus
from hpo.trial._ending import guarding_the_master
from hpo.trial._handle import Trial, _StoreSide
from hpo.trial._local_stop import tracked_children
from hpo.trial._log import LOG_NAME, TrialLog, log_header, trial_log
from hpo.trial._malloc import reuse_large_buffers
from hpo.trial._objective import resolve_objective
from hpo.trial._quantum import QuantumClock
from hpo.trial._reaper import reaping
from hpo.trial._task import TrialTask, assigned_gpus
from hpo.trial._warm import warm_pids

__all__ = ["AttemptResult", "TaskInterrupted", "runtime_interruptions", "run_here", "trial_for",
           "classify", "size_of", "checkpoint_files", "staging_record"]


@dataclass
class AttemptResult:
    """What happened when the objective ran."""

    returned: Any = None
    error: ErrorRecord | None = None
    stop_reason: str | None = None
    timed_out: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    reports: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # made in this attempt
    binding: dict[str, Any] | None = None  # the cores and threads it ran with
    quantum: dict[str, Any] | None = None  # time-sharing: the quanta it ran (QuantumClock.record)
    halted: Halted | None = None  # the relay refused the attempt: its result does not count

    @property
    def steps(self) -> tuple[int, int] | None:
        """The first and last step reported by this attempt."""
        return (self.reports[0][0], self.reports[-1][0]) if self.reports else None


class TaskInterrupted(Exception):
    """The engine interrupted a running task (COMPSs raises ``CancelError`` or
    ``TimeOutError`` inside it): not the objective's doing."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.timed_out = kind == "TimeOutError"


def runtime_interruptions() -> tuple[type[BaseException], ...]:
    """The exceptions a runtime raises inside a task it cancels or times out
    (COMPSs' ``CancelError`` and ``TimeOutError``, where its worker loaded them)."""
    module = sys.modules.get("pycompss.util.exceptions")
    names = ("CancelError", "TimeOutError")
    return tuple(getattr(module, n) for n in names if hasattr(module, n)) if module else ()


def trial_for(task: TrialTask, token: str, context: TrialContext) -> Trial:
    """The :class:`Trial` the objective of ``task`` gets in the attempt named
    ``token``: its reports go to the store, its decisions come back with them,
    and it holds the reports of the trial's earlier segments and attempts."""
    link = TrialLink(task.storage, task.trial_id, task.control, token=token, master=task.master)
    clock = _clock(task, context["reports"], context["segments"]) if task.quantum else None
    side = _StoreSide(link, task.metric, task.early_stopping, task.direction, clock,
                      resizable=task.resizable)
    return Trial(task.number, dict(task.config), task.checkpoint_dir,
                 cpus=task.cpus, gpus=assigned_gpus(task), reports=context["reports"],
                 hosts=list(task.hosts) or _compss_hosts(), gpu_share=task.gpu_share,
                 profile_batches=task.profile_batches,
                 data=StagedData(task.data, task.study_name) if task.data else None, _link=side)


def run_follower(task: TrialTask, context: TrialContext, rank: int) -> None:
    """Run the objective as rank ``rank`` of a distributed trial: it trains
    beside rank 0, with the trial's earlier reports, but reports nothing and
    decides nothing (its framework hears rank 0's decisions)."""
    trial = Trial(task.number, dict(task.config), task.checkpoint_dir, cpus=task.cpus,
                  gpus=assigned_gpus(task), reports=context["reports"],
                  hosts=list(task.hosts) or _compss_hosts(), gpu_share=task.gpu_share, rank=rank,
                  data=StagedData(task.data, task.study_name) if task.data else None)
    with trial_log(task.checkpoint_dir, f"trial {task.number}, rank {rank}, pid {os.getpid()}"):
        resolve_objective(task.objective, path=task.pythonpath)(dict(task.config), trial)


def run_here(task: TrialTask, token: str, context: Callable[[], TrialContext]) -> AttemptResult:
    """Call the objective in this process with a store-backed Trial (the
    attempt ``token``), on ``task.cpus`` threads and, where the process has
    more, cores of its own. ``context()`` returns once the attempt has begun
    (the relay answered its start, or raises :class:`Halted`): its cores are
    claimed and its log opened while the answer comes (the log's header,
    its first line, is written only then)."""
    result = AttemptResult()
    reuse_large_buffers()  # a Dask worker's malloc maps each large buffer anew
    try:
        with pin_cpus(task.cpus) as cores, \
                reaping(spared=[*tracked_children(), *warm_pids()], own_process=not task.in_master), \
                trial_log(task.checkpoint_dir) as log:
            trial = trial_for(task, token, context())
            earlier = list(trial.reports)
            log_header(log, f"trial {task.number}, pid {os.getpid()}" + (
                f", from step {earlier[-1][0] + 1}" if earlier else ""),
                # A resumed, time-shared or isolated attempt's header is its
                # story in the log (where it went on, in which process) even
                # when it prints nothing; a plain first attempt's is not.
                at_once=bool(earlier) or task.isolate or task.quantum is not None)
            _call(task, trial, cores, log, result)
    except runtime_interruptions() as exc:
        raise TaskInterrupted(type(exc).__name__) from exc  # not the objective's doing
    if trial.staging_fault is not None and result.error is not None:
        # The objective failed after its data could not be staged (whatever it
        # raised then): the node's fault, handed back, never the trial's.
        result.error = {**staging_record(trial.staging_fault), "traceback": result.error.get("traceback", "")}
    result.stop_reason = trial.stop_reason
    if task.profile_batches:
        trial._record_profile()  # a trial shorter than its profile: on what it ran
    result.metrics = _last_metrics(trial, result.returned)
    side = trial._link
    if side is None:
        raise RuntimeError("hpo internal error: trial_for gave the trial its store side")
    if side.quantum:
        result.quantum = side.quantum.record()
    result.halted = side.halted
    result.reports = trial.reports[len(earlier):]
    return result


def _call(task: TrialTask, trial: Trial, cores: tuple[int, ...] | None, log: TrialLog,
          result: AttemptResult) -> None:
    """Call the objective on ``cores``, its failure recorded in ``result`` and
    the log, never raised."""
    try:
        # Imports TensorFlow, if it uses it; a module beside the space file too.
        objective = resolve_objective(task.objective, path=task.pythonpath)
        with limit_threads(task.cpus, cores) as binding, _told_if_it_ends_the_master(task, log):
            result.binding = _binding_record(binding)
            result.returned = objective(dict(task.config), trial)
    except runtime_interruptions():  # the engine's, not the objective's doing: run_here says so
        raise
    except TaskInterrupted:  # the simulated engine's time limit, in trial.elapse
        raise
    except (Exception, SystemExit) as exc:  # user code: recorded, never raised
        result.error = {
            "type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc(),
        }
        if isinstance(exc, OSError) and exc.errno is not None:
            # A full disk is the machine's fault, not the trial's (hpo.trial._run).
            result.error.update({"errno": exc.errno, "filename": str(exc.filename or task.checkpoint_dir)})
        log.write(result.error["traceback"])


def _told_if_it_ends_the_master(task: TrialTask, log: TrialLog) -> AbstractContextManager[None]:
    """Inside the master's own process (the inline engine), an objective that
    ends it leaves word in its log; a kill from outside leaves none."""
    return guarding_the_master(log) if task.in_master and not task.isolate else nullcontext()


def staging_record(fault: StagingError) -> ErrorRecord:
    """The error record of an attempt whose data could not be staged: its
    ``staging`` entry tells the master to stop, not to fail the trial."""
    return {"type": type(fault).__name__, "message": str(fault), "errno": fault.errno,
            "filename": str(fault.filename), "staging": fault.record()}


def _binding_record(binding: CpuBinding) -> dict[str, Any]:
    cores = ",".join(map(str, binding.cores)) if binding.cores else None
    return {"binded_cpus": cores, "threads": binding.threads,
            "tensorflow_threads": binding.tensorflow_threads}


def _last_metrics(trial: Trial, returned: Any) -> dict[str, float]:
    metrics = dict(trial.reports[-1][1]) if trial.reports else {}
    if isinstance(returned, dict):
        metrics.update({k: float(v) for k, v in returned.items() if _is_number(v)})
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def classify(result: AttemptResult, metric: str,
              objectives: tuple[str, ...] = ()) -> tuple[TrialStatus, float | list[float] | None]:
    """Turn what happened into a state and a value (one per objective when
    ``objectives`` are given); problems go into result.error."""
    if result.timed_out:
        return TrialStatus.TIMEOUT, None
    if result.error:
        return TrialStatus.FAILED, None
    if result.stop_reason == "suspended":
        return TrialStatus.SUSPENDED, None  # what it returned mid-training does not count
    if objectives:
        return _objective_values(result, objectives)
    returned = result.returned
    if isinstance(returned, dict):
        returned = returned.get(metric, _MISSING)
    if returned is _MISSING or not _is_number(returned):
        result.error = {
            "type": "BadReturnValue",
            "message": f"objective returned {result.returned!r}; expected a number "
            f"or a dict with the metric {metric!r}",
        }
        return TrialStatus.FAILED, None
    value = float(returned)
    if not math.isfinite(value):
        result.error = {"type": "NonFiniteValue", "message": f"objective returned {value} for {metric!r}"}
        return TrialStatus.FAILED, None
    return _STOPPED_AS.get((result.stop_reason or "").split(":")[0], TrialStatus.COMPLETE), value


def _objective_values(result: AttemptResult, objectives: tuple[str, ...]) -> tuple[TrialStatus, list[float] | None]:
    """The values of a multi-objective trial: each objective's metric from what
    the objective returned, else from its last report."""
    values = []
    for name in objectives:
        value = result.metrics.get(name)
        if value is None or not math.isfinite(value):
            result.error = {
                "type": "BadReturnValue" if value is None else "NonFiniteValue",
                "message": f"objective returned or reported {value if value is not None else 'no'} "
                f"value for the objective {name!r}; a multi-objective study needs every one of "
                f"{', '.join(map(repr, objectives))} (return a dict of them)",
            }
            return TrialStatus.FAILED, None
        values.append(value)
    return _STOPPED_AS.get((result.stop_reason or "").split(":")[0], TrialStatus.COMPLETE), values


# Stop reasons that end a trial with its value but not as COMPLETE (a patience
# stop is an ordinary end of training: COMPLETE).
_STOPPED_AS = {"pruned": TrialStatus.PRUNED, "stopped": TrialStatus.STOPPED}


_MISSING = object()


def _compss_hosts() -> list[str] | None:
    """A COMPSs @multinode task's nodes (COMPSs names one per process: kept once each)."""
    listed = os.environ.get("COMPSS_HOSTNAMES")
    return list(dict.fromkeys(h for h in listed.split(",") if h)) if listed else None


def _clock(task: TrialTask, reports: list[tuple[int, dict[str, float]]],
           segments: Sequence[Mapping[str, Any]]) -> QuantumClock:
    """The quantum clock of a task, from the trial's earlier reports and segments."""
    if task.quantum is None:
        raise RuntimeError("hpo internal error: only a time-shared task has a clock")
    sign = -1.0 if task.direction == "maximize" else 1.0
    last = segments[-1] if segments else {}
    return QuantumClock(
        task.quantum, preemptions=sum(s.get("outcome") == TrialStatus.SUSPENDED.value for s in segments),
        history=[sign * m[task.metric] for _, m in reports if task.metric in m],
        previous_loss=last.get("loss") if last.get("outcome") == TrialStatus.SUSPENDED.value else None,
        checkpoint_s=last.get("save_s", 0.0) + last.get("restore_s", 0.0))


def checkpoint_files(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Each checkpoint file in a trial's directory (its log aside) with its
    inode, size and modification time: two calls differ when the objective saved."""
    found = {}
    for path in directory.rglob("*"):
        try:
            if path.name != LOG_NAME and path.is_file():
                stat = path.stat()
                found[str(path)] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:  # replaced while listed (an atomic save): it changed
            found[str(path)] = (-1, -1, -1)
    return found


def size_of(directory: Path) -> int:
    """Bytes of the checkpoints in a trial's directory (its log aside)."""
    files = (f for f in directory.rglob("*") if f.is_file() and f.name != LOG_NAME)
    return sum(f.stat().st_size for f in files)
