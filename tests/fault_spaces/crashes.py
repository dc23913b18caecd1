"""An objective that crashes in native code when ``x`` is 2 (a segmentation
fault), ending the interpreter it runs in (tests/test_faults.py)."""

import ctypes


def train(config, trial):
    trial.report(0, value=0.0)
    if config["x"] == 2:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return {"value": float(config["x"])}
