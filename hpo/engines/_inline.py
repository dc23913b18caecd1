"""Runs trials one after another in the master process (for debugging)."""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from dataclasses import replace

from hpo.engines._base import Engine
from hpo.machine import refuse_beyond_this_machine
from hpo.trial import TrialTask, close_warm_processes, run_trial

__all__ = ["InlineEngine"]


class InlineEngine(Engine):
    """One slot: a thread of the master process runs queued trials one at a
    time, priority tasks first. The objective runs beside the master loop, not
    inside it, so a signal reaches the loop, which stops the study cleanly as
    on any engine.

    Parameters
    ----------
    retries:
        More runs of a task whose wrapper raised (an infrastructure fault: the
        store unreachable); user errors are recorded, never raised.
    """

    name = "inline"

    def __init__(self, retries: int = 0) -> None:
        self.retries = retries
        self._queue: list[tuple[int, int, TrialTask, Future]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    @classmethod
    def from_spec(cls, spec, *, scheduler=None, workers=None) -> InlineEngine:
        super().from_spec(spec, scheduler=scheduler, workers=workers)  # refuses both flags
        largest = spec.shape_bounds[1]  # each amount may be a parameter or an expression of them
        refuse_beyond_this_machine(largest.cpus, largest.gpus,
                                   "use --engine dask with workers offering {resources}")
        return cls(spec.retries.engine)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="hpo-inline", daemon=True)
        self._thread.start()

    @property
    def slots(self) -> int:
        return 1

    def submit(self, task: TrialTask, priority: bool = False) -> Future:
        task = replace(task, in_master=True)  # an objective that ends the process ends the master
        future: Future = Future()
        with self._ready:
            heapq.heappush(self._queue, (0 if priority else 1, next(self._order), task, future))
            self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if self._closing:
                    return
                _, _, task, future = heapq.heappop(self._queue)
            if future.set_running_or_notify_cancel():
                self._run(task, future)

    def _run(self, task: TrialTask, future: Future) -> None:
        for attempt in range(self.retries + 1):
            try:
                future.set_result(run_trial(task))
                return
            except Exception as exc:  # an infrastructure fault (store unreachable...)
                if attempt == self.retries:
                    future.set_exception(exc)

    def shutdown(self) -> None:
        # A trial still running when the study stops was told to stop (target,
        # signal) and ends by itself; the thread is a daemon, not waited for.
        with self._ready:
            self._closing = True
            for *_, future in self._queue:
                future.cancel()
            self._queue.clear()
            self._ready.notify()
        close_warm_processes()  # this is the user's process: its trials' warm processes go with the study
