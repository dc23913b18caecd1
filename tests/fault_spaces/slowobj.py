"""A trial that takes 20 s per step and logs every step with its PID: shows
whether a trial runs twice at once (tests/test_exactly_once.py)."""

import os
import time


def train(config, trial):
    step_s = float(os.environ.get("SLOWOBJ_STEP_S", "20"))
    for step in range(trial.next_step, 3):
        time.sleep(step_s)
        trial.report(step, value=float(step))
        with open(trial.checkpoint_dir / "executions.log", "a") as f:
            f.write(f"{time.strftime('%T')} pid={os.getpid()} step={step}\n")
        if trial.should_stop():
            break
    return {"value": 1.0}
