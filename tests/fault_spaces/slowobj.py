"""A trial that takes 20 s per step and logs every step with its PID: shows
whether a trial runs twice at once (tests/test_exactly_once.py).

``SLOWOBJ_STEP_S`` sets the step's seconds; with ``SLOWOBJ_GATE`` (a path), a
step instead ends once that file exists (a test opens it; 300 s at most)."""

import os
import time


def _step(step_s: float, gate: str | None) -> None:
    if not gate:
        time.sleep(step_s)
        return
    deadline = time.monotonic() + 300
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


def train(config, trial):
    step_s = float(os.environ.get("SLOWOBJ_STEP_S", "20"))
    gate = os.environ.get("SLOWOBJ_GATE")
    for step in range(trial.next_step, 3):
        _step(step_s, gate)
        trial.report(step, value=float(step))
        with open(trial.checkpoint_dir / "executions.log", "a") as f:
            f.write(f"{time.strftime('%T')} pid={os.getpid()} step={step}\n")
        if trial.should_stop():
            break
    return {"value": 1.0}
