"""Bad input that only a run can find, and objectives that misbehave.

The space files in ``tests/bad_spaces/`` are checked in ``test_cli.py``. The
ones in ``tests/bad_spaces/resources/`` are valid files asking for resources
that no worker can give; ``hpo validate`` cannot know the workers, so they are
refused by ``hpo run`` when the engine meets the machine or the cluster:
exit status 2, the JSON path and a fix, no traceback, and no trial started.

A study whose objective raises, returns NaN, infinity or a non-number, or
exceeds its time limit records each such trial as failed (or timed out) with
the reason, and the other trials run to the end.

Input at the limits (huge grids, deep nesting, devices as files, damaged run
directories, closed pipes, nonsense flags) is refused the same way: exit
status 2 and a message naming the place and the fix, nothing created.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_cli import ENV, HPO, ROOT, ok, run
from test_e2e import stored_trials

import hpo
from hpo.errors import SpaceError
from hpo.store import RunDir
from hpo.store.records import RUN_ATTR
from hpo.trial import TrialStatus

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
    # The workers were asked before anything was recorded: no run directory.
    assert not (runs / Path(file).stem).exists()


def test_the_inline_engine_refuses_a_gpu_shape_of_parameters_this_machine_lacks(tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps({
        "name": "shaped", "objective": "hpo.examples.toy:quadratic", "metric": {"name": "value"},
        "resources": {"gpus": "g"}, "space": {"g": [0.5, 2], "x": [0, 1]}}))
    runs = tmp_path / "runs"
    proc = run("run", space, "--engine", "inline", "--runs-dir", runs,
               env_extra={"CUDA_VISIBLE_DEVICES": "0"})  # one GPU: the largest trial asks for 2
    _refused(proc, str(space), "$.resources.gpus", '"gpus"', ["2 GPU(s)", "shows 1"])
    assert not runs.exists() or not any(runs.iterdir()), "refused before anything was created"


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
    raised = stored["raise"].system_attrs[RUN_ATTR]["error"]
    assert raised["type"] == "ValueError" and "Traceback" in raised["traceback"]
    assert stored["hang"].system_attrs[RUN_ATTR]["timed_out"] is True


# ------------------------------------------------------------ input at the limits

QUAD = {"objective": "hpo.examples.toy:quadratic", "metric": {"name": "value"}}


def _space_file(tmp_path: Path, data: dict, name: str = "space.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _usage_error(proc) -> str:
    """The ``hpo: error:`` message of an exit-2 refusal without traceback."""
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    return err[err.index("error:"):]


def _limited(*args: str | Path, timeout: float = 30) -> subprocess.CompletedProcess:
    """``hpo`` with 2 GiB of address space: a runaway read fails instead of eating the machine."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    return subprocess.run([*HPO, *map(str, args)], cwd=ROOT, env=ENV, preexec_fn=limit,
                          timeout=timeout, capture_output=True, text=True)


@pytest.mark.parametrize("algorithm", ["grid", "random"])
def test_a_product_of_categoricals_beyond_sys_maxsize_is_searched(tmp_path, algorithm):
    space = _space_file(tmp_path, {**QUAD, "space": {f"p{i:02d}": list(range(10)) for i in range(20)}})
    assert "grid size   100,000,000,000,000,000,000" in ok(run("validate", space)).stdout
    runs = tmp_path / "runs"
    proc = ok(run("run", space, "--algorithm", algorithm, "--max-trials", "3", "--engine", "inline",
                  "--runs-dir", runs, "--quiet"))
    assert "3 trials: 3 complete" in proc.stdout


@pytest.mark.parametrize(("param", "key"), [
    ({"type": "float", "low": 0, "high": 1, "step": 1e-300}, "step"),
    ({"type": "float", "low": -1e308, "high": 1e308, "step": 1}, "step"),  # high - low overflows
    ({"type": "float", "low": 0, "high": 1, "num": 10**30}, "num"),
], ids=["tiny-step", "overflowing-range", "huge-num"])
def test_float_grid_of_too_many_points_is_a_space_error(tmp_path, param, key):
    space = _space_file(tmp_path, {**QUAD, "space": {"x": param}})
    message = _refused(run("validate", space), str(space), f"$.space.x.{key}", f'"{key}"', ["2**53"])
    assert "no longer distinct" in message


def test_json_nested_too_deep_is_a_space_error(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _refused(run("validate", deep), str(deep), "$", "nesting", ["nested too deeply"])

    # Deep enough for the parser, too deep for a space: refused at its place.
    value: object = 1
    for _ in range(150):
        value = {"a": value}
    with pytest.raises(SpaceError, match=r"\$\.fixed\.a\.a\.a.*: nested more than 100 levels"):
        hpo.space.parse_spec({"fixed": {"a": value}, "space": {"x": [1, 2]}})


@pytest.mark.parametrize(("source", "error"), [
    ("def train(config, trial:\n    return 1\n", "SyntaxError: '(' was never closed"),
    ("import os\nDATA = os.environ['HPO_NO_SUCH_VARIABLE']\n", "KeyError: 'HPO_NO_SUCH_VARIABLE'"),
    ("import sys\nsys.exit('usage: train.py DATA')\n", "SystemExit: usage: train.py DATA"),
], ids=["syntax-error", "raises", "exits"])
def test_objective_module_failing_at_import_is_a_usage_error(tmp_path, source, error):
    module = tmp_path / "broken_objective.py"
    module.write_text(source)
    space = _space_file(tmp_path, {**QUAD, "objective": "broken_objective:train", "space": {"x": [1]}})
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), ENV.get("PYTHONPATH", str(ROOT))])}
    runs = tmp_path / "runs"
    for args in (["validate", space], ["run", space, "--engine", "inline", "--runs-dir", runs]):
        message = _refused(run(*args, env_extra=env), str(space), "$.objective", "broken_objective",
                           ["'broken_objective'", error])
        if error.startswith("SyntaxError"):
            assert f"{module}, line 1" in message  # the file, in full
    assert not runs.exists()


@pytest.mark.parametrize("seed", [2**32, -1])
def test_seed_beyond_32_bits_is_a_space_error(tmp_path, seed):
    space = _space_file(tmp_path, {**QUAD, "search": {"seed": seed}, "space": {"x": [1, 2]}})
    also = ["from 0 to 4294967295", f"got {seed}"]
    _refused(run("validate", space), str(space), "$.search.seed", "4294967295", also)
    ok_space = _space_file(tmp_path, {**QUAD, "space": {"x": [1, 2]}}, "ok.json")
    proc = run("run", ok_space, "--seed", str(seed), "--engine", "inline", "--runs-dir", tmp_path / "r")
    _refused(proc, str(ok_space), "$.search.seed", "4294967295", also)
    assert not (tmp_path / "r").exists()


def test_device_fifo_directory_or_huge_file_as_space_fails_fast(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    huge = tmp_path / "huge.json"
    huge.write_text(" " * (17 * 2**20) + "{}")
    cases = [("/dev/zero", "a device, pipe or socket"), (fifo, "a device, pipe or socket"),
             (tmp_path, "a directory"), (huge, "larger than 16 MB")]
    for path, problem in cases:
        message = _refused(_limited("validate", path), str(path), "$", "fix:", [problem])
        assert "not a regular file" in message or "larger" in message


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """The run directory of a small finished study (12 trials)."""
    tmp = tmp_path_factory.mktemp("finished")
    space = _space_file(tmp, {**QUAD, "name": "quad", "space": {"x": [0, 1, 2, 3], "y": [-1, 0, 1]}})
    ok(run("run", space, "--engine", "inline", "--runs-dir", tmp / "runs", "--quiet"))
    return tmp / "runs" / "quad"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy of the finished run directory, free to damage."""
    return Path(shutil.copytree(finished_run, tmp_path / "quad"))


def test_export_to_a_missing_directory_is_a_usage_error(run_copy, tmp_path):
    target = tmp_path / "missing" / "trials.csv"
    message = _usage_error(run("export", run_copy, "-o", target))
    assert str(target) in message and "fix:" in message and "existing directory" in message
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(("content", "problem"), [
    ("{not json", "cannot be read as JSON"),
    ('{"storage": "journal.log"}', "not a study record"),
    ('{"spec": {"name": "quad"}, "storage": "journal.log"}', "not a study record"),
    ("[1, 2]", "not a study record"),
], ids=["not-json", "no-spec", "spec-without-metric", "not-an-object"])
def test_damaged_study_json_is_a_usage_error(run_copy, content, problem):
    study_file = run_copy / "study.json"
    study_file.write_text(content)
    before = sorted(run_copy.rglob("*"))
    for command in ("status", "export"):
        message = _usage_error(run(command, run_copy))
        assert f"error: {study_file}: {problem}" in message and "fix:" in message, message
    assert sorted(run_copy.rglob("*")) == before and study_file.read_text() == content


def test_a_run_directory_named_by_a_string_opens_as_by_a_path(run_copy):
    by_string, by_path = RunDir(str(run_copy)), RunDir(run_copy)
    assert by_string == by_path and by_string.study_file == run_copy / "study.json"
    assert len(by_string.open_store(read_only=True).trials()) == len(stored_trials(run_copy))


def test_status_after_the_journal_was_deleted_creates_nothing(run_copy):
    (run_copy / "journal.log").unlink()
    before = sorted(run_copy.rglob("*"))
    for command in ("status", "export"):
        message = _usage_error(run(command, run_copy))
        assert "journal.log is missing" in message and "fix:" in message, message
    assert sorted(run_copy.rglob("*")) == before, "no empty journal created"


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["export"]])
def test_reader_gone_exits_quietly_with_sigpipe_status(run_copy, command):
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` once head has exited
    try:
        proc = subprocess.run([*HPO, *command, str(run_copy)], cwd=ROOT, env=ENV, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


def test_status_of_a_study_renamed_in_study_json_names_the_stored_one(run_copy):
    study_file = run_copy / "study.json"
    record = json.loads(study_file.read_text())
    record["spec"]["name"] = "renamed"
    study_file.write_text(json.dumps(record))
    for command in ("status", "export"):
        message = _usage_error(run(command, run_copy))
        assert "no study named 'renamed', only 'quad'" in message, message
        assert f"fix: put the name back in {study_file}" in message, message


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--workers", "0", "an integer >= 1"),
    ("--workers", "-3", "an integer >= 1"),
    ("--parallel", "0", "an integer >= 1"),
    ("--max-trials", "-1", "an integer >= 1"),
    ("--max-trials", "ten", "an integer >= 1"),
    ("--timeout-s", "0", "a number > 0"),
    ("--timeout-s", "nan", "a number > 0"),
])
def test_counts_and_durations_on_the_command_line_must_be_positive(tmp_path, flag, value, expected):
    space = _space_file(tmp_path, {**QUAD, "space": {"x": [1, 2]}})
    runs = tmp_path / "runs"
    proc = run("run", space, flag, value, "--engine", "inline", "--runs-dir", runs, "--quiet")
    message = _usage_error(proc)
    assert f"argument {flag}: expected {expected}, got '{value}'" in message, message
    assert not runs.exists()


def test_large_categorical_is_checked_in_linear_time(tmp_path):
    # Quadratic duplicate detection would take an hour here; linear takes a second.
    choices = list(range(200_000))
    space = _space_file(tmp_path, {**QUAD, "space": {"x": choices}})
    assert "grid size   200,000" in ok(run("validate", space)).stdout

    # Duplicates are still refused at their place (True == 1, as for Optuna).
    with pytest.raises(SpaceError, match=r"\$\.x\[200000\]: duplicate choice True "
                                         r"\(equal to 1 at \[1\]\)"):
        hpo.space.parse_spec({"x": [*choices, True]})
