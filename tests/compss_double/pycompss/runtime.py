"""State of the fake runtime (not a real pycompss module; tests drive it)."""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from concurrent.futures import Future

from pycompss.util.context import CONTEXT

declared: dict[str, dict] = {}   # function name -> {"task": kwargs, "constraint": kwargs}
submitted: list[dict] = []        # one entry per task call in master mode
groups: dict[str, list] = {}
waited_unfinished = 0             # compss_wait_on calls on futures not yet done
workers = 2
worker_cpus, worker_gpus = 4, 0   # what each worker node offers (resources.xml)
blocked: list[dict] = []          # tasks no worker can serve: they never run, as in COMPSs
_pool: "_Pool | None" = None


class _Pool:
    """Worker slots that take queued tasks as the runtime does: a task
    declared with priority=True goes ahead of those already waiting."""

    def __init__(self, slots: int) -> None:
        self._queue: list = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closing = False
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(slots)]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: bool, function, *args, **kwargs) -> Future:
        future: Future = Future()
        with self._ready:
            heapq.heappush(self._queue, (0 if priority else 1, next(self._order), function, args,
                                         kwargs, future))
            self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if self._closing and not self._queue:
                    return
                *_, function, args, kwargs, future = heapq.heappop(self._queue)
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the task failed
                    future.set_exception(exc)

    def shutdown(self) -> None:
        with self._ready:
            for entry in self._queue:
                entry[-1].cancel()
            self._queue.clear()
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()


def start(n_workers: int = 2, cpus: int = 4, gpus: int = 0) -> None:
    global workers, worker_cpus, worker_gpus, _pool
    workers, worker_cpus, worker_gpus = n_workers, cpus, gpus
    _pool = _Pool(n_workers)
    CONTEXT.where = CONTEXT.master


def stop() -> None:
    global _pool, waited_unfinished
    waited_unfinished = 0
    if _pool is not None:
        _pool.shutdown()
    _pool = None
    CONTEXT.where = CONTEXT.out_of_scope
    declared.clear()
    blocked.clear()
    submitted.clear()
    groups.clear()


def pool() -> _Pool:
    return _pool


def servable(constraints: dict) -> bool:
    """Whether some worker offers what resolved ``constraints`` ask for."""
    keys = {key.replace("_", "").lower(): value for key, value in constraints.items()}
    cpus = int(keys.get("computingunits", 1))
    gpus = 0
    for processor in keys.get("processors", []):
        units = int(processor.get("computingUnits", 1))
        if processor.get("processorType") == "GPU":
            gpus += units
        else:
            cpus += units
    return cpus <= worker_cpus and gpus <= worker_gpus


def resolve(value):
    """'$VAR' values are read from the environment by the runtime."""
    if isinstance(value, str) and value.startswith("$"):
        name = value[1:]
        if name not in os.environ:
            raise RuntimeError(f"COMPSs: environment variable {name} of a constraint is not set")
        return os.environ[name]
    return value
