"""PyCOMPSs: the engine used when the program runs under runcompss/enqueue_compss.

Kept thin: it declares nothing itself (see ``_compss_tasks``) and only maps the
engine interface onto ``compss_wait_on``, ``TaskGroup`` and
``compss_cancel_group``. COMPSs has no wait-any, so the engine's futures are
completed by a thread that asks the master which trials are over (their
workers stored it before their tasks ended: see :class:`FollowsTasks`), and
``compss_wait_on`` is only called, on the master's thread, on those.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from hpo.engines._base import Engine
from hpo.errors import UsageError
from hpo.machine import node_cores, trials_per_node, visible_gpus
from hpo.trial import TrialTask, close_warm_processes

__all__ = ["CompssEngine", "under_compss_runtime", "node_memory_gb"]

# The worker stores the outcome just before its task returns: the return is
# given this long, so that compss_wait_on never blocks.
_RETURN_GRACE_S = 0.2
_LOOK_S = 0.1  # how often the store is asked which tasks are over


def under_compss_runtime() -> bool:
    """True when this program runs inside the COMPSs runtime (runcompss)."""
    try:
        from pycompss.util import context
    except ImportError:
        return False
    if hasattr(context, "CONTEXT"):  # COMPSs 3.x
        return bool(context.CONTEXT.in_pycompss())
    return bool(context.in_pycompss())  # COMPSs 2.x


def node_memory_gb() -> float | None:
    """This node's memory for trials, in GB: SLURM's ``SLURM_MEM_PER_NODE``
    (MB) inside an allocation that set one, else the node's physical memory."""
    given = os.environ.get("SLURM_MEM_PER_NODE", "")
    if given.isdigit() and int(given) > 0:
        return int(given) / 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return None


class CompssTask(Future):
    """The master's future of a COMPSs task: done when the store says its
    trial's task is over; its result is ``compss_wait_on``'s (None for a task
    whose worker died), and cancelling it cancels its task group. Both run
    on the thread that asks, the master's."""

    def __init__(self, api: Any, group: str, compss_future: Any, task: TrialTask) -> None:
        super().__init__()
        self._api, self.group, self.compss, self.task = api, group, compss_future, task

    def result(self, timeout: float | None = None) -> Any:
        super().result(timeout)
        return self._api.compss_wait_on(self.compss)

    def cancel(self) -> bool:
        if not self.done():
            self._api.compss_cancel_group(self.group)
        return super().cancel()


class CompssEngine(Engine):
    """Trials as PyCOMPSs tasks with @constraint (CPUs, GPUs, memory) and time_out.

    ``slots`` (how many trials can run at once) are the trials that fit
    at once on the worker nodes the runtime reports, or the ``slots`` given
    where it is more (a study's ``parallel``), each node taken to be like
    this one: its cores (``SLURM_CPUS_ON_NODE``, else this node's) divided by
    ``cpus``, its visible GPUs by ``gpus``, its memory
    (``SLURM_MEM_PER_NODE``, else this node's) by ``memory_gb`` in whole GB,
    and a trial of ``nodes`` nodes takes a place on as many nodes (see
    :meth:`fit`). ``hpo submit`` passes the allocation's own figure as
    ``--parallel``.
    """

    name = "compss"

    @staticmethod
    def whole_gb(memory_gb: float | None) -> int:
        """The ``memory_size`` COMPSs is told, in GB (0: no limit): rounded up.

        The PyCOMPSs 3.3 binding keeps a constraint string that is neither
        digits nor ``$VAR`` as ``int()`` of its value
        (``pycompss/runtime/task/master.py``, ``inspect_constraints``): "1.5"
        would reserve 1 GB and "0.5" none.

        >>> CompssEngine.whole_gb(1.5), CompssEngine.whole_gb(0.5), CompssEngine.whole_gb(16)
        (2, 1, 16)
        """
        return math.ceil(memory_gb) if memory_gb else 0

    @staticmethod
    def memory_warning(memory_gb: float | None) -> str | None:
        """What the user is told when a trial's memory is not whole GB, or None."""
        if not memory_gb or memory_gb == int(memory_gb):
            return None
        kept = CompssEngine.whole_gb(memory_gb)
        return (f"hpo: warning: \"memory_gb\": {memory_gb:g}: COMPSs reserves whole GB (its Python "
                f"binding cuts {memory_gb:g} to {int(memory_gb)}), so hpo asks for {kept} GB per "
                f"trial.\n  fix: write \"memory_gb\": {kept} (or another whole number) to say so")

    @property
    def local(self) -> bool:
        """One node (a laptop, a one-node allocation) has its workers on it; a
        multi-node allocation's are the other nodes. Outside SLURM, assumed
        local: a worker that cannot reach the store's relay writes directly."""
        return int(os.environ.get("SLURM_JOB_NUM_NODES") or 1) <= 1

    @staticmethod
    def places(cpus: int, gpus: int, memory_gb: float | None, cores: int, node_gpus: int,
               node_memory_gb: float | None) -> int:
        """The trials of ``cpus`` CPUs, ``gpus`` GPUs and ``memory_gb`` one
        node holds at once (at least one), the memory as COMPSs reserves it
        (whole GB); a node's memory of None (unknown) bounds nothing.

        >>> CompssEngine.places(1, 0, 10, cores=48, node_gpus=0, node_memory_gb=200)
        20
        """
        fit = trials_per_node(cpus, gpus, cores, node_gpus)
        if memory_gb and node_memory_gb:
            fit = min(fit, int(node_memory_gb // CompssEngine.whole_gb(memory_gb)))
        return max(fit, 1)

    @staticmethod
    def fit(places: Sequence[int], nodes_per_trial: int = 1) -> int:
        """How many trials of ``nodes_per_trial`` distinct nodes run at once on
        nodes holding ``places`` trials each: the most t with t * n <= the sum
        of min(place, t) (a trial takes a place on each of its nodes).

        >>> CompssEngine.fit([1] * 6, 3), CompssEngine.fit([12] * 3, 3), CompssEngine.fit([2] * 5, 3)
        (2, 12, 3)
        """
        t = 0
        while (t + 1) * nodes_per_trial <= sum(min(p, t + 1) for p in places):
            t += 1
        return t

    def __init__(self, cpus: int = 1, gpus: int = 0, memory_gb: float | None = None,
                 time_limit_s: float | None = None, slots: int | None = None,
                 nodes: int = 1) -> None:
        # The smallest trial's shape: it sizes the slots. Each task is declared
        # for its own trial's shape (COMPSs fixes constraints at declaration).
        self._cpus, self._gpus, self._nodes = cpus, gpus, nodes
        self._memory_gb, self._time_limit_s = memory_gb, time_limit_s
        self._slots = slots
        self._warned: set[float | None] = set()  # memory values whose rounding was told
        self._tasks: Any = None  # hpo.engines._compss_tasks and pycompss.api.api, once started
        self._api: Any = None
        self._count = itertools.count()
        self._live: dict[CompssTask, float | None] = {}  # not done yet: since when the store says over
        self._is_over: Callable[[TrialTask], bool] = lambda task: False
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    def follow(self, is_over: Callable[[TrialTask], bool]) -> None:
        self._is_over = is_over

    @classmethod
    def from_spec(cls, spec, *, scheduler=None, workers=None) -> CompssEngine:
        super().from_spec(spec, scheduler=scheduler, workers=workers)  # refuses both flags
        smallest, _ = spec.shape_bounds
        if 0 < smallest.gpus < 1:
            raise UsageError(
                f"$.resources.gpus: COMPSs counts GPUs in whole devices; a trial asks for "
                f"{smallest.gpus:g} of one.\n  fix: use whole GPUs with --engine compss, or share "
                "GPUs with the dask engine (hpo run --engine dask)")
        return cls(smallest.cpus, int(smallest.gpus), smallest.memory_gb, smallest.time_limit_s,
                   spec.search.parallel, smallest.nodes)

    def start(self) -> None:
        self._tasks = importlib.import_module("hpo.engines._compss_tasks")
        self._api = importlib.import_module("pycompss.api.api")
        smallest = self._shape(self._cpus, self._gpus, self._memory_gb, self._time_limit_s)
        for priority in (False, True):  # other shapes are declared as their first trial comes
            self._tasks.trial_task(smallest, priority)
        # The runtime counts nodes, not slots; the nodes are taken to be like this one.
        nodes = max(1, int(self._api.compss_get_number_of_resources()))
        gpus_here = len(visible_gpus()) if self._gpus else 0
        here = self.places(self._cpus, self._gpus, self._memory_gb, node_cores(), gpus_here,
                           node_memory_gb())
        # Never fewer slots than fit: COMPSs starts a task as soon as a node has
        # room, so trials queued ahead of fewer slots would run beside them. A
        # larger figure is trusted (the worker nodes may be larger than this one).
        self._slots = max(self._slots or 1, self.fit([here] * nodes, self._nodes))

    def shutdown(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        if not under_compss_runtime():
            # Plain python: each task ran at once in this process, the user's,
            # as the inline engine's do; its trials' warm processes go with the
            # study. Under runcompss they are the workers', and end with them.
            close_warm_processes()

    @property
    def slots(self) -> int:
        return self._slots or 1

    def submit(self, task: TrialTask, priority: bool = False) -> CompssTask:
        # A group per task (not per trial): a trial run in segments has several.
        group = f"hpo-{task.study_name}-{task.number}-{next(self._count)}"
        shape = self._shape(task.cpus, int(task.gpus), task.memory_gb, task.time_limit_s, task.nodes)
        with self._api.TaskGroup(group, implicit_barrier=False):
            future = CompssTask(self._api, group, self._tasks.trial_task(shape, priority)(task), task)
        self._live[future] = None
        if self._watcher is None:  # the first task: someone must follow it
            self._closing.clear()
            self._watcher = threading.Thread(target=self._watch, name="hpo-compss-watch", daemon=True)
            self._watcher.start()
        return future

    def _shape(self, cpus: int, gpus: int, memory_gb: float | None, time_limit_s: float | None,
               nodes: int = 1) -> Any:
        """The task shape of these resources; a memory COMPSs cannot hold as
        asked is told once per value (it is rounded up to whole GB)."""
        warning = self.memory_warning(memory_gb)
        if warning and memory_gb not in self._warned:
            self._warned.add(memory_gb)
            print(warning, file=sys.stderr, flush=True)
        return self._tasks.TaskShape.of(cpus, gpus, memory_gb, time_limit_s, nodes)

    def _watch(self) -> None:
        """Until shutdown: complete the futures of the tasks the store says
        are over, once their return had its moment."""
        while not self._closing.wait(_LOOK_S):
            now = time.monotonic()
            for future, since in list(self._live.items()):
                if future.cancelled():
                    del self._live[future]
                elif since is None:
                    try:
                        over = self._is_over(future.task)
                    except Exception as exc:  # the store unreadable: the master gathers why
                        del self._live[future]
                        if future.set_running_or_notify_cancel():
                            future.set_exception(exc)
                        continue
                    if over:
                        self._live[future] = now
                elif now - since >= _RETURN_GRACE_S:
                    del self._live[future]
                    if future.set_running_or_notify_cancel():
                        future.set_result(None)
