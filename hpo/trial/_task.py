"""The trial task: what every engine runs on a worker for one configuration.

``run_trial`` never raises because of user code: under COMPSs a task failing
four times aborts the whole application, so an exception, a NaN, a wrong
return type or a time limit become a failed-trial record in the store, with
the reason and traceback. What it returns is a small summary; the store holds
the full record and is written before the function returns.
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import optuna

from hpo.store import open_storage
from hpo.trial._handle import Trial, _StoreLink, record_event
from hpo.trial._objective import Objective, resolve_objective
from hpo.trial._state import HEARTBEAT_ATTR, RUN_ATTR, SEGMENT_ATTR, TrialState, grouped_attrs

__all__ = ["TrialTask", "TrialOutcome", "run_trial"]


@dataclass(frozen=True)
class TrialTask:
    """Everything a worker needs to run one trial; small and picklable."""

    storage: str
    study_name: str
    study_id: int
    trial_id: int
    number: int
    config: dict[str, Any]
    objective: str | Objective
    metric: str
    checkpoint_dir: str
    cpus: int = 1
    gpus: int = 0
    time_limit_s: float | None = None
    early_stopping: dict[str, Any] | None = None
    direction: str = "maximize"
    # Reports this task may make before the trial is suspended, checkpointed,
    # to resume in a later task (segmented scheduling); None: run to the end.
    segment_steps: int | None = None
    # The study's ``retries``: how many more times a failing objective runs.
    retries: int = 0
    # Run the objective in a fresh child process: needed for a hard time limit,
    # and for GPU trials (a process that has initialised CUDA ignores later
    # changes of CUDA_VISIBLE_DEVICES, and COMPSs reuses worker processes).
    isolate: bool = False


@dataclass(frozen=True)
class TrialOutcome:
    """What the master gets back; the store holds the rest."""

    number: int
    state: TrialState
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


def run_trial(task: TrialTask) -> TrialOutcome:
    """Run one trial, or one segment of it, and record it durably; the
    module-level task of every engine."""
    storage = open_storage(task.storage)
    stored = storage.get_trial(task.trial_id)
    if stored.state.is_finished():
        # Re-executed by an engine retry after the result was already stored:
        # keep the first result, so a trial is counted once.
        return _outcome_of(stored)
    run = _start_record(storage, task, stored)
    storage.set_trial_user_attr(task.trial_id, RUN_ATTR, run)
    while True:
        with _Heartbeat(storage, task.trial_id):
            result = _run_isolated(task) if task.isolate else _run_here(task)
        state, value = _classify(result, task.metric)
        if state is not TrialState.FAILED or _failed_attempts(run) >= task.retries:
            break
        run = _retry_record(storage, task, run, result)  # user code failed: again, from its checkpoint
    _end_record(run, result, task, suspended=state is TrialState.SUSPENDED)
    if task.segment_steps is not None:
        storage.set_trial_user_attr(task.trial_id, f"{SEGMENT_ATTR}{run['segment']:06d}",
                                    _segment_record(run, result, state))
    storage.set_trial_user_attr(task.trial_id, RUN_ATTR, run)
    if state is TrialState.SUSPENDED:
        return TrialOutcome(task.number, state)  # still RUNNING in the store; resumes later
    try:
        storage.set_trial_state_values(task.trial_id, _OPTUNA_STATE[state], _values(state, value))
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # finished meanwhile (cancelled by the master): the stored record wins
    return _outcome_of(storage.get_trial(task.trial_id))


class _Heartbeat:
    """Writes the time on the trial every HEARTBEAT_S while the objective runs,
    so that a master can tell a trial still running elsewhere from a lost one."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
        self._storage, self._trial_id = storage, trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hpo-heartbeat", daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        # The run record written at the start counts as the first beat.
        while not self._stop.wait(heartbeat_s()):
            try:
                self._storage.set_trial_user_attr(self._trial_id, HEARTBEAT_ATTR, time.time())
            except Exception:  # a store hiccup must not end the trial; the next beat retries
                pass


def heartbeat_s() -> float:
    """Seconds between heartbeats (``HPO_HEARTBEAT_S``, default 10)."""
    return float(os.environ.get("HPO_HEARTBEAT_S", "10"))


def _failed_attempts(run: dict[str, Any]) -> int:
    earlier = [a for a in run.get("previous", []) if (a.get("error") or {}).get("type") != "Lost"]
    return sum(1 for a in earlier if a.get("error"))


def _retry_record(storage: optuna.storages.BaseStorage, task: TrialTask, run: dict[str, Any],
                  result: "_Result") -> dict[str, Any]:
    """Close the failed attempt and open the next one (the study's ``retries``)."""
    error = result.error or {}
    _end_record(run, result, task, suspended=False)
    record_event(storage, task.trial_id, "retried", None,
                 f"attempt {run['attempt']} on {run['host']} failed ({error.get('type')}: "
                 f"{error.get('message')}); retrying from its checkpoint")
    following = _start_record(storage, task, storage.get_trial(task.trial_id), previous=run)
    storage.set_trial_user_attr(task.trial_id, RUN_ATTR, following)
    return following


_OPTUNA_STATE = {
    TrialState.COMPLETE: optuna.trial.TrialState.COMPLETE,
    TrialState.PRUNED: optuna.trial.TrialState.PRUNED,
    TrialState.STOPPED: optuna.trial.TrialState.PRUNED,
    TrialState.FAILED: optuna.trial.TrialState.FAIL,
    TrialState.TIMEOUT: optuna.trial.TrialState.FAIL,
}


def _values(state: TrialState, value: float | None) -> list[float] | None:
    if state is TrialState.COMPLETE or (state in _EARLY and value is not None):
        return [value]
    return None


_EARLY = (TrialState.PRUNED, TrialState.STOPPED)


def _outcome_of(trial: optuna.trial.FrozenTrial) -> TrialOutcome:
    return TrialOutcome(trial.number, TrialState.of(trial), trial.value if trial.values else None)


def _start_record(storage: optuna.storages.BaseStorage, task: TrialTask,
                  stored: optuna.trial.FrozenTrial,
                  previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run record as this task starts: the next segment of a suspended
    trial, or a new attempt (the first, a retry, or one after a lost one)."""
    if previous is None:
        previous = stored.user_attrs.get(RUN_ATTR) or {}
        if previous and not previous.get("suspended"):  # its worker or master died
            previous = {**previous, "error": {"type": "Lost", "message": "ended without a result"}}
            record_event(storage, task.trial_id, "retried", None,
                         f"attempt {previous.get('attempt')} on {previous.get('host')} "
                         f"(pid {previous.get('pid')}) was lost with its worker or master; "
                         "running again from its checkpoint")
    now = time.time()
    where = {"host": socket.gethostname(), "pid": os.getpid(), "segment_started_at": now,
             "cpus": task.cpus, "gpus": _assigned_gpus(task),
             "binded_cpus": os.environ.get("COMPSS_BINDED_CPUS")}
    segment = previous.get("segment", -1) + 1
    if previous.get("suspended"):
        return {**previous, **where, "suspended": False, "segment": segment}
    history = previous.get("previous", []) + ([_brief(previous)] if previous else [])
    return {**where, "attempt": len(history) + 1, "started_at": previous.get("started_at", now),
            "segment": segment, "previous": history, "duration_s": previous.get("duration_s", 0.0),
            "core_seconds": previous.get("core_seconds", 0.0),
            "gpu_seconds": previous.get("gpu_seconds", 0.0)}


def _end_record(run: dict[str, Any], result: "_Result", task: TrialTask, suspended: bool) -> None:
    """Add this task's time and cost to the run record, and how it ended."""
    ended = time.time()
    busy = ended - run["segment_started_at"]
    run.update(
        ended_at=ended, duration_s=run.get("duration_s", 0.0) + busy,
        core_seconds=run.get("core_seconds", 0.0) + busy * task.cpus,
        gpu_seconds=run.get("gpu_seconds", 0.0) + busy * task.gpus,
        metrics=result.metrics, error=result.error, stop_reason=result.stop_reason,
        timed_out=result.timed_out, suspended=suspended,
    )


def _segment_record(run: dict[str, Any], result: "_Result", state: TrialState) -> dict[str, Any]:
    first, last = result.steps or (None, None)
    return {"index": run["segment"], "host": run["host"], "pid": run["pid"],
            "worker": f"{run['host']}:{run['pid']}", "started_at": run["segment_started_at"],
            "ended_at": run["ended_at"], "first_step": first, "last_step": last,
            "outcome": state.value}


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    """What is kept of an earlier attempt."""
    return {k: run.get(k) for k in ("attempt", "host", "pid", "started_at", "ended_at", "error")}


def _assigned_gpus(task: TrialTask) -> list[str]:
    if task.gpus <= 0:
        return []
    ids = os.environ.get("COMPSS_BINDED_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [i for i in ids.replace(",", " ").split() if i]


def _run_here(task: TrialTask) -> _Result:
    """Call the objective in this process with a store-backed Trial."""
    storage = open_storage(task.storage)
    link = _StoreLink(
        storage, task.study_name, task.study_id, task.trial_id, task.metric,
        task.early_stopping, task.direction, task.segment_steps,
    )
    Path(task.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    earlier, _, _ = grouped_attrs(storage.get_trial(task.trial_id))  # earlier segments' reports
    trial = Trial(
        task.number, dict(task.config), task.checkpoint_dir,
        cpus=task.cpus, gpus=_assigned_gpus(task), reports=earlier, _link=link,
    )
    result = _Result()
    try:
        objective = resolve_objective(task.objective)
        result.returned = objective(dict(task.config), trial)
    except (Exception, SystemExit) as exc:  # user code: recorded, never raised
        result.error = {
            "type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    result.stop_reason = trial.stop_reason
    result.metrics = _last_metrics(trial, result.returned)
    new = trial.reports[len(earlier):]
    result.steps = (new[0][0], new[-1][0]) if new else None
    return result


def _last_metrics(trial: Trial, returned: Any) -> dict[str, float]:
    metrics = dict(trial.reports[-1][1]) if trial.reports else {}
    if isinstance(returned, dict):
        metrics.update({k: float(v) for k, v in returned.items() if _is_number(v)})
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _classify(result: _Result, metric: str) -> tuple[TrialState, float | None]:
    """Turn what happened into a state and a value; problems go into result.error."""
    if result.timed_out:
        return TrialState.TIMEOUT, None
    if result.error:
        return TrialState.FAILED, None
    if result.stop_reason == "suspended":
        return TrialState.SUSPENDED, None  # what it returned mid-training does not count
    returned = result.returned
    if isinstance(returned, dict):
        returned = returned.get(metric, _MISSING)
    if returned is _MISSING or not _is_number(returned):
        result.error = {
            "type": "BadReturnValue",
            "message": f"objective returned {result.returned!r}; expected a number "
            f"or a dict with the metric {metric!r}",
        }
        return TrialState.FAILED, None
    value = float(returned)
    if not math.isfinite(value):
        result.error = {"type": "NonFiniteValue", "message": f"objective returned {value} for {metric!r}"}
        return TrialState.FAILED, None
    return _STOPPED_AS.get((result.stop_reason or "").split(":")[0], TrialState.COMPLETE), value


# Stop reasons that end a trial with its value but not as COMPLETE (a patience
# stop is an ordinary end of training: COMPLETE).
_STOPPED_AS = {"pruned": TrialState.PRUNED, "stopped": TrialState.STOPPED}


_MISSING = object()


def _run_isolated(task: TrialTask) -> _Result:
    """Run ``_run_here`` in a fresh Python process, killed at the time limit.

    A subprocess rather than multiprocessing: Dask worker processes are
    daemonic and may not fork multiprocessing children.
    """
    import cloudpickle  # ships with dask; pickles notebook-defined objectives too

    with tempfile.TemporaryDirectory(prefix="hpo-trial-") as tmp:
        task_file, result_file = Path(tmp, "task.pkl"), Path(tmp, "result.pkl")
        task_file.write_bytes(cloudpickle.dumps(task))
        command = [sys.executable, "-m", "hpo.trial._child", str(task_file), str(result_file)]
        child = subprocess.Popen(command, start_new_session=True)
        try:
            code = child.wait(timeout=task.time_limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            return _Result(
                timed_out=True,
                error={"type": "TimeLimit", "message": f"exceeded time_limit_s={task.time_limit_s}"},
            )
        if result_file.exists():
            return pickle.loads(result_file.read_bytes())
        return _Result(error={"type": "ChildDied", "message": f"trial process exited with code {code}"})


def _kill_group(child: subprocess.Popen) -> None:
    # The objective may have started processes of its own: end the whole group.
    try:
        os.killpg(child.pid, 9)
    except ProcessLookupError:
        pass
    child.wait()
