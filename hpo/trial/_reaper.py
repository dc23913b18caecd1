"""Processes a trial leaves behind end with it.

An objective may start processes and never wait for them (a data loader, a
server, a child that calls ``setsid`` to leave its process group). hpo ends
them when the trial ends, with a *subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``,
Linux 3.4 on): the process running trials adopts the orphans of what it
started, so they stay its descendants, and at the trial's end each process
that appeared below it meanwhile is ended, with everything below. No cgroup
is used: compute nodes seldom delegate one to users, and SLURM's own ends
what is left at the job's end.

- A trial in a process of its own (``hpo.trial._child``: a time limit or
  GPUs): that process is the subreaper and ends its descendants when the
  objective returns; the worker ends the whole tree when it must kill the
  trial (its time limit).
- A trial in a worker's process (Dask): the processes that became children
  of that process while it ran are ended when it ends; when several trials
  share the process (a worker of several threads), when the last of them
  ends (which started which cannot be told apart). A trial's process of its
  own (above) is never counted in.
- A trial in the master's process (``--engine inline``, a notebook's
  ``hpo.run``): that process is the user's, so only what the objective's own
  thread started is ended (with everything below it); a process detached
  from it meanwhile (``setsid`` and its parent gone) outlives it there. A
  time limit, or the dask engine, gives the trial a process that ends all.

Elsewhere than Linux nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["become_subreaper", "descendants", "end_processes", "reaping"]

_PR_SET_CHILD_SUBREAPER = 36
_lock = threading.Lock()
_running = 0  # trials running in this process
_before: set[int] = set()  # this process's children when the first of them started
_subreaper_pid: int | None = None


def become_subreaper() -> bool:
    """Make this process adopt its descendants' orphans (once per process);
    False where the system cannot."""
    global _subreaper_pid
    if _subreaper_pid == os.getpid():
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    _subreaper_pid = os.getpid()
    return True


def children(pid: int) -> set[int]:
    """The live children of process ``pid`` (of every thread of it)."""
    folder = f"/proc/{pid}/task"
    try:
        tasks = os.listdir(folder)
    except OSError:
        return set()
    # Plain strings and os calls: a worker lists them before and after every trial.
    return set().union(*(_listed(f"{folder}/{task}/children") for task in tasks))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    below, queue = [], [pid]
    while queue:
        for child in sorted(children(queue.pop())):
            if child not in below:
                below.append(child)
                queue.append(child)
    return below


def end_processes(pids: Iterable[int]) -> None:
    """End these processes and everything below them (SIGKILL), and reap
    those that were this process's children."""
    for _ in range(10):  # what forks while it is being ended is ended in the next pass
        tree = []
        for pid in pids:
            tree += [pid, *descendants(pid)]
        alive = [pid for pid in dict.fromkeys(tree) if _signal(pid, signal.SIGKILL)]
        if not alive:
            return
        for pid in alive:
            _reap(pid)
        pids = alive


@contextmanager
def reaping(spared: Iterable[int] = (), *, own_process: bool = True) -> Iterator[None]:
    """While a trial runs in this process: at its end, end what it started.
    In a process of trials (``own_process``), the processes that became this
    process's children meanwhile (once the last trial running beside it
    ends), except ``spared`` (trials' own processes); in the master's, the
    children of the trial's own thread."""
    if not own_process:
        with _thread_reaping():
            yield
        return
    global _running, _before
    become_subreaper()
    with _lock:
        if _running == 0:
            _before = children(os.getpid())
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            left = children(os.getpid()) - _before - set(spared) if _running == 0 else set()
        if left:
            end_processes(sorted(left))


@contextmanager
def _thread_reaping() -> Iterator[None]:
    thread = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"
    before = _listed(thread)
    try:
        yield
    finally:
        left = _listed(thread) - before
        if left:
            end_processes(sorted(left))


def _listed(children_file: str) -> set[int]:
    try:
        with open(children_file, "rb") as listing:
            return {int(p) for p in listing.read().split()}
    except (OSError, ValueError):
        return set()


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # not ours: its parent, or init, reaps it
