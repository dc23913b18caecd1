"""A trial's CPUs as COMPSs gives them to a task: ``cpus`` threads, and cores of its own.

COMPSs pins each task to its cores and sets ``OMP_NUM_THREADS``; on Dask and
inline nothing does, and TensorFlow or BLAS spread over every core of the
node whatever ``cpus`` says, so trials sharing a node slow each other down.
The wrapper therefore limits the thread pools it can reach (OpenMP, MKL,
OpenBLAS, TensorFlow's intra- and inter-op pools) to ``cpus`` threads and,
where this process may run on more cores than that, pins the trial to
``cpus`` cores that no other trial on the node holds.

Cores are claimed with ``flock`` on one file per core: the lock belongs to an
open file, so it separates threads of one Dask worker as well as worker
processes, and it goes away with a process that dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CpuBinding", "pin_cpus", "limit_threads", "thread_environment"]

# Read when a library starts its thread pool: a child process gets them before
# it imports anything; a worker process keeps them for its later trials.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                     "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                     "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclass(frozen=True)
class CpuBinding:
    """What a trial ran with: its thread count, and the cores it was pinned to (None: not pinned)."""

    threads: int
    cores: tuple[int, ...] | None = None
    tensorflow_threads: int | None = None  # TensorFlow's intra-op pool, where it is loaded


def thread_environment(cpus: int) -> dict[str, str]:
    """The variables that size the thread pools of a process running ``cpus`` threads."""
    return {name: str(cpus) for name in _THREAD_VARIABLES}


@contextlib.contextmanager
def pin_cpus(cpus: int) -> Iterator[tuple[int, ...] | None]:
    """Run the body on ``cpus`` cores of its own, where this process may use
    more (None: not pinned), with the thread variables a library reads as it
    starts its pool set to ``cpus``.

    Under COMPSs the runtime already pinned the task (``COMPSS_BINDED_CPUS``):
    its cores are recorded and left as they are.
    """
    os.environ.update(thread_environment(cpus))
    compss = _compss_cores()
    if compss:
        yield compss
        return
    with _pinned(cpus) as cores:
        yield cores


@contextlib.contextmanager
def limit_threads(cpus: int, cores: tuple[int, ...] | None) -> Iterator[CpuBinding]:
    """Limit the thread pools loaded so far (OpenMP, BLAS, TensorFlow's) to
    ``cpus`` threads while the body runs: entered once the objective's
    modules are imported, which is when those pools exist."""
    with _limited_pools(cpus):
        yield CpuBinding(cpus, cores, _limit_tensorflow(cpus))


def _compss_cores() -> tuple[int, ...] | None:
    given = os.environ.get("COMPSS_BINDED_CPUS", "")
    cores = tuple(int(c) for c in given.replace(",", " ").split() if c.isdigit())
    return cores or None


@contextlib.contextmanager
def _pinned(cpus: int) -> Iterator[tuple[int, ...] | None]:
    """Pin the calling thread (and the processes it starts) to ``cpus`` free cores."""
    process_cores = sorted(os.sched_getaffinity(os.getpid()))  # the main thread's set
    if cpus >= len(process_cores):
        yield None  # the process has no more cores than the trial: nothing to choose
        return
    with _claimed_cores(process_cores, cpus) as cores:
        if cores is None:  # every core is claimed by other trials: run unpinned
            yield None
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cores)
        try:
            yield cores
        finally:
            os.sched_setaffinity(0, before)  # Dask reuses the thread for other tasks


@contextlib.contextmanager
def _claimed_cores(candidates: list[int], wanted: int) -> Iterator[tuple[int, ...] | None]:
    folder = Path(tempfile.gettempdir()) / f"hpo-cores-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    held: list[tuple[int, int]] = []
    try:
        for core in candidates:
            fd = os.open(folder / f"cpu{core}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((core, fd))
            if len(held) == wanted:
                break
        yield tuple(core for core, _ in held) if len(held) == wanted else None
    finally:
        for _, fd in held:
            os.close(fd)  # releases the lock


@contextlib.contextmanager
def _limited_pools(cpus: int) -> Iterator[None]:
    """OpenMP and BLAS pools already loaded in this process (threadpoolctl)."""
    controller = pool_controller()
    if controller is None:  # pragma: no cover - a dependency of hpo
        yield
        return
    with controller.limit(limits=cpus):
        yield


# (modules loaded, extension modules among them, the controller) at the last scan
_pools: tuple[int, int, Any] | None = None


def pool_controller() -> Any:
    """threadpoolctl's view of the loaded libraries, scanned again only when
    extension modules were loaded since: a scan reads every loaded library
    (1 to 15 ms, each trial, in a worker that already has them all; a warm
    process scans once for the trials it forks)."""
    global _pools
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency of hpo
        return None
    if _pools is not None and _pools[0] == len(sys.modules):
        return _pools[2]
    extensions = sum(1 for module in list(sys.modules.values())
                     if str(getattr(module, "__file__", None) or "").endswith(".so"))
    controller = _pools[2] if _pools is not None and _pools[1] == extensions else ThreadpoolController()
    _pools = (len(sys.modules), extensions, controller)
    return controller


def _limit_tensorflow(cpus: int) -> int | None:
    """Size TensorFlow's pools if the objective loaded it; they are fixed once it
    ran its first operation, so a worker's first trial decides for its later ones."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return None
    threading = tf.config.threading
    for setter in (threading.set_intra_op_parallelism_threads,
                   threading.set_inter_op_parallelism_threads):
        with contextlib.suppress(RuntimeError):  # already initialised
            setter(cpus)
    return threading.get_intra_op_parallelism_threads() or None
