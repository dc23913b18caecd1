"""The trial task: what every engine runs on a worker for one configuration.

``run_trial`` never raises because of user code: under COMPSs a task failing
past its retries ends the whole application, so an exception, a NaN, a wrong
return type or a time limit become a failed-trial record in the store, with
the reason and traceback. What it returns is a small summary; the store holds
the full record and is written before the function returns.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import optuna

from hpo.store import RunDir, StudyStore, open_study_store
from hpo.store.records import (
    RUN_ATTR, RunRecord, TrialStatus, end_run, grouped_attrs, last_sign_of_life, run_of,
    segment_key, segment_record, start_run, status_of,
)
from hpo.trial._cpus import CpuBinding, bind_cpus, thread_environment
from hpo.scheduling import QuantumRule
from hpo.trial._handle import Trial, _StoreLink
from hpo.trial._local_stop import stop_grace_s, track_child, untrack_child
from hpo.trial._log import LOG_NAME, trial_log
from hpo.trial._objective import Objective, resolve_objective
from hpo.trial._quantum import QuantumClock

if TYPE_CHECKING:
    from hpo.allocation import Placement, TrialShape
    from hpo.space import StudySpec

__all__ = ["TrialTask", "TrialOutcome", "TaskInterrupted", "run_trial", "open_trial",
           "give_up_task", "fell_silent", "SILENT_HEARTBEATS"]


@dataclass(frozen=True)
class TrialTask:
    """Everything a worker needs to run one trial; small and picklable."""

    storage: str
    study_name: str
    trial_id: int
    number: int
    config: dict[str, Any]
    objective: str | Objective
    metric: str
    checkpoint_dir: str
    # Every objective's metric, in order, in a multi-objective study; else empty.
    objectives: tuple[str, ...] = ()
    cpus: int = 1
    gpus: float = 0  # whole GPUs, or a share of one (0.25)
    time_limit_s: float | None = None
    nodes: int = 1
    memory_gb: float | None = None
    # Where the master placed it, on engines that let it choose (else the
    # engine's own binding, e.g. COMPSs's CUDA_VISIBLE_DEVICES, holds): its GPU
    # ids, the hosts of its nodes in rank order, its share of each GPU and
    # the relative speed of its slowest one.
    devices: tuple[str, ...] | None = None
    hosts: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()  # the engine's addresses of those nodes
    gpu_share: float = 1.0
    device_speed: float | None = None
    # Time this many first batches (trial.batch()) and record the training rate.
    profile_batches: int = 0
    # Rate allocation: the master may grow it onto more GPUs (it suspends, checkpointed).
    resizable: bool = False
    # The space's early_stopping settings (pruner name, patience...).
    early_stopping: dict[str, Any] | None = None
    pruner: optuna.pruners.BasePruner | None = None
    direction: str = "maximize"
    # Time-shared scheduling: the quanta after which the trial may yield its
    # slot (checkpointed, to resume in a later task); None: run to the end.
    quantum: QuantumRule | None = None
    # The trial's last segment index when this task was made (-1: none): the
    # task is over once the trial finishes or suspends after a later segment.
    after_segment: int = -1
    # How many more times a failing objective runs (the study's objective retries).
    retries: int = 0
    # Run the objective in a fresh child process: needed for a hard time limit,
    # and for GPU trials (a process that has initialised CUDA ignores later
    # changes of CUDA_VISIBLE_DEVICES, and COMPSs reuses worker processes).
    isolate: bool = False

    @classmethod
    def for_trial(cls, spec: "StudySpec", run_dir: RunDir, storage: str, number: int,
                  trial_id: int, params: dict[str, Any], *, quantum: QuantumRule | None = None,
                  after_segment: int = -1, objective: str | Objective | None = None,
                  pruner: optuna.pruners.BasePruner | None = None,
                  shape: "TrialShape | None" = None, placement: "Placement | None" = None,
                  profile_batches: int = 0, resizable: bool = False) -> "TrialTask":
        """The task of trial ``number`` of the study ``spec`` (``objective`` and
        ``pruner`` replace the space's when given), of ``shape`` (default: the
        one its configuration asks for), on ``placement`` when the master chose it."""
        from hpo.pruning import make_pruner

        stop = spec.early_stopping
        shape = shape or spec.shape_of({**spec.fixed, **params})
        settings = asdict(stop)
        if pruner is not None:
            settings["pruner"] = type(pruner).__name__  # named so in the reason of a prune
        return cls(
            storage=storage, study_name=spec.name, trial_id=trial_id, number=number,
            config={**spec.fixed, **params}, objective=objective or spec.objective,
            metric=spec.metric.name, checkpoint_dir=str(run_dir.checkpoint_dir(number)),
            objectives=tuple(m.name for m in spec.metrics) if spec.multi_objective else (),
            cpus=shape.cpus, gpus=shape.gpus, time_limit_s=shape.time_limit_s,
            nodes=shape.nodes, memory_gb=shape.memory_gb,
            devices=placement.devices if placement else None,
            hosts=placement.hosts if placement else (),
            workers=tuple(w for w in placement.workers if w) if placement else (),
            gpu_share=shape.gpus if shape.shared else 1.0,
            device_speed=placement.speed if placement else None,
            profile_batches=profile_batches, resizable=resizable,
            early_stopping=settings,
            pruner=pruner if pruner is not None else make_pruner(settings),
            direction=spec.metric.direction, quantum=quantum,
            after_segment=after_segment, retries=spec.retries.objective,
            isolate=shape.time_limit_s is not None or shape.gpus > 0,
        )

    def open_store(self) -> StudyStore:
        return open_study_store(self.storage, self.study_name)


@dataclass(frozen=True)
class TrialOutcome:
    """What the master gets back; the store holds the rest."""

    number: int
    state: TrialStatus
    value: float | None = None


@dataclass
class _Result:
    """What happened when the objective ran."""

    returned: Any = None
    error: dict[str, str] | None = None
    stop_reason: str | None = None
    timed_out: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    steps: tuple[int, int] | None = None  # first and last step reported by this run
    binding: dict[str, Any] | None = None  # the cores and threads it ran with
    quantum: dict[str, Any] | None = None  # time-sharing: the quanta it ran (QuantumClock.record)


def run_trial(task: TrialTask) -> TrialOutcome:
    """Run one trial, or one segment of it, and record it durably; the
    module-level task of every engine."""
    store = task.open_store()
    stored = store.trial(task.trial_id)
    if stored.state.is_finished():
        # Re-executed by an engine retry after the result was already stored:
        # keep the first result, so a trial is counted once.
        return _outcome_of(stored)
    run, write_start = _start_record(store, task, stored)
    while True:
        try:
            with _Heartbeat(store, task.trial_id, write_start):
                result = _attempt(task)
        except TaskInterrupted as interruption:  # cancelled, not timed out
            return _cancelled(store, task, run, interruption)
        write_start = None  # a retry's record is written before it starts
        state, value = _classify(result, task.metric, task.objectives)
        if state is not TrialStatus.FAILED or _failed_attempts(run) >= task.retries:
            break
        run = _retry_record(store, task, run, result)  # user code failed: again, from its checkpoint
    run = _end_record(run, result, task, suspended=state is TrialStatus.SUSPENDED)
    if task.quantum is not None:
        segment = {**segment_record(run, result.steps, state), **(result.quantum or {}),
                   "checkpoint_bytes": _size_of(Path(task.checkpoint_dir))}
        store.write(task.trial_id, segment_key(run["segment"]), segment)
    if state is TrialStatus.SUSPENDED:
        store.write_run(task.trial_id, run)
        return TrialOutcome(task.number, state)  # still RUNNING in the store; resumes later
    if store.finish(task.trial_id, state, value, run=run):  # the record and the end: one append
        return TrialOutcome(task.number, state, value[0] if isinstance(value, list) else value)
    return _outcome_of(store.trial(task.trial_id))  # cancelled meanwhile: the stored end wins


def _attempt(task: TrialTask) -> _Result:
    """Run the objective once. A time-out by the engine is a result; a
    cancellation raises :class:`TaskInterrupted`."""
    try:
        return _run_isolated(task) if task.isolate else _run_here(task)
    except TaskInterrupted as interruption:
        if not interruption.timed_out:
            raise
        return _Result(timed_out=True, error={
            "type": interruption.kind, "message": "the engine ended the task at its time_out"})


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


def _cancelled(store: StudyStore, task: TrialTask, run: RunRecord,
               interruption: TaskInterrupted) -> TrialOutcome:
    """A running task cancelled by the study or its runtime: the attempt ends
    without a result and the trial is resumed from its checkpoint, like a lost one."""
    ended = _end_record(run, _Result(error={"type": "Cancelled", "message": (
        f"the engine cancelled the running task ({interruption.kind})")}), task, suspended=False)
    give_up_task(task, ended, f"its task was cancelled ({interruption.kind}) on {run['host']}")
    return TrialOutcome(task.number, TrialStatus.RUNNING)


def give_up_task(task: TrialTask, run: RunRecord | None, why: str) -> None:
    """Leave a trial whose task ends without a result to be resumed at once
    from its checkpoint (best effort: the store may be what failed)."""
    store = task.open_store()
    try:
        if run is not None:
            store.write_run(task.trial_id, run)
        store.record_event(task.trial_id, "interrupted", None, why)
        store.abandon(task.trial_id)
    except Exception:  # finished meanwhile (the stored end wins), or unreachable
        pass


class _Heartbeat:
    """While the objective runs: the task's start record, written beside the
    objective rather than before it (a short trial does not wait for the
    write), then the time on the trial every ``heartbeat_s()``, so that a
    master can tell a trial still running elsewhere from a lost one.

    Leaving waits for the start record, and re-raises its error as writing
    it first would have; no beat is written after that.
    """

    def __init__(self, store: StudyStore, trial_id: int, first: Callable[[], None] | None = None) -> None:
        self._store, self._id = store, trial_id
        self.first = first
        self.due = 0.0  # time.monotonic() of the next beat
        self.error: Exception | None = None

    def __enter__(self) -> "_Heartbeat":
        # The start record counts as the first beat (or the one written before a retry).
        self.due = time.monotonic() + heartbeat_s()
        _Pulse.here().add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        _Pulse.here().remove(self)
        if self.error is not None and exc_type is None:
            raise self.error

    def write(self, first: Callable[[], None] | None) -> None:
        """The start record (``first``), else a beat; called by the pulse thread."""
        self.due = time.monotonic() + heartbeat_s()
        try:
            if first is not None:
                first()
            else:
                self._store.beat(self._id)
        except Exception as exc:
            if first is not None:
                self.error = exc
            # A beat: a store hiccup must not end the trial; the next beat retries.


class _Pulse:
    """The one thread of a process that writes the start records and heartbeats
    of the trials it runs (a thread per trial cost each trial its start-up)."""

    _here: "_Pulse | None" = None
    _making = threading.Lock()

    @classmethod
    def here(cls) -> "_Pulse":
        with cls._making:
            if cls._here is None or cls._here._pid != os.getpid():  # a forked child starts its own
                cls._here = cls()
            return cls._here

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._changed = threading.Condition()
        self._beats: list[_Heartbeat] = []
        self._writing: _Heartbeat | None = None
        threading.Thread(target=self._serve, name="hpo-heartbeat", daemon=True).start()

    def add(self, beat: _Heartbeat) -> None:
        with self._changed:
            self._beats.append(beat)
            self._changed.notify_all()

    def remove(self, beat: _Heartbeat) -> None:
        """Stop beating for ``beat`` once its start record and any beat under way are written."""
        with self._changed:
            try:
                while beat.first is not None or self._writing is beat:
                    self._changed.wait()
            finally:  # even when the runtime interrupts the wait: never beat for it again
                self._beats.remove(beat)

    def _serve(self) -> None:
        with self._changed:
            while True:
                beat = self._next()
                if beat is None:
                    continue
                first, beat.first = beat.first, None
                self._writing = beat
                self._changed.release()
                try:
                    beat.write(first)
                finally:
                    self._changed.acquire()
                    self._writing = None
                    self._changed.notify_all()

    def _next(self) -> _Heartbeat | None:
        """The trial to write for now, start records first; else wait until one is due."""
        now = time.monotonic()
        starting = [b for b in self._beats if b.first is not None]
        if starting:
            return starting[0]
        due = min(self._beats, key=lambda b: b.due, default=None)
        if due is not None and due.due <= now:
            return due
        self._changed.wait(None if due is None else due.due - now)
        return None


def heartbeat_s() -> float:
    """Seconds between heartbeats (``HPO_HEARTBEAT_S``, default 10)."""
    return float(os.environ.get("HPO_HEARTBEAT_S", "10"))


# Heartbeats a started trial may miss before it counts as lost.
SILENT_HEARTBEATS = 3


def fell_silent(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a started trial missed ``SILENT_HEARTBEATS`` heartbeats (or was
    given up): its worker or master is gone, and nothing will finish it."""
    silent_for = time.time() - last_sign_of_life(trial)
    return status_of(trial) is TrialStatus.RUNNING and silent_for >= SILENT_HEARTBEATS * heartbeat_s()


def _failed_attempts(run: RunRecord) -> int:
    earlier = [a for a in run.get("previous", []) if (a.get("error") or {}).get("type") != "Lost"]
    return sum(1 for a in earlier if a.get("error"))


def _retry_record(store: StudyStore, task: TrialTask, run: RunRecord, result: "_Result") -> RunRecord:
    """Close the failed attempt and open the next one (the objective's retries)."""
    error = result.error or {}
    ended = _end_record(run, result, task, suspended=False)
    store.record_event(task.trial_id, "retried", None,
                       f"attempt {run['attempt']} on {run['host']} failed ({error.get('type')}: "
                       f"{error.get('message')}); retrying from its checkpoint")
    following = start_run(ended, _where(task), time.time(), _gpu_total(task))
    store.write_run(task.trial_id, following)
    return following


def _outcome_of(trial: optuna.trial.FrozenTrial) -> TrialOutcome:
    return TrialOutcome(trial.number, status_of(trial), trial.values[0] if trial.values else None)


def _start_record(store: StudyStore, task: TrialTask,
                  stored: optuna.trial.FrozenTrial) -> tuple[RunRecord, Callable[[], None]]:
    """The run record as this task starts (the next segment of a suspended
    trial, or a new attempt: the first, or one after a lost one), and the
    writes that store it."""
    previous = run_of(stored)
    lost = bool(previous) and not previous.get("suspended")  # its worker or master died
    if lost:
        previous = {**previous, "error": {"type": "Lost", "message": "ended without a result"}}
    last_seen = (last_sign_of_life(stored) or previous.get("segment_started_at")) if lost else None
    run = start_run(previous, _where(task), time.time(), _gpu_total(task), last_seen)

    def write() -> None:
        if lost:
            store.record_event(task.trial_id, "retried", None,
                               f"attempt {previous.get('attempt')} on {previous.get('host')} "
                               f"(pid {previous.get('pid')}) was lost with its worker or master; "
                               "running again from its checkpoint")
        store.note(task.trial_id, RUN_ATTR, run)

    return run, write


def _where(task: TrialTask) -> dict[str, Any]:
    where = {"host": socket.gethostname(), "pid": os.getpid(), "cpus": task.cpus,
             "gpus": _assigned_gpus(task), "binded_cpus": os.environ.get("COMPSS_BINDED_CPUS")}
    if task.gpus or task.nodes > 1:  # its shape, as the dashboard shows it
        where.update(gpu_count=task.gpus, nodes=task.nodes, hosts=list(task.hosts) or None,
                     gpu_share=task.gpu_share, device_speed=task.device_speed)
    return where


def _gpu_total(task: TrialTask) -> float:
    """GPUs the trial holds over all its nodes: what its time costs."""
    return task.gpus * task.nodes


def _end_record(run: RunRecord, result: "_Result", task: TrialTask, suspended: bool) -> RunRecord:
    return end_run(run, time.time(), _gpu_total(task), metrics=result.metrics, error=result.error,
                   stop_reason=result.stop_reason, timed_out=result.timed_out, suspended=suspended,
                   binding=result.binding)


def device_environment(task: TrialTask) -> dict[str, str]:
    """What tells the trial's process its GPUs and nodes: the master's
    placement, where it chose one (COMPSs sets CUDA_VISIBLE_DEVICES itself)."""
    env: dict[str, str] = {}
    if task.devices is not None and task.gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(task.devices)
    if task.gpus > 0:
        # Frameworks' memory limits read it (hpo.keras.limit_gpu_memory, torch's
        # set_per_process_memory_fraction): trials sharing a GPU share its memory.
        env["HPO_GPU_MEMORY_FRACTION"] = f"{task.gpu_share:g}"
    if task.hosts:
        env["HPO_HOSTS"] = ",".join(task.hosts)
    if task.device_speed is not None:
        env["HPO_DEVICE_SPEED"] = f"{task.device_speed:g}"
    return env


def _assigned_gpus(task: TrialTask) -> list[str]:
    if task.gpus <= 0:
        return []
    if task.devices is not None:
        return list(task.devices)
    ids = os.environ.get("COMPSS_BINDED_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [i for i in ids.replace(",", " ").split() if i]


def open_trial(task: TrialTask) -> Trial:
    """The store-backed :class:`Trial` a worker hands the objective of ``task``:
    its reports are written to the store, its stop decisions read from it, and
    it holds the reports of the trial's earlier segments and attempts."""
    store = task.open_store()
    attrs = grouped_attrs(store.trial(task.trial_id))
    earlier = attrs.reports
    clock = _clock(task, earlier, attrs.segments) if task.quantum else None
    link = _StoreLink(store, task.trial_id, task.metric, task.early_stopping, task.pruner,
                      task.direction, clock, resizable=task.resizable)
    Path(task.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    return Trial(task.number, dict(task.config), task.checkpoint_dir,
                 cpus=task.cpus, gpus=_assigned_gpus(task), reports=earlier,
                 hosts=list(task.hosts) or _compss_hosts(), gpu_share=task.gpu_share,
                 profile_batches=task.profile_batches, _link=link)


def _compss_hosts() -> list[str] | None:
    """A COMPSs @multinode task's nodes (COMPSs names one per process: kept once each)."""
    listed = os.environ.get("COMPSS_HOSTNAMES")
    return list(dict.fromkeys(h for h in listed.split(",") if h)) if listed else None


def _clock(task: TrialTask, reports: list[tuple[int, dict[str, float]]],
           segments: list[dict[str, Any]]) -> QuantumClock:
    """The quantum clock of a task, from the trial's earlier reports and segments."""
    sign = -1.0 if task.direction == "maximize" else 1.0
    last = segments[-1] if segments else {}
    return QuantumClock(
        task.quantum, preemptions=sum(s.get("outcome") == TrialStatus.SUSPENDED.value for s in segments),
        history=[sign * m[task.metric] for _, m in reports if task.metric in m],
        previous_loss=last.get("loss") if last.get("outcome") == TrialStatus.SUSPENDED.value else None,
        checkpoint_s=last.get("save_s", 0.0) + last.get("restore_s", 0.0))


def _size_of(directory: Path) -> int:
    """Bytes of the checkpoints in a trial's directory (its log aside)."""
    files = (f for f in directory.rglob("*") if f.is_file() and f.name != LOG_NAME)
    return sum(f.stat().st_size for f in files)


def _run_here(task: TrialTask) -> _Result:
    """Call the objective in this process with a store-backed Trial, on
    ``task.cpus`` threads and, where the process has more, cores of its own."""
    trial = open_trial(task)
    earlier = list(trial.reports)
    result = _Result()
    header = f"trial {task.number}, pid {os.getpid()}" + (
        f", from step {earlier[-1][0] + 1}" if earlier else "")
    with trial_log(task.checkpoint_dir, header) as log:
        try:
            objective = resolve_objective(task.objective)  # imports TensorFlow, if it uses it
            with bind_cpus(task.cpus) as binding:
                result.binding = _binding_record(binding)
                result.returned = objective(dict(task.config), trial)
        except runtime_interruptions() as exc:
            raise TaskInterrupted(type(exc).__name__) from exc  # not the objective's doing
        except (Exception, SystemExit) as exc:  # user code: recorded, never raised
            result.error = {
                "type": type(exc).__name__, "message": str(exc),
                "traceback": traceback.format_exc(),
            }
            log.write(result.error["traceback"])
    result.stop_reason = trial.stop_reason
    if task.profile_batches:
        trial._record_profile()  # a trial shorter than its profile: on what it ran
    result.metrics = _last_metrics(trial, result.returned)
    if trial._link and trial._link.quantum:
        result.quantum = trial._link.quantum.record()
    new = trial.reports[len(earlier):]
    result.steps = (new[0][0], new[-1][0]) if new else None
    return result


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


def _classify(result: _Result, metric: str,
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


def _objective_values(result: _Result, objectives: tuple[str, ...]) -> tuple[TrialStatus, list[float] | None]:
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


def _run_isolated(task: TrialTask) -> _Result:
    """Run ``_run_here`` in a fresh Python process, killed at the time limit.

    A subprocess rather than multiprocessing: Dask worker processes are
    daemonic and may not fork multiprocessing children. The child and what it
    starts form a process group, ended on every way out of here.
    """
    import cloudpickle  # ships with dask; pickles notebook-defined objectives too

    with tempfile.TemporaryDirectory(prefix="hpo-trial-") as tmp:
        task_file, result_file = Path(tmp, "task.pkl"), Path(tmp, "result.pkl")
        task_file.write_bytes(cloudpickle.dumps(task))
        command = [sys.executable, "-m", "hpo.trial._child", str(task_file), str(result_file)]
        # Sized before any import; a process that initialised CUDA ignores later changes.
        env = {**os.environ, **thread_environment(task.cpus), **device_environment(task)}
        child = subprocess.Popen(command, start_new_session=True, env=env)
        track_child(child.pid)  # a SIGTERM to this worker reaches the trial (request_suspend)
        grace = 0.0  # a time limit ends it at once
        try:
            code = _wait(child, task.time_limit_s)
        except runtime_interruptions() as exc:
            interruption = TaskInterrupted(type(exc).__name__)
            if not interruption.timed_out:
                grace = stop_grace_s()  # cancelled, not out of time: its checkpoint chance first
            raise interruption from exc
        finally:
            untrack_child(child.pid)
            _end_group(child, grace)
        if code is None:
            return _Result(
                timed_out=True,
                error={"type": "TimeLimit", "message": f"exceeded time_limit_s={task.time_limit_s}"},
            )
        if result_file.exists():
            return pickle.loads(result_file.read_bytes())
        return _Result(error={"type": "ChildDied", "message": f"trial process exited with code {code}"})


def _wait(child: subprocess.Popen, limit_s: float | None) -> int | None:
    """The child's exit code, or None at the time limit. Waits in short steps,
    so that an exception the runtime raises in this thread arrives at once."""
    deadline = time.monotonic() + (limit_s if limit_s is not None else float("inf"))
    while True:
        try:
            return child.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.0)))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None


def _end_group(child: subprocess.Popen, grace_s: float) -> None:
    """End the trial's process group: SIGTERM and ``grace_s`` to checkpoint
    if it still runs, then SIGKILL to whatever is left (the objective may have
    started processes of its own, which outlive a child that exited)."""
    if grace_s > 0 and child.poll() is None:
        _signal_group(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass
