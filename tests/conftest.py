"""Shared fixtures: a real multi-process Dask cluster and the PyCOMPSs double."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
COMPSS_DOUBLE = Path(__file__).parent / "compss_double"
# Not test modules: the double must only be importable inside the ``compss``
# fixture (collecting its docstrings would leave it on sys.path for good).
collect_ignore = ["compss_double", "engine_driver.py"]


@pytest.fixture(scope="session")
def dask_address():
    """A LocalCluster of 2 worker processes (1 thread, CPU=1 each) on 127.0.0.1."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def worker_pids(dask_address):
    """The PIDs of the cluster's worker processes."""
    from distributed import Client

    with Client(dask_address) as client:
        return set(client.run(os.getpid).values())


@pytest.fixture
def compss(monkeypatch):
    """The pycompss test double on sys.path; yields its runtime control module."""
    monkeypatch.syspath_prepend(str(COMPSS_DOUBLE))
    _forget_compss()
    from pycompss import runtime

    yield runtime
    runtime.stop()
    _forget_compss()


def _forget_compss() -> None:
    for name in list(sys.modules):
        if name.startswith("pycompss") or name == "hpo.engines._compss_tasks":
            del sys.modules[name]
    import hpo.engines

    vars(hpo.engines).pop("_compss_tasks", None)  # the package keeps its submodule too


def toy_space(name: str, objective: str = "hpo.examples.toy:quadratic", **extra) -> dict:
    """A small full-form space over the toy objectives."""
    space = {
        "name": name, "objective": objective, "metric": {"name": "value"},
        "search": {"algorithm": "grid", "parallel": 2},
        "space": {"x": [0, 1, 2, 3], "y": [-1, 0]},
    }
    for key, value in extra.items():
        if key in ("search", "metric") and isinstance(value, dict):
            space[key] = {**space[key], **value}
        else:
            space[key] = value
    return space


def stop_processes(procs) -> None:
    """End the processes a test started, last started first (workers before
    their scheduler), by PID: SIGTERM, then SIGKILL after 30 s."""
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for(condition, timeout: float = 90, what: str = "condition"):
    """``condition()``'s first true value, polled every 0.1 s for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# -- hpo submit and the launchers, called in this process -------------------------


@pytest.fixture
def no_user_site(monkeypatch, tmp_path):
    """No site profile of the machine's user leaks into the batch scripts."""
    monkeypatch.delenv("HPO_SITE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def hpo(monkeypatch, capsys, tmp_path):
    """Run ``hpo ARGS`` in this process from tmp_path; returns (status, stdout, stderr)."""
    import signal

    from hpo.cli import main

    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    monkeypatch.chdir(tmp_path)

    def call(*args):
        status = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err
    return call


@pytest.fixture
def space(tmp_path) -> Path:
    """A toy space file."""
    import json

    path = tmp_path / "toy.json"
    path.write_text(json.dumps(toy_space("toy")))
    return path
