"""The ``hpo`` command line, run as a user runs it: in a subprocess.

Bad space files (``tests/bad_spaces/``) must exit with status 2 and a one-line
``hpo: error:`` naming the file, the JSON path and a fix, with no traceback
unless ``--debug``. A small real study (toy objective, no ML) is run with the
inline engine and once with a real Dask LocalCluster, then inspected with
``hpo status`` and ``hpo export``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BAD = Path(__file__).resolve().parent / "bad_spaces"
_SCRIPT = Path(sys.executable).parent / "hpo"
HPO = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "hpo"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
TIMEOUT = 120


def run(*args: str | Path, cmd: list[str] = HPO,
        env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *map(str, args)], cwd=ROOT, env={**ENV, **(env_extra or {})},
                          capture_output=True, text=True, timeout=TIMEOUT)


def hpo_main(*args: str | Path) -> subprocess.CompletedProcess:
    return run(*args, cmd=[sys.executable, "hpo_main.py"])


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


# ------------------------------------------------------------ bad space files

# (file, what the message must name (the JSON path), a word of the fix line, other required text)
CORPUS = [
    ("invalid_json.json", "$", "syntax", ["invalid JSON", "line 3, column 16"]),
    ("top_not_object.json", "$", '"space"', ["JSON object", "an array"]),
    ("wrong_type.json", "$.search.max_trials", "integer", ["'ten'", "a string"]),
    ("empty_choices.json", "$.space.optimizer", "list", ["non-empty list"]),
    ("duplicate_choice.json", "$.space.optimizer[2]", "once", ["duplicate choice 'adam'"]),
    ("low_ge_high.json", "$.space.units", "smaller", ["low >= high", "low=64, high=16"]),
    ("log_low_nonpositive.json", "$.space.learning_rate.low", "positive", ["log scale", "low=0"]),
    ("typo_top_key.json", "$.serach", 'did you mean "search"', ["unknown key 'serach'"]),
    ("typo_param_key.json", "$.space.units.hgih", 'did you mean "high"', ["unknown key 'hgih'"]),
    ("unknown_algorithm.json", "$.search.algorithm", '"bayesian"', ["'genetic'"]),
    ("grid_float_no_num.json", "$.space.dropout", '"num"', ["continuous float range"]),
    ("random_no_budget.json", "$.search.max_trials", '"max_trials"', ["random search", "budget"]),
    ("fixed_collides.json", "$.fixed.x", "remove", ["both fixed and a parameter"]),
    ("objective_not_importable.json", "$.objective", "PYTHONPATH", ["no_such_pkg"]),
    ("objective_not_callable.json", "$.objective", "function", ["no callable 'time'"]),
    ("bool_as_number.json", "$.space.units.low", "integer", ["a boolean"]),
    ("negative_cpus.json", "$.resources.cpus", ">= 1", ["-2"]),
    ("unknown_param_type.json", "$.space.lr.type", '"float"', ["'double'"]),
    ("nan_in_json.json", "$.space.dropout.low", "number", ["got nan"]),
    ("int_beyond_float_precision.json", "$.space.seed_offset.high", "9007199254740992",
     ["beyond 2**53"]),
]
# Resources that no worker can satisfy are valid files, refused only when the
# engine meets the machine: tests/bad_spaces/resources/, see test_bad_input.py.


def test_corpus_matches_the_table():
    assert sorted(p.name for p in BAD.glob("*.json")) == sorted(row[0] for row in CORPUS)


def _check_usage_error(proc: subprocess.CompletedProcess, file: str, path: str, fix: str,
                       also: list[str]) -> None:
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    assert "hpo: error:" in err, err
    message = err[err.index("hpo: error:"):]
    assert f"tests/bad_spaces/{file}: {path}: " in message, message
    fix_lines = [line for line in message.splitlines() if line.strip().startswith("fix:")]
    assert fix_lines and fix in fix_lines[0], message
    for text in also:
        assert text in message, message


@pytest.mark.parametrize(("file", "path", "fix", "also"), CORPUS, ids=[row[0] for row in CORPUS])
def test_bad_space_is_a_usage_error(tmp_path, file, path, fix, also):
    rel = f"tests/bad_spaces/{file}"
    _check_usage_error(run("validate", rel), file, path, fix, also)

    runs = tmp_path / "runs"
    _check_usage_error(run("run", rel, "--engine", "inline", "--runs-dir", runs), file, path, fix, also)
    assert not runs.exists() or not any(runs.iterdir()), "rejected before any task starts"

    debug = run("validate", rel, "--debug")
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr
    assert "SpaceError" in debug.stderr and "hpo: error:" in debug.stderr


def test_run_debug_shows_traceback(tmp_path):
    proc = run("run", "tests/bad_spaces/typo_top_key.json", "--engine", "inline",
               "--runs-dir", tmp_path / "runs", "--debug")
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr and "hpo: error:" in proc.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------ validate


def test_validate_mnist_grid(tmp_path):
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(b"")  # found, not read: validate only checks it is there
    out = ok(run("validate", "search_spaces/mnist_grid.json",
                 env_extra={"HPO_MNIST_PATH": str(tmp_path)})).stdout
    assert "grid size   27" in out
    assert "max_trials 27" in out
    for name in ("optimizer", "num_epochs", "batch_size"):
        assert f"  {name}  " in out


def test_validate_huge_grid_is_lazy(tmp_path):
    space = tmp_path / "huge.json"
    space.write_text(json.dumps({
        "objective": "hpo.examples.toy:quadratic",
        "space": {f"p{i}": {"type": "int", "low": 0, "high": 9} for i in range(9)},
    }))
    out = ok(run("validate", space)).stdout  # an eager grid would exhaust memory or time out
    assert "grid size   1,000,000,000" in out
    assert all(f"p{i}  int [0, 9]" in out for i in range(9))


# ------------------------------------------------------------ a real study

QUAD = {
    "name": "quad",
    "objective": "hpo.examples.toy:quadratic",
    "metric": {"name": "value"},
    "search": {"algorithm": "grid"},
    "space": {"x": [0, 1, 2, 3], "y": [-1, 0]},
}


def _first_row(table: str) -> dict[str, str]:
    lines = table.strip().splitlines()
    assert set(lines[1].replace(" ", "")) == {"-"}, table
    return dict(zip(lines[0].split(), lines[2].split()))


def _status(run_dir: Path) -> dict:
    return json.loads(ok(run("status", run_dir, "--json")).stdout)


@pytest.fixture(scope="module")
def quad(tmp_path_factory):
    """The 8-trial grid study, run once with ``python hpo_main.py`` and the inline engine."""
    tmp = tmp_path_factory.mktemp("quad")
    space = tmp / "quad.json"
    space.write_text(json.dumps(QUAD))
    args = (space, "--engine", "inline", "--runs-dir", tmp / "runs", "--quiet")
    proc = ok(hpo_main(*args))
    return {"space": space, "args": args, "run_dir": tmp / "runs" / "quad", "proc": proc}


def test_study_summary(quad):
    out = quad["proc"].stdout
    row = _first_row(out)
    assert (row["rank"], row["state"], row["x"], row["y"]) == ("1", "COMPLETE", "2", "-1")
    assert "8 trials: 8 complete" in out
    assert 'config {"x": 2, "y": -1}' in out
    assert f"hpo status {quad['run_dir']}" in out
    assert "engine inline" in quad["proc"].stderr


def test_status_json(quad):
    summary = _status(quad["run_dir"])
    assert summary["study"] == "quad" and summary["metric"] == "value"
    assert summary["trials"] == 8
    assert summary["counts"]["COMPLETE"] == 8
    assert sum(summary["counts"].values()) == 8
    assert summary["best"]["params"] == {"x": 2, "y": -1}
    assert summary["best"]["value"] == pytest.approx(0.0)


def test_status_human_and_python_m(quad):
    out = ok(run("status", quad["run_dir"])).stdout
    assert _first_row(out)["x"] == "2" and _first_row(out)["y"] == "-1"
    assert "8 trials: 8 complete" in out and 'config {"x": 2, "y": -1}' in out
    assert "cost: " in out and "core-" in out
    assert ok(run("status", quad["run_dir"], cmd=[sys.executable, "-m", "hpo"])).stdout == out


def test_export_csv(quad):
    rows = list(csv.reader(io.StringIO(ok(run("export", quad["run_dir"], "--format", "csv")).stdout)))
    header, data = rows[0], rows[1:]
    assert header[:3] == ["number", "state", "value"]
    assert {"params.x", "params.y", "metrics.value", "host", "duration_s"} <= set(header)
    assert len(data) == 8
    assert {r[1] for r in data} == {"COMPLETE"}
    best = dict(zip(header, data[0]))  # best first
    assert (best["params.x"], best["params.y"]) == ("2", "-1")
    assert sorted(int(r[0]) for r in data) == list(range(8))


def test_export_csv_columns_are_unique(quad):
    header = ok(run("export", quad["run_dir"], "--format", "csv")).stdout.splitlines()[0].split(",")
    assert len(header) == len(set(header)), header


def test_export_json_to_file(quad, tmp_path):
    out = tmp_path / "trials.json"
    proc = ok(run("export", quad["run_dir"], "--format", "json", "-o", out))
    assert proc.stdout == ""
    data = json.loads(out.read_text())
    assert len(data["trials"]) == 8
    assert data["trials"][0]["params"] == {"x": 2, "y": -1}
    assert {t["state"] for t in data["trials"]} == {"COMPLETE"}
    assert {(t["params"]["x"], t["params"]["y"]) for t in data["trials"]} == \
        {(x, y) for x in range(4) for y in (-1, 0)}


def test_same_command_resumes(quad):
    # Runs after the read-only checks above (pytest keeps file order).
    proc = ok(hpo_main(*quad["args"]))
    assert "8 trials: 8 complete" in proc.stdout
    assert _first_row(proc.stdout)["x"] == "2"
    summary = _status(quad["run_dir"])
    assert summary["trials"] == 8 and summary["counts"]["COMPLETE"] == 8


def test_dask_engine(tmp_path):
    space = tmp_path / "quad.json"
    space.write_text(json.dumps(QUAD))
    proc = ok(run("run", space, "--engine", "dask", "--workers", "2", "--runs-dir", tmp_path / "runs",
                  "--quiet"))
    assert "engine dask" in proc.stderr
    row = _first_row(proc.stdout)
    assert (row["x"], row["y"]) == ("2", "-1")
    summary = _status(tmp_path / "runs" / "quad")
    assert summary["counts"]["COMPLETE"] == 8 and summary["trials"] == 8
    assert summary["best"]["params"] == {"x": 2, "y": -1}


# ------------------------------------------------------------ status errors


def test_status_of_a_directory_that_is_no_run_dir(tmp_path):
    (tmp_path / "something.txt").write_text("hi")
    for target, problem in ((tmp_path, "not a run directory"), (tmp_path / "missing", "no such directory")):
        proc = run("status", target)
        assert proc.returncode == 2, proc.stderr
        assert "hpo: error:" in proc.stderr and "Traceback" not in proc.stderr
        assert str(target) in proc.stderr
        assert problem in proc.stderr and "fix:" in proc.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "something.txt"]


# ------------------------------------------------------------ failing objectives


def test_failing_trial_does_not_crash_the_study(tmp_path):
    space = tmp_path / "failing.json"
    space.write_text(json.dumps({
        "name": "failing", "objective": "hpo.examples.toy:fail", "metric": {"name": "value"},
        "space": {"fail": [True, False]},
    }))
    proc = ok(run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs", "--quiet"))
    assert "2 trials: 1 complete, 1 failed" in proc.stdout
    run_dir = tmp_path / "runs" / "failing"
    summary = _status(run_dir)
    assert summary["counts"]["FAILED"] == 1 and summary["counts"]["COMPLETE"] == 1
    assert summary["best"]["params"] == {"fail": False}
    trials = json.loads(ok(run("export", run_dir, "--format", "json")).stdout)["trials"]
    failed = [t for t in trials if t["state"] == "FAILED"]
    assert len(failed) == 1 and failed[0]["params"] == {"fail": True}
    assert "boom" in failed[0]["error"] and "RuntimeError" in failed[0]["error"]


def test_study_where_every_trial_fails_exits_1_with_the_reason(tmp_path):
    space = tmp_path / "failing.json"
    space.write_text(json.dumps({"name": "allfail", "objective": "hpo.examples.toy:fail",
                                 "metric": {"name": "value"}, "space": {"fail": [True]},
}))
    proc = run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs", "--quiet")
    assert proc.returncode == 1, proc.stderr
    assert "1 failed" in proc.stdout and "first failure: trial 0: RuntimeError" in proc.stdout
    assert f"hpo status {tmp_path / 'runs' / 'allfail'} --trial 0" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# A study started at the top level of the objective's module, no main guard:
# every process that imports the module would start it again. The depth
# bounds the test should hpo not refuse it.
LOOPING = """
import os, sys
import hpo

def objective(config, trial):
    return {"value": float(config["x"])}

_depth = int(os.environ.get("LOOPING_DEPTH", "0"))
os.environ["LOOPING_DEPTH"] = str(_depth + 1)
_main = getattr(sys.modules["__main__"], "__spec__", None)
_in_trial = _main is not None and _main.name == "hpo.trial._child"
if _depth < 3 and (_in_trial or not os.environ.get("LOOPING_ONLY_IN_TRIALS")):
    hpo.run(os.environ["LOOPING_SPACE"], engine="inline", runs_dir=os.environ["LOOPING_RUNS"],
            progress=False)
"""


def _looping_study(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "looping.py").write_text(LOOPING)
    space = tmp_path / "looping.json"
    space.write_text(json.dumps({"name": "looping", "objective": "looping:objective",
                                 "metric": {"name": "value"}, "space": {"x": [0, 1]},
                                 "resources": {"time_limit_s": 60}}))
    runs = tmp_path / "runs"
    proc = run("run", space, "--engine", "inline", "--runs-dir", runs, "--quiet",
               env_extra={"LOOPING_SPACE": str(space), "LOOPING_RUNS": str(runs / "inner"), **env})
    return proc, runs


def test_a_study_started_at_the_objectives_top_level_is_refused_with_the_fix(tmp_path):
    proc, runs = _looping_study(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "the top level of the objective's module 'looping'" in proc.stderr
    assert 'put that code under `if __name__ == "__main__":`' in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not runs.exists()  # refused before anything was recorded


def test_a_trials_process_never_starts_the_study_its_module_starts_at_import(tmp_path):
    """The module starts the study only where a trial's process imports it
    (a warm process, or the trial forked from it): each trial fails, saying
    what to change, and no process starts another."""
    proc, runs = _looping_study(tmp_path, LOOPING_ONLY_IN_TRIALS="1")
    assert proc.returncode != 0, proc.stdout
    assert not (runs / "inner").exists()  # the study inside a trial never started
    trials = json.loads(ok(run("export", runs / "looping", "--format", "json")).stdout)["trials"]
    assert [t["state"] for t in trials] and {t["state"] for t in trials} == {"FAILED"}
    for trial in trials:
        assert "StartedAtImport" in trial["error"] and "if __name__" in trial["error"]


def test_missing_data_stops_the_study_once_before_any_trial(tmp_path):
    """The original study's own space without its data: one error, exit 2, nothing recorded."""
    space = tmp_path / "mnist.json"
    space.write_text('{"name": "nodata", "space": {"optimizer": ["Adam"], "batch_size": [32, 64]}}')
    proc = run("run", space, "--runs-dir", tmp_path / "runs",
               env_extra={"HPO_MNIST_PATH": str(tmp_path / "absent")})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("MNIST-format data not found") == 1
    assert "hpo: error:" in proc.stderr and "HPO_MNIST_PATH" in proc.stderr
    assert "dataset-fashion-mnist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = run("validate", space, env_extra={"HPO_MNIST_PATH": str(tmp_path / "absent")})
    assert proc.returncode == 2 and "MNIST-format data not found" in proc.stderr
