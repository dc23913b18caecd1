"""A sleep that notes when its first and last lines ran, and a worker plugin
that notes when each task ran, for bench/trial_gaps.py.

Each call appends ``<first line> <last line>`` (``time.time()``) to
``<out>/<pid>.txt``: one file per worker process, appended by one thread at a
time (each worker runs one task at a time). The plugin reads the same clock
on the same worker, so the two need no offset between them (Dask's task
stream shifts a worker's times by its estimate of that worker's clock
offset, which drifted by a millisecond from one run to the next).
"""

from __future__ import annotations

import os
import time
from typing import Any

from distributed import WorkerPlugin


def sleep_noted(seconds: float, out: str) -> float:
    """Sleep ``seconds``, noting the first and last line's times; plain Dask's task."""
    first = time.time()
    time.sleep(seconds)
    last = time.time()
    with open(os.path.join(out, f"{os.getpid()}.txt"), "a", encoding="utf-8") as notes:
        notes.write(f"{first!r} {last!r}\n")
    return last - first


def objective(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """The same sleep as an hpo objective (``fixed``: ``sleep_s``, ``out``)."""
    return {"value": sleep_noted(config["sleep_s"], config["out"])}


class TaskSpans(WorkerPlugin):
    """On each worker: ``(start, end)`` of every task it ran, on its own clock."""

    name = "task-spans"

    def setup(self, worker: Any) -> None:
        self.spans: list[tuple[float, float]] = []
        self._began: dict[Any, float] = {}

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            self._began[key] = time.time()
        elif start == "executing" and key in self._began:
            self.spans.append((self._began.pop(key), time.time()))


def taken_spans(dask_worker: Any) -> list[tuple[float, float]]:
    """The spans noted so far on this worker, cleared for the next round."""
    plugin = dask_worker.plugins[TaskSpans.name]
    spans, plugin.spans = plugin.spans, []
    return spans
