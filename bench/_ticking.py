"""Trials that report once a second and time their own store calls, for bench/scale.py.

``work`` runs ``hpo.examples.toy.curve`` (sleep ``step_s``, ``trial.report``,
``trial.should_stop()``, step after step) through a proxy that times each
``report`` and ``should_stop`` call, then appends one JSON line per trial to
``<log_dir>/<pid>.jsonl``: the trial's start and end (epoch seconds), the
thread it ran on, its nominal length and the latencies. The same function serves hpo (a store-backed trial), Optuna (an
adapter) and plain Dask (no trial at all), so all three are timed alike.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from hpo.examples.toy import curve

_WRITE = threading.Lock()  # the trials of one worker process share its file


class TimedTrial:
    """The trial contract ``curve`` uses, timing the calls that reach the store."""

    def __init__(self, trial: Any) -> None:
        self._trial = trial
        self.report_s: list[float] = []
        self.stop_s: list[float] = []

    @property
    def next_step(self) -> int:
        return getattr(self._trial, "next_step", 0)

    def report(self, step: int, **metrics: float) -> None:
        begin = time.perf_counter()
        self._trial.report(step, **metrics)
        self.report_s.append(time.perf_counter() - begin)

    def should_stop(self) -> bool:
        begin = time.perf_counter()
        stop = self._trial.should_stop()
        self.stop_s.append(time.perf_counter() - begin)
        return stop


class OptunaTrial:
    """An Optuna trial behind hpo's trial contract: report, then should_prune."""

    next_step = 0

    def __init__(self, trial: Any) -> None:
        self._trial = trial

    def report(self, step: int, **metrics: float) -> None:
        self._trial.report(metrics["value"], step)

    def should_stop(self) -> bool:
        return self._trial.should_prune()


class NoStore:
    """A trial that stores nothing: plain Dask tasks."""

    next_step = 0

    def report(self, step: int, **metrics: float) -> None:
        pass

    def should_stop(self) -> bool:
        return False


def steps_of(config: dict[str, Any]) -> int:
    """``steps``, give or take ``spread`` (0): a fixed pseudo-random draw per trial index ``i``."""
    spread = int(config.get("spread", 0))
    return int(config["steps"]) - spread + (int(config.get("i", 0)) * 7919) % (2 * spread + 1)


def work(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Report ``steps_of(config)`` times, once every ``step_s`` seconds; log the timings."""
    timed = TimedTrial(trial)
    steps, step_s = steps_of(config), float(config["step_s"])
    start = time.time()
    result = curve({"steps": steps, "step_s": step_s}, timed)
    line = json.dumps({"start": start, "end": time.time(), "thread": threading.get_ident(),
                       "steps": steps, "step_s": step_s, "report_s": timed.report_s,
                       "stop_s": timed.stop_s})
    with _WRITE, open(Path(config["log_dir"]) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")
    return result
