"""What a new user meets in the first week (issue 28, part 2): their own
objective module, a metric name it never returns, Ctrl-C in a terminal and
through ``| tee``, trials without checkpoints, ``hpo check-resume`` on a
conditional space, and the small things ``hpo status`` and ``hpo export`` say.

Commands run as a user runs them, in subprocesses; a Ctrl-C is a SIGINT to
the process group, as a terminal sends it. Every wait is for a condition.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path

import pytest

import hpo
from conftest import served_study, toy_space, wait_for
from hpo.engines import WallClock
from test_cli import ENV, HPO, ok

TIMEOUT = 180


def _hpo(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HPO, *map(str, args)], cwd=cwd, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT)


def _write_space(path: Path, name: str, objective: str, **extra) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(toy_space(name, objective, **extra)))
    return path


def _states(run_dir: Path) -> dict[int, str]:
    return {t.number: t.state.value for t in hpo.StudyResult.load(run_dir).trials}


def _running(run_dir: Path) -> int:
    try:
        return list(_states(run_dir).values()).count("RUNNING")
    except (hpo.UsageError, KeyError, ValueError):
        return 0  # not created yet


# ------------------------------------------------------------ 1: a module beside the space file


def test_a_module_beside_the_space_file_or_in_the_current_directory_imports(tmp_path):
    project, work = tmp_path / "project", tmp_path / "work"
    work.mkdir()
    (work / "helper_in_cwd.py").write_text("BONUS = 0.5\n")
    project.mkdir()
    (project / "beside.py").write_text(
        "def train(config, trial):\n"
        "    import helper_in_cwd  # from the current directory, on the worker\n"
        "    return {'value': config['x'] + helper_in_cwd.BONUS}\n")
    space = _write_space(project / "space.json", "beside", "beside:train",
                         space={"x": [1, 2]}, resources={"time_limit_s": 120})
    ok(_hpo("validate", space, cwd=work))
    # On Dask workers, each trial in a process of its own (time_limit_s).
    ok(_hpo("run", space, "--engine", "dask", "--workers", "2", "--quiet", cwd=work))
    result = hpo.StudyResult.load(work / "runs" / "beside")
    assert sorted(t.value for t in result.trials) == [1.5, 2.5]


def test_submit_puts_the_same_folders_on_the_jobs_path(tmp_path, monkeypatch):
    from hpo.launchers.commands import job_pythonpath
    from hpo.trial import objective_path

    space = _write_space(tmp_path / "spaces" / "s.json", "s", "m:train")
    monkeypatch.chdir(tmp_path)
    assert job_pythonpath(space) == objective_path(space) == [str(space.parent), str(tmp_path)]


# ------------------------------------------------------------ 2: the first trials all fail alike


_WRONG_METRIC = ("def train(config, trial):\n"
                 "    trial.report(0, acc=0.5)\n"
                 "    return {'acc': 0.9 + config['x'] / 100}\n")


def test_a_metric_the_objective_never_returns_stops_the_study_saying_what_to_change(tmp_path):
    (tmp_path / "wrong_metric.py").write_text(_WRONG_METRIC)
    space = _write_space(tmp_path / "space.json", "wrong", "wrong_metric:train",
                         metric={"name": "val_accuracy"}, space={"x": list(range(20))},
                         search={"parallel": 1})
    proc = _hpo("run", space, "--engine", "inline", "--quiet", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    message = proc.stderr
    assert "the first 3 trials" in message and "BadReturnValue" in message
    assert "'val_accuracy'" in message and "acc" in message and "fix:" in message
    assert "rm -r runs/wrong" in message
    counts = hpo.StudyResult.load(tmp_path / "runs" / "wrong").counts
    assert counts["FAILED"] in (3, 4) and counts["COMPLETE"] == 0  # not 20 (one may be queued)


def test_the_same_exception_everywhere_stops_a_parallel_study_after_a_wave_and_one(tmp_path):
    (tmp_path / "raises.py").write_text(
        "def train(config, trial):\n"
        "    raise KeyError('learning_rate')\n")
    space = _write_space(tmp_path / "space.json", "raises", "raises:train",
                         space={"x": list(range(30))}, search={"parallel": 3})
    proc = _hpo("run", space, "--engine", "dask", "--workers", "3", "--quiet", cwd=tmp_path)
    assert proc.returncode == 2 and "the first 4 trials" in proc.stderr, proc.stderr
    assert "KeyError: 'learning_rate'" in proc.stderr
    assert sum(hpo.StudyResult.load(tmp_path / "runs" / "raises").counts.values()) < 30


def test_a_study_where_some_trials_succeed_is_never_stopped(tmp_path):
    (tmp_path / "mostly.py").write_text(
        "def train(config, trial):\n"
        "    if config['x'] != 2:\n"
        "        raise ValueError(f'no luck with x={config[\"x\"]}')\n"
        "    return {'value': 1.0}\n")
    space = _write_space(tmp_path / "space.json", "mostly", "mostly:train",
                         space={"x": list(range(8))}, search={"parallel": 1})
    proc = _hpo("run", space, "--engine", "inline", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert hpo.StudyResult.load(tmp_path / "runs" / "mostly").counts["FAILED"] == 7


# ------------------------------------------------------------ 3, 4: Ctrl-C


@pytest.fixture
def foreground():
    """Start commands as a terminal's foreground job: a session of their own,
    SIGINT as it is by default (a background suite may have it ignored), a
    3600 s stop grace (a wait for it would time the test out). What is left
    of them when the test ends is killed, by process group."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], cwd: Path, stderr: Path) -> subprocess.Popen:
        proc = subprocess.Popen(command, cwd=cwd, env={**ENV, "HPO_STOP_GRACE_S": "3600"},
                                stdout=subprocess.DEVNULL, stderr=stderr.open("w"), text=True,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # the whole foreground group, workers included


def _ctrl_c_study(tmp_path: Path, objective: str, sleep_s: float = 600) -> tuple[Path, list[str]]:
    space = _write_space(tmp_path / "space.json", "ctrlc", objective, fixed={"sleep_s": sleep_s},
                         space={"x": list(range(6))})
    command = [*HPO, "run", str(space), "--engine", "dask", "--workers", "2"]
    return tmp_path / "runs" / "ctrlc", command


def test_ctrl_c_prints_no_tracebacks_and_running_trials_suspend(tmp_path, foreground):
    run_dir, command = _ctrl_c_study(tmp_path, "hpo.examples.toy:slow")
    stderr = tmp_path / "stderr.txt"
    proc = foreground(command, tmp_path, stderr)
    wait_for(lambda: _running(run_dir) == 2 or proc.poll() is not None, what="two running trials")
    _ctrl_c(proc)
    assert proc.wait(timeout=120) == 130
    said = stderr.read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert "Ctrl-C again exits at once" in said
    assert "saved no checkpoint" in said  # toy:slow saves none: the next run starts them afresh
    states = _states(run_dir)
    # The two running trials suspend; a queued one a freed worker started just
    # as the stop came is suspended too, the others are handed back unstarted.
    assert list(states.values()).count("SUSPENDED") >= 2
    assert set(states.values()) <= {"SUSPENDED", "PENDING"}


def test_a_second_ctrl_c_exits_at_once_and_hands_the_trials_back(tmp_path, foreground):
    # toy:sleep never asks should_stop(): only a second Ctrl-C ends the wait.
    run_dir, command = _ctrl_c_study(tmp_path, "hpo.examples.toy:sleep")
    stderr = tmp_path / "stderr.txt"
    proc = foreground(command, tmp_path, stderr)
    wait_for(lambda: _running(run_dir) == 2 or proc.poll() is not None, what="two running trials")
    _ctrl_c(proc)
    wait_for(lambda: "Ctrl-C again" in stderr.read_text() or proc.poll() is not None,
             what="the stop's one line")
    _ctrl_c(proc)
    assert proc.wait(timeout=120) == 130
    said = stderr.read_text()
    assert "Traceback" not in said, said
    assert "run the same command again to resume" in said
    states = _states(run_dir)
    assert "FAILED" not in states.values() and list(states.values()).count("RUNNING") == 2


class _SilentEngine:
    """An engine whose tasks never end: what the master sees of a dead worker's."""

    clock = WallClock()


def test_a_stop_does_not_wait_for_a_trial_whose_process_is_gone(tmp_path, monkeypatch):
    from hpo import master
    from hpo.store.records import start_run

    monkeypatch.setenv("HPO_STOP_GRACE_S", "3600")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with served_study(tmp_path / "journal.log", "gone") as study:
        trial_id, number = study.new_trial()
        run = start_run({}, {"host": socket.gethostname(), "pid": gone.pid}, 0.0, 0.0)
        study.store.write_run(trial_id, run)
        task = study.task(trial_id, number, config={}, objective="hpo.examples.toy:sleep",
                          metric="value", checkpoint_dir=str(tmp_path / "ckpt"))
        never_over: Future = Future()
        flights = {number: master.InFlight(task, never_over, submitted_at=time.time())}
        engine = _SilentEngine()
        stop = threading.Thread(target=master.suspend_running,
                                args=(study.store, engine, flights, "SIGINT", study.relay.settle),
                                daemon=True)
        stop.start()
        wait_for(lambda: not stop.is_alive(), what="the stop, without the 3600 s grace")
        assert flights == {} and never_over.cancelled()
        trial = study.store.trial(trial_id)
        assert hpo.StudyResult.from_store(study.store, "value").trials[0].state.value == "RUNNING"
        assert "abandoned_at" in trial.system_attrs["hpo:heartbeat"]  # resumed at once next time


_PRINTER = ("import time\n"
            "def train(config, trial):\n"
            "    for step in range(100000):\n"
            "        print(f'step {step} of trial {trial.number}', flush=True)\n"
            "        trial.report(step, value=float(step))\n"
            "        if trial.should_stop():\n"
            "            break\n"
            "        time.sleep(0.05)\n"
            "        if step >= config['steps']:\n"
            "            break\n"
            "    return {'value': float(config['x'])}\n")


def test_ctrl_c_with_the_output_piped_to_tee_fails_no_trial_and_the_resume_runs_them(tmp_path, foreground):
    (tmp_path / "printer.py").write_text(_PRINTER)
    space = _write_space(tmp_path / "space.json", "tee", "printer:train", fixed={"steps": 100000},
                         space={"x": list(range(4))})
    log = tmp_path / "run.log"
    stderr = tmp_path / "stderr.txt"
    proc = foreground(["bash", "-c", f"{' '.join(HPO)} run space.json --engine dask --workers 2 "
                   f"| tee {log} > /dev/null"], tmp_path, stderr)
    wait_for(lambda: (log.exists() and "step 3 of" in log.read_text()) or proc.poll() is not None,
             what="trials printing through tee")
    _ctrl_c(proc)  # tee ends with it: the trials' prints meet a closed pipe
    proc.wait(timeout=120)
    run_dir = tmp_path / "runs" / "tee"
    states = _states(run_dir)
    assert "FAILED" not in states.values(), stderr.read_text()
    space.write_text(json.dumps(toy_space("tee", "printer:train", fixed={"steps": 2},
                                          space={"x": list(range(4))})))
    ok(_hpo("run", space, "--engine", "dask", "--workers", "2", "--quiet", "--allow-changes",
            cwd=tmp_path))
    assert set(_states(run_dir).values()) == {"COMPLETE"}


def test_a_trial_that_fails_while_the_study_stops_is_resumed_not_failed(tmp_path, foreground):
    (tmp_path / "breaks.py").write_text(
        "import time\n"
        "def train(config, trial):\n"
        "    for step in range(100000):\n"
        "        trial.report(step, value=float(step))\n"
        "        if config['break'] and trial.should_stop():  # a helper's pipe closed by Ctrl-C\n"
        "            raise BrokenPipeError(32, 'Broken pipe')\n"
        "        if step >= config['steps']:\n"
        "            return {'value': float(config['x'])}\n"
        "        time.sleep(0.05)\n")
    space = _write_space(tmp_path / "space.json", "breaks", "breaks:train",
                         fixed={"steps": 100000, "break": True}, space={"x": list(range(4))})
    stderr = tmp_path / "stderr.txt"
    proc = foreground([*HPO, "run", str(space), "--engine", "dask", "--workers", "2"], tmp_path, stderr)
    run_dir = tmp_path / "runs" / "breaks"
    wait_for(lambda: _running(run_dir) == 2 or proc.poll() is not None, what="two running trials")
    _ctrl_c(proc)
    assert proc.wait(timeout=120) == 130, stderr.read_text()
    assert "FAILED" not in _states(run_dir).values()
    _write_space(space, "breaks", "breaks:train", fixed={"steps": 2, "break": False},
                 space={"x": list(range(4))})
    ok(_hpo("run", space, "--engine", "inline", "--quiet", "--allow-changes", cwd=tmp_path))
    assert set(_states(run_dir).values()) == {"COMPLETE"}


# ------------------------------------------------------------ 5: a trial without checkpoints


def _suspended(tmp_path: Path, objective) -> tuple[object, str]:
    """Suspend a trial of ``objective`` as a stopping master does; the stored
    trial and ``hpo status --trial``'s page of it."""
    from hpo.store import RunDir
    from hpo.trial import TrialStatus, run_trial
    from hpo.trial_details import trial_details

    run_dir = tmp_path / "runs" / "ckpt"
    run = RunDir(run_dir)
    run.create({"name": "ckpt", "metric": {"name": "value"}, "space": {"x": [1]}}, None)
    with served_study(run_dir / "journal.log", "ckpt") as study:
        study.store.set_stop({"reason": "SIGINT", "resume": True})  # the master is leaving
        trial_id, number = study.new_trial()
        task = study.task(trial_id, number, config={}, objective=objective, metric="value",
                          checkpoint_dir=str(run.checkpoint_dir(number)))
        assert run_trial(task).state is TrialStatus.SUSPENDED
        trial = study.store.trial(trial_id)
    return trial, trial_details(run_dir, number)


def _no_checkpoint(config, trial):
    trial.report(0, value=1.0)
    trial.should_stop()
    return {"value": 1.0}


def _checkpoints(config, trial):
    trial.report(0, value=1.0)
    trial.save_checkpoint({"step": 0})
    trial.should_stop()
    return {"value": 1.0}


def test_a_trial_suspended_without_a_checkpoint_is_said_to_start_again(tmp_path):
    from hpo.master import saved_no_checkpoint

    trial, page = _suspended(tmp_path, _no_checkpoint)
    assert saved_no_checkpoint(trial)
    assert "saved no checkpoint" in page and "starts it again from the start" in page


def test_a_trial_that_saved_a_checkpoint_is_not_said_to_start_again(tmp_path):
    from hpo.master import saved_no_checkpoint

    trial, page = _suspended(tmp_path, _checkpoints)
    assert not saved_no_checkpoint(trial) and "saved no checkpoint" not in page


# ------------------------------------------------------------ 6: check-resume, conditional spaces


def test_check_resume_asks_only_for_active_parameters():
    from hpo.check_resume import parse_config
    from hpo.space import load_spec

    spec = load_spec(Path(__file__).parents[1] / "search_spaces" / "sklearn_digits_conditional.json")
    config = parse_config('{"solver": "sgd", "momentum": 0.0, "learning_rate": 0.01}', spec)
    assert "nesterov" not in config and "beta_1" not in config  # inactive with these values
    with pytest.raises(hpo.UsageError, match="missing nesterov"):
        parse_config('{"solver": "sgd", "momentum": 0.9, "learning_rate": 0.01}', spec)
    with pytest.raises(hpo.UsageError, match=r"'beta_1' is inactive.*solver in \['adam'\]"):
        parse_config('{"solver": "sgd", "momentum": 0.0, "learning_rate": 0.01, "beta_1": 0.9}', spec)


# ------------------------------------------------------------ 7: the small ones


def test_a_swapped_pair_of_letters_suggests_the_key_meant(tmp_path):
    space = tmp_path / "lgo.json"
    space.write_text(json.dumps({"space": {"lr": {"type": "float", "low": 0.001, "high": 0.1,
                                                  "lgo": True}}}))
    proc = _hpo("validate", space, cwd=tmp_path)
    assert proc.returncode == 2 and 'did you mean "log"?' in proc.stderr, proc.stderr


def test_status_on_a_space_file_says_which_directory_to_pass(tmp_path):
    space = _write_space(tmp_path / "my_space.json", "named-study", "hpo.examples.toy:quadratic")
    proc = _hpo("status", space, cwd=tmp_path)
    assert proc.returncode == 2
    assert "a file, not a run directory" in proc.stderr and "runs/named-study" in proc.stderr
    assert "no such directory" not in proc.stderr


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """A study with a tiny metric, a failure, a conditional parameter (inline)."""
    tmp = tmp_path_factory.mktemp("small")
    (tmp / "tiny.py").write_text(
        "def train(config, trial):\n"
        "    if config['solver'] == 'bad':\n"
        "        raise RuntimeError('the solver ' + 'x' * 100 + ' failed')\n"
        "    return {'value': 1.848e-06 * (1 + config.get('momentum', 0))}\n")
    space = tmp / "small.json"
    space.write_text(json.dumps({
        "name": "small", "objective": "tiny:train", "metric": {"name": "value"},
        "space": {"solver": ["adam", "bad", {"value": "sgd", "space": {"momentum": [0, 1]}}]}}))
    proc = _hpo("run", space, "--engine", "inline", "--quiet", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return {"run_dir": tmp / "runs" / "small", "cwd": tmp, "run": proc}


def test_status_all_has_an_error_column_cut_short(small_study):
    out = ok(_hpo("status", small_study["run_dir"], "--all", cwd=small_study["cwd"])).stdout
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[-1] == "error"
    failed = next(line for line in out.splitlines() if " FAILED " in line)
    assert "RuntimeError: the solver xxx" in failed and failed.endswith("...")
    assert len(failed.split("RuntimeError")[1]) < 60


def test_numbers_print_without_exponents(small_study):
    for out in (small_study["run"].stdout,
                ok(_hpo("status", small_study["run_dir"], cwd=small_study["cwd"])).stdout):
        assert "e-0" not in out and "0.000001848" in out and "0.000003696" in out


def test_inactive_parameters_read_as_a_dash_in_tables_and_empty_in_csv(small_study):
    out = small_study["run"].stdout
    adam = next(line.split() for line in out.splitlines() if " adam" in line)
    assert adam[-3:] == ["-", "adam", "-"]  # momentum, solver, error
    rows = list(csv.DictReader(io.StringIO(
        ok(_hpo("export", small_study["run_dir"], cwd=small_study["cwd"])).stdout)))
    assert next(r for r in rows if r["params.solver"] == "adam")["params.momentum"] == ""


def test_csv_export_has_iso_times_beside_the_epoch_ones(small_study):
    rows = list(csv.DictReader(io.StringIO(
        ok(_hpo("export", small_study["run_dir"], cwd=small_study["cwd"])).stdout)))
    names = list(rows[0])
    assert names.index("started_iso") == names.index("started_at") + 1
    for row in rows:
        started = datetime.fromisoformat(row["started_iso"])
        assert started.tzinfo is not None
        assert abs(started.timestamp() - float(row["started_at"])) < 0.001
        assert datetime.fromisoformat(row["ended_iso"]).timestamp() >= started.timestamp()


def test_the_progress_line_and_the_summary_break_ties_alike(tmp_path, foreground):
    # Trial 1 finishes first; trial 0 reaches the same value after it.
    (tmp_path / "tie.py").write_text(
        "import pathlib, time\n"
        "def train(config, trial):\n"
        "    flag = pathlib.Path(config['flag'])\n"
        "    if config['x'] == 0:\n"
        "        deadline = time.monotonic() + 120\n"
        "        while not flag.exists() and time.monotonic() < deadline:\n"
        "            time.sleep(0.05)\n"
        "    return {'value': 1.0}\n")
    flag = tmp_path / "trial-1-done"
    space = _write_space(tmp_path / "space.json", "tie", "tie:train",
                         fixed={"flag": str(flag)}, space={"x": [0, 1]})
    stderr = tmp_path / "stderr.txt"
    proc = foreground([*HPO, "run", str(space), "--engine", "dask", "--workers", "2"], tmp_path, stderr)
    wait_for(lambda: "best value=1 (#1)" in stderr.read_text() or proc.poll() is not None,
             what="the progress line on trial 1")
    flag.touch()
    assert proc.wait(timeout=TIMEOUT) == 0, stderr.read_text()
    last = [line for line in stderr.read_text().splitlines() if "done |" in line][-1]
    summary = ok(_hpo("status", tmp_path / "runs" / "tie", cwd=tmp_path)).stdout
    assert "(#0)" in last and "best: trial 0," in summary


def test_a_complete_study_says_so_and_starts_no_engine(tmp_path):
    space = _write_space(tmp_path / "space.json", "done", "hpo.examples.toy:quadratic")
    ok(_hpo("run", space, "--engine", "inline", "--quiet", cwd=tmp_path))
    again = ok(_hpo("run", space, "--engine", "dask", cwd=tmp_path))
    assert "study done is complete (all 8 of its trials ran)" in again.stderr
    assert "starting the dask engine" not in again.stderr and "engine ready" not in again.stderr
    assert "best: trial 4" in again.stdout  # the results, shown again
