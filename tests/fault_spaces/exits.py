"""An objective that ends the interpreter it runs in when ``x`` is 2, as a
crash in native code would (tests/test_faults.py)."""

import os


def train(config, trial):
    trial.report(0, value=0.0)
    if config["x"] == 2:
        os._exit(3)
    return {"value": float(config["x"])}
