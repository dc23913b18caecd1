"""A sleep that notes when its first and last lines ran, for bench/trial_gaps.py.

Each call appends ``<first line> <last line>`` (``time.time()``) to
``<out>/<pid>.txt``: one file per worker process, appended by one thread at a
time (each worker runs one task at a time).
"""

from __future__ import annotations

import os
import time
from typing import Any


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
