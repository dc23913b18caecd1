"""Bad input that only a run can find, and objectives that misbehave.

The space files in ``tests/bad_spaces/`` are checked in ``test_cli.py``. The
ones in ``tests/bad_spaces/resources/`` are valid files asking for resources
that no worker can give; ``hpo validate`` cannot know the workers, so they are
refused by ``hpo run`` when the engine meets the machine or the cluster:
exit status 2, the JSON path and a fix, no traceback, and no trial started.

A study whose objective raises, returns NaN, infinity or a non-number, or
exceeds its time limit records each such trial as failed (or timed out) with
the reason, and the other trials run to the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import hpo
from hpo.trial import TrialStatus
from hpo.store.records import RUN_ATTR
from test_cli import ok, run
from test_e2e import stored_trials

RESOURCES = Path(__file__).resolve().parent / "bad_spaces" / "resources"
NO_GPUS = {"CUDA_VISIBLE_DEVICES": ""}  # a machine without GPUs, whatever runs the tests

# (file, JSON path, a word of the fix line, other required text): the embedded
# Dask cluster on this machine.
RESOURCE_CORPUS = [
    ("gpus_unavailable.json", "$.resources.gpus", '"gpus"', ["4 GPU(s)", "shows 0"]),
    ("cpus_unavailable.json", "$.resources.cpus", '"cpus"', ["4096 CPUs"]),
]
# (file, the request): what the running workers of an existing scheduler (CPU=1, no GPU) refuse.
WORKER_REFUSALS = [("gpus_unavailable.json", "GPU=4"), ("cpus_unavailable.json", "CPU=4096")]
_IDS = [row[0] for row in RESOURCE_CORPUS]


def test_resource_corpus_matches_the_tables():
    files = sorted(p.name for p in RESOURCES.glob("*.json"))
    assert files == sorted(_IDS) == sorted(row[0] for row in WORKER_REFUSALS)


def _refused(proc, file: str, path: str, fix: str, also: list[str]) -> str:
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    message = err[err.index("hpo: error:"):]
    assert f"hpo: error: {file}: {path}: " in message, message  # the place: file and JSON path
    fix_lines = [line for line in message.splitlines() if line.strip().startswith("fix:")]
    assert fix_lines and fix in fix_lines[0], message
    for text in also:
        assert text in message, message
    return message


@pytest.mark.parametrize(("file", "path", "fix", "also"), RESOURCE_CORPUS, ids=_IDS)
def test_embedded_cluster_refuses_what_this_machine_lacks(tmp_path, file, path, fix, also):
    rel = f"tests/bad_spaces/resources/{file}"
    ok(run("validate", rel, env_extra=NO_GPUS))  # a valid file: only the run meets the machine

    runs = tmp_path / "runs"
    proc = run("run", rel, "--runs-dir", runs, env_extra=NO_GPUS)  # the default engine: dask here
    _refused(proc, rel, path, fix, also)
    assert "engine dask" in proc.stderr
    assert not runs.exists() or not any(runs.iterdir()), "refused before anything was created"

    debug = run("run", rel, "--runs-dir", runs, "--debug", env_extra=NO_GPUS)
    assert debug.returncode == 2 and "EngineError" in debug.stderr
    assert "Traceback (most recent call last)" in debug.stderr


@pytest.mark.parametrize(("file", "need"), WORKER_REFUSALS, ids=_IDS)
def test_running_workers_refuse_what_none_of_them_has(dask_address, tmp_path, file, need):
    runs = tmp_path / "runs"
    rel = f"tests/bad_spaces/resources/{file}"
    proc = run("run", rel, "--engine", "dask", "--scheduler", dask_address, "--runs-dir", runs)
    message = _refused(proc, rel, "$.resources", "--resources", [f"needing {need}", "CPU=1"])
    assert "workers offer" in message
    # The study was opened before the workers could be asked; no trial was created.
    summary = json.loads(ok(run("status", runs / Path(file).stem, "--json")).stdout)
    assert summary["trials"] == 0 and not any(summary["counts"].values())


# ------------------------------------------------------------ misbehaving objectives

MODES = ["raise", "hang", "nan", "inf", "text", "ok-1", "ok-2", "ok-3"]
TIME_LIMIT_S = 20  # generous: every trial runs in a fresh process, on busy CI cores


def test_failing_objectives_are_recorded_and_the_study_goes_on(dask_address, tmp_path):
    def train(config, trial):  # shipped by value to the workers, as from a notebook
        mode = config["mode"]
        trial.report(0, value=0.5)
        if mode == "raise":
            raise ValueError(f"bad batch in trial {trial.number}")
        if mode == "hang":
            time.sleep(10 * TIME_LIMIT_S)
        if mode == "nan":
            return float("nan")
        if mode == "inf":
            return {"value": float("-inf")}
        if mode == "text":
            return "accuracy 0.9"
        return {"value": float(mode.removeprefix("ok-"))}

    space = {
        "name": "misbehaving", "metric": {"name": "value"},
        "search": {"algorithm": "grid", "parallel": 2},
        "resources": {"time_limit_s": TIME_LIMIT_S},
        "space": {"mode": MODES},
    }
    result = hpo.run(space, train, engine="dask", scheduler=dask_address, runs_dir=tmp_path,
                     progress=False)

    by_mode = {t.params["mode"]: t for t in result.trials}
    assert sorted(by_mode) == sorted(MODES)
    expected = {
        "raise": (TrialStatus.FAILED, "ValueError: bad batch in trial"),
        "hang": (TrialStatus.TIMEOUT, f"TimeLimit: exceeded time_limit_s={TIME_LIMIT_S}"),
        "nan": (TrialStatus.FAILED, "NonFiniteValue: objective returned nan"),
        "inf": (TrialStatus.FAILED, "NonFiniteValue: objective returned -inf"),
        "text": (TrialStatus.FAILED, "BadReturnValue: objective returned 'accuracy 0.9'"),
    }
    for mode, (state, reason) in expected.items():
        trial = by_mode[mode]
        assert trial.state is state and trial.value is None, (mode, trial)
        assert trial.error and trial.error.startswith(reason), (mode, trial.error)
    for n in (1, 2, 3):
        trial = by_mode[f"ok-{n}"]
        assert trial.state is TrialStatus.COMPLETE and trial.value == n and trial.error is None
    assert result.best.params == {"mode": "ok-3"}
    assert result.counts["COMPLETE"] == 3 and result.counts["FAILED"] == 4
    assert result.counts["TIMEOUT"] == 1

    # The store, read afresh, holds the same: every trial finished, each failure
    # with its reason, and the report made before it failed.
    stored = {t.params["mode"]: t for t in stored_trials(tmp_path / "misbehaving")}
    assert all(t.state.is_finished() for t in stored.values())
    assert all(t.intermediate_values == {0: 0.5} for t in stored.values())
    raised = stored["raise"].user_attrs[RUN_ATTR]["error"]
    assert raised["type"] == "ValueError" and "Traceback" in raised["traceback"]
    assert stored["hang"].user_attrs[RUN_ATTR]["timed_out"] is True
