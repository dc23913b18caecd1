"""Objectives with no machine learning, for tests, demos and overhead benchmarks.

``sleep`` and ``slow`` take time, ``quadratic`` has a learning curve and a
known optimum (x=2, y=-1, value 0, to maximise), ``curve`` is a learning curve
of chosen height and speed that resumes where it was suspended, ``fail`` and
``nan`` misbehave on purpose. All return ``{"value": ...}`` except ``nan``,
which returns a float.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["sleep", "devices", "quadratic", "curve", "flaky", "fail", "nan", "slow"]


def sleep(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Sleep ``sleep_s`` seconds (0.1) and return ``{"value": x}`` (x defaults to 0)."""
    time.sleep(float(config.get("sleep_s", 0.1)))
    return {"value": float(config.get("x", 0))}


def devices(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Sleep ``sleep_s`` (0.3) and write what the trial's process was given
    (``CUDA_VISIBLE_DEVICES``, its GPU memory share, its hosts, when it ran)
    to ``seen.json`` in its checkpoint directory; returns ``{"value": x}``."""
    import json
    import os

    started = time.time()
    time.sleep(float(config.get("sleep_s", 0.3)))
    seen = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "HPO_GPU_MEMORY_FRACTION": os.environ.get("HPO_GPU_MEMORY_FRACTION"),
            "hosts": trial.hosts, "gpus": trial.gpus, "started": started, "ended": time.time()}
    (trial.checkpoint_dir / "seen.json").write_text(json.dumps(seen))
    return {"value": float(config.get("x", 0))}


def quadratic(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Report ``steps`` (3) values rising to -(x-2)**2 - (y+1)**2, sleeping ``step_s`` (0) each; return the last."""
    target = -((float(config.get("x", 0.0)) - 2.0) ** 2) - (float(config.get("y", 0.0)) + 1.0) ** 2
    steps = int(config.get("steps", 3))
    step_s = float(config.get("step_s", 0.0))
    value = float("-inf")
    for step in range(steps):
        if step_s:
            time.sleep(step_s)
        value = target - (steps - 1 - step) / steps  # reaches the target at the last step
        trial.report(step, value=value)
        if trial.should_stop():
            break
    return {"value": value}


def curve(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Report ``quality * (1 - exp(-rate * (step + 1)))`` for ``steps`` (10) steps,
    spending ``step_s`` (0) each (``trial.elapse``); ``quality`` 1.0 and ``rate`` 0.5 by default.

    The value depends on the step alone, so a suspended trial resumes exactly
    at ``trial.next_step``. Returns the last value reported.
    """
    quality, rate = float(config.get("quality", 1.0)), float(config.get("rate", 0.5))
    steps, step_s = int(config.get("steps", 10)), float(config.get("step_s", 0.0))
    value = quality * (1 - math.exp(-rate * trial.next_step))
    spend = getattr(trial, "elapse", time.sleep)  # simulated time on the simulated engine
    for step in range(trial.next_step, steps):
        spend(step_s)
        value = quality * (1 - math.exp(-rate * (step + 1)))
        trial.report(step, value=value)
        if step + 1 < steps and trial.should_stop():  # the last step ends it anyway
            break
    return {"value": value}


def flaky(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Like ``curve``, but the first attempt raises after ``fail_at`` (2) steps.

    Attempts are counted in the trial's checkpoint, as a crash that a retry
    from the checkpoint gets past.
    """
    state = trial.load_checkpoint() or {"attempts": 0}
    state["attempts"] += 1
    trial.save_checkpoint(state)
    if state["attempts"] == 1:
        for step in range(int(config.get("fail_at", 2))):
            trial.report(step, value=0.1 * (step + 1))
        raise RuntimeError(f"flaky: attempt 1 of trial {trial.number} fails on purpose")
    return curve({"rate": 1.0, **config}, trial)


def fail(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Raise ``RuntimeError("boom: ...")`` when ``config["fail"]`` is truthy, else return ``{"value": 1.0}``."""
    if config.get("fail"):
        raise RuntimeError(f"boom: trial {trial.number} fails on purpose (config fail={config['fail']!r})")
    return {"value": 1.0}


def nan(config: dict[str, Any], trial: Any) -> float:
    """Return ``float("nan")``, as a diverged training would."""
    return float("nan")


def slow(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Sleep ``sleep_s`` (1.0) in 0.05 s naps, returning early when ``trial.should_stop()``;
    return ``{"value": 1.0}``."""
    deadline = time.monotonic() + float(config.get("sleep_s", 1.0))
    while (left := deadline - time.monotonic()) > 0:
        if trial.should_stop():
            break
        time.sleep(min(0.05, left))
    return {"value": 1.0}
