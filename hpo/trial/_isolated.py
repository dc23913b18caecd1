"""A trial in a fresh process of its own: needed for a hard time limit, and for
GPU trials (a process that has initialised CUDA ignores later changes of
``CUDA_VISIBLE_DEVICES``, and COMPSs reuses its worker processes).

The trial's process goes on with the attempt its parent started (the same
token): it writes through a link of its own, and its result comes back in a
file. It and what it starts form a process group, ended on every way out.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpo.store import TrialContext
from hpo.trial._attempt import AttemptResult, TaskInterrupted, runtime_interruptions
from hpo.trial._cpus import thread_environment
from hpo.trial._local_stop import stop_grace_s, track_child, untrack_child
from hpo.trial._objective import pythonpath
from hpo.trial._reaper import descendants, end_processes
from hpo.trial._task import TrialTask, device_environment
from hpo.trial._warm import WarmChild, start_warm

__all__ = ["run_isolated"]

#: What a distributed launcher sets for the processes it starts.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def run_isolated(task: TrialTask, token: str, context: TrialContext) -> AttemptResult:
    """Run :func:`run_here` in a process of its own, killed at the time limit:
    forked from this worker's warm process for the objective
    (:mod:`hpo.trial._warm`), else a fresh Python.

    A subprocess rather than multiprocessing: Dask worker processes are
    daemonic and may not fork multiprocessing children. The child and what it
    starts form a process group, ended on every way out of here.
    """
    import cloudpickle  # ships with dask; pickles notebook-defined objectives too

    with tempfile.TemporaryDirectory(prefix="hpo-trial-") as tmp:
        task_file, result_file = Path(tmp, "task.pkl"), Path(tmp, "result.pkl")
        task_file.write_bytes(cloudpickle.dumps((task, token, context)))
        command = [sys.executable, "-m", "hpo.trial._child", str(task_file), str(result_file)]
        # Sized before any import; a process that initialised CUDA ignores later changes.
        env = {**os.environ, **thread_environment(task.cpus), **device_environment(task)}
        if task.pythonpath:  # the objective's module, which a pickled objective names
            env["PYTHONPATH"] = pythonpath(task.pythonpath)
        for name in RANK_VARIABLES:  # set in a job step's environment, it would make a follower
            env.pop(name, None)
        child: subprocess.Popen | WarmChild | None = start_warm(
            task.objective, env, str(task_file), str(result_file))
        if child is None:  # no warm process here: a fresh Python
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
            return AttemptResult(
                timed_out=True,
                error={"type": "TimeLimit", "message": f"exceeded time_limit_s={task.time_limit_s}"},
            )
        if result_file.exists():
            return pickle.loads(result_file.read_bytes())
        return AttemptResult(error={"type": "ChildDied", "message": f"trial process exited with code {code}"})


def _wait(child: subprocess.Popen | WarmChild, limit_s: float | None) -> int | None:
    """The child's exit code, or None at the time limit. Waits in short steps,
    so that an exception the runtime raises in this thread arrives at once."""
    deadline = time.monotonic() + (limit_s if limit_s is not None else float("inf"))
    while True:
        try:
            return child.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.0)))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None


def _end_group(child: subprocess.Popen | WarmChild, grace_s: float) -> None:
    """End the trial's process group: SIGTERM and ``grace_s`` to checkpoint
    if it still runs, then SIGKILL to whatever is left (the objective may have
    started processes of its own, which outlive a child that exited)."""
    if grace_s > 0 and child.poll() is None:
        _signal_group(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # What it started, in its group or not (a setsid'd process is adopted by
    # the trial's process, a subreaper), ends with it.
    end_processes(descendants(child.pid))
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass
