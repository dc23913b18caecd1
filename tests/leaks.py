"""What a test left behind: the processes, threads, listening ports and
temporary folders it started and did not end.

The engine and fault tests start clusters, relays, trial processes and
their process groups, and kill them on purpose; a test that passes yet
leaves one of them running slows or breaks the tests after it.
:func:`check_left` is run after each of them (``conftest.py``): it waits
for what the test started to end (a killed process is reaped, a relay's
thread leaves at its next round) and fails the test with the list of what
did not.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

#: How long what a test started may take to end after it (a trial's stop
#: grace, a worker's reaping on a loaded machine).
SETTLE_S = 60.0

#: Threads that the first user starts and that live as long as the process,
#: by design: hpo's one heartbeat writer of a process (a thread per trial
#: cost each trial its start), Dask's offload executor, its futures' callback
#: thread and its client's event loop, Python's ``run_in_executor`` pool.
PROCESS_WIDE_THREADS = ("hpo-heartbeat", "Dask-Offload", "Dask-Callback-Thread", "IO loop", "asyncio_",
                        "ThreadPoolExecutor-")

#: Processes of the same kind: multiprocessing's resource tracker, started
#: by the first semaphore a process makes (Dask's cluster, a queue).
PROCESS_WIDE_PROCESSES = ("multiprocessing.resource_tracker",)

#: A machine's folder of CPU claims (``hpo-cores-<uid>``): its lock files
#: outlive every trial, so that trials of different workers share it.
MACHINE_WIDE_FOLDERS = ("hpo-cores-",)


@dataclass(frozen=True)
class Footprint:
    """What this process and its descendants hold at one moment."""

    processes: dict[int, str]  # pid -> command line
    threads: dict[int, str]  # ident -> name
    ports: set[tuple[int, int]]  # (pid, port) listening
    folders: set[str]  # entries of the temporary folder

    @classmethod
    def now(cls) -> Footprint:
        me = psutil.Process()
        processes = {}
        for child in me.children(recursive=True):
            try:
                processes[child.pid] = " ".join(child.cmdline())[:160]
            except psutil.Error:  # ended meanwhile, or a zombie
                continue
        threads = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        return cls(processes, threads, _listening([me.pid, *processes]), _temporary())

    def added_since(self, before: Footprint, spared: Iterable[int] = ()) -> list[str]:
        """What is here and was not ``before``, processes in ``spared`` aside."""
        spared = set(spared)
        left = [f"process {pid}: {cmd}" for pid, cmd in self.processes.items()
                if pid not in before.processes and pid not in spared
                and not any(kind in cmd for kind in PROCESS_WIDE_PROCESSES)]
        left += [f"thread {name!r}" for ident, name in self.threads.items()
                 if ident not in before.threads and not name.startswith(PROCESS_WIDE_THREADS)]
        left += [f"port {port} (pid {pid})" for pid, port in sorted(self.ports - before.ports)
                 if pid not in spared]
        left += [f"temporary folder {name}" for name in sorted(self.folders - before.folders)]
        return left


#: What fixtures wider than a test own (a module's cluster, restarted
#: workers included): functions that return their processes now.
OWNED_BY_FIXTURES: list[Callable[[], Iterable[int]]] = []


@contextmanager
def owned_by_fixture(pids: Callable[[], Iterable[int]]) -> Iterator[None]:
    """While in it, the processes ``pids()`` returns, their descendants and
    their ports are the fixture's, not the test's."""
    OWNED_BY_FIXTURES.append(pids)
    try:
        yield
    finally:
        OWNED_BY_FIXTURES.remove(pids)


def check_left(before: Footprint) -> list[str]:
    """What the test left, once :data:`SETTLE_S` passed without it all ending
    (empty: nothing)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        left = Footprint.now().added_since(before, _fixtures_processes())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _fixtures_processes() -> set[int]:
    pids = set()
    for owned in OWNED_BY_FIXTURES:
        for pid in owned():
            pids.add(pid)
            try:
                pids |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                continue
    return pids


def _listening(pids: list[int]) -> set[tuple[int, int]]:
    ports = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        ports |= {(pid, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    return ports


def _temporary() -> set[str]:
    """hpo's and this suite's own entries of the temporary folder (pytest's
    ``tmp_path`` tree and the Dask cluster's scratch space are kept on purpose)."""
    try:
        names = os.listdir(tempfile.gettempdir())
    except OSError:
        return set()
    return {name for name in names
            if name.startswith(("hpo-", "tmp")) and not name.startswith(MACHINE_WIDE_FOLDERS)}
