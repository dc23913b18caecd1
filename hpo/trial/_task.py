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
import time
import traceback
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import optuna

from hpo.store import open_storage
from hpo.trial._handle import Trial, _StoreLink
from hpo.trial._objective import Objective, resolve_objective
from hpo.trial._state import RUN_ATTR, TrialState

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


def run_trial(task: TrialTask) -> TrialOutcome:
    """Run one trial and record it durably; the module-level task of every engine."""
    storage = open_storage(task.storage)
    stored = storage.get_trial(task.trial_id)
    if stored.state.is_finished():
        # Re-executed by an engine retry after the result was already stored:
        # keep the first result, so a trial is counted once.
        return _outcome_of(stored)
    run = _start_record(task, stored)
    storage.set_trial_user_attr(task.trial_id, RUN_ATTR, run)
    result = _run_isolated(task) if task.isolate else _run_here(task)
    state, value = _classify(result, task.metric)
    ended = time.time()
    duration = ended - run["started_at"]
    run.update(
        ended_at=ended, duration_s=duration, core_seconds=duration * task.cpus,
        gpu_seconds=duration * task.gpus, metrics=result.metrics, error=result.error,
        stop_reason=result.stop_reason, timed_out=result.timed_out,
    )
    storage.set_trial_user_attr(task.trial_id, RUN_ATTR, run)
    try:
        storage.set_trial_state_values(task.trial_id, _OPTUNA_STATE[state], _values(state, value))
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # finished meanwhile (cancelled by the master): the stored record wins
    return _outcome_of(storage.get_trial(task.trial_id))


_OPTUNA_STATE = {
    TrialState.COMPLETE: optuna.trial.TrialState.COMPLETE,
    TrialState.PRUNED: optuna.trial.TrialState.PRUNED,
    TrialState.FAILED: optuna.trial.TrialState.FAIL,
    TrialState.TIMEOUT: optuna.trial.TrialState.FAIL,
}


def _values(state: TrialState, value: float | None) -> list[float] | None:
    if state is TrialState.COMPLETE or (state is TrialState.PRUNED and value is not None):
        return [value]
    return None


def _outcome_of(trial: optuna.trial.FrozenTrial) -> TrialOutcome:
    return TrialOutcome(trial.number, TrialState.of(trial), trial.value if trial.values else None)


def _start_record(task: TrialTask, stored: optuna.trial.FrozenTrial) -> dict[str, Any]:
    previous = stored.user_attrs.get(RUN_ATTR)
    history = (previous or {}).get("previous", []) + ([_brief(previous)] if previous else [])
    return {
        "host": socket.gethostname(), "pid": os.getpid(), "attempt": len(history) + 1,
        "started_at": time.time(), "cpus": task.cpus, "gpus": _assigned_gpus(task),
        "binded_cpus": os.environ.get("COMPSS_BINDED_CPUS"), "previous": history,
    }


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    """What is kept of an earlier attempt."""
    return {k: run.get(k) for k in ("host", "pid", "started_at", "ended_at", "error")}


def _assigned_gpus(task: TrialTask) -> list[str]:
    if task.gpus <= 0:
        return []
    ids = os.environ.get("COMPSS_BINDED_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [i for i in ids.replace(",", " ").split() if i]


def _run_here(task: TrialTask) -> _Result:
    """Call the objective in this process with a store-backed Trial."""
    link = _StoreLink(
        open_storage(task.storage), task.study_name, task.study_id, task.trial_id,
        task.metric, task.early_stopping,
    )
    Path(task.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    trial = Trial(
        task.number, dict(task.config), task.checkpoint_dir,
        cpus=task.cpus, gpus=_assigned_gpus(task), _link=link,
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
    return (TrialState.PRUNED if result.stop_reason == "pruned" else TrialState.COMPLETE), value


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
