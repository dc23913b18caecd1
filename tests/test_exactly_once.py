"""Exactly once, whatever dies: trial processes that outlive their task, a
dead Dask scheduler, two masters on one study, an unbounded in-flight window,
storage and study mistakes. Real processes throughout, ended by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from engine_conformance import CHILD_ENV, ROOT
from conftest import trial_processes, wait_for
from hpo.errors import UsageError
from hpo.store import MasterLease, RunDir, StudyBusy
from hpo.store.records import TrialStatus, status_of

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

SPACES = Path(__file__).with_name("fault_spaces")
ENV = {**CHILD_ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{SPACES}"}


def hpo(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpo", *args], env={**ENV, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def finish(process: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def store_of(run_dir: Path):
    """The study's store, read-only; None while the study is not in it yet."""
    try:
        return RunDir(run_dir).open_store(read_only=True)
    except UsageError:  # no run directory, journal or study yet
        return None


def states(run_dir: Path) -> Counter:
    """The trials' statuses; none while the study is not in its store yet."""
    store = store_of(run_dir)
    return Counter() if store is None else Counter(status_of(t).name for t in store.trials())


def stop_recorded(run_dir: Path) -> dict | None:
    """Why the master stops the study, once it has recorded it (it then gives
    running trials their grace); None before, or while there is no study yet."""
    store = store_of(run_dir)
    return None if store is None else store.stop()


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- trial processes never outlive their task -------------------------------------------


def test_a_clean_stop_leaves_no_trial_process_and_the_resume_runs_each_step_once(tmp_path):
    # Steps of a minute: the stop and the grace are over long before the
    # first one ends, however loaded the machine.
    env = {"SLOWOBJ_STEP_S": "60", "HPO_STOP_GRACE_S": "2"}
    args = ("run", str(SPACES / "orphan.json"), "--workers", "2", "--runs-dir", str(tmp_path), "--quiet")
    master = hpo(*args, env=env)
    children = wait_for(lambda: len(trial_processes(master.pid)) == 2 and trial_processes(master.pid),
                        what="two trial processes")
    warm = trial_processes(master.pid, warm=True)  # the workers' warm processes they were forked from
    time.sleep(2)  # well inside their first step
    master.send_signal(signal.SIGTERM)
    code, output = finish(master)
    assert code == 128 + signal.SIGTERM, output
    # Each had its grace (2 s) to checkpoint, then ended: none is left behind,
    # nor a warm process (they leave with their workers).
    wait_for(lambda: all(gone(p) for p in [*children, *warm]), timeout=10, what="trial processes ending")

    code, output = finish(hpo(*args, env={"SLOWOBJ_STEP_S": "0.5"}))
    assert code == 0, output
    assert states(tmp_path / "orphan") == {"COMPLETE": 2}
    for log in (tmp_path / "orphan" / "trials").glob("*/executions.log"):
        steps = [line.split("step=")[1] for line in log.read_text().split()  if "step=" in line]
        assert sorted(steps) == ["0", "1", "2"], log.read_text()  # each step ran once


def test_sigterm_under_the_inline_engine_suspends_the_running_trial_and_the_resume_completes(tmp_path):
    args = ("run", str(SPACES / "slow.json"), "--engine", "inline", "--runs-dir", str(tmp_path), "--quiet")
    master = hpo(*args)
    run_dir = tmp_path / "slow"
    wait_for(lambda: run_dir.joinpath("journal.log").exists() and states(run_dir)["RUNNING"] == 1,
             what="the first trial running")
    master.send_signal(signal.SIGTERM)
    code, output = finish(master)
    assert code == 128 + signal.SIGTERM, output
    assert states(run_dir)["SUSPENDED"] == 1 and states(run_dir)["FAILED"] == 0

    code, output = finish(hpo(*args))
    assert code == 0, output
    assert states(run_dir)["COMPLETE"] == 3 and states(run_dir)["FAILED"] == 0


def test_a_second_signal_does_not_cut_the_stop_short(tmp_path):
    # SLURM may send USR1 and then SIGTERM: the running trial still gets its grace.
    args = ("run", str(SPACES / "orphan.json"), "--engine", "inline", "--runs-dir", str(tmp_path),
            "--quiet")
    gate = tmp_path / "gate"  # the trial's first step lasts until the test opens it
    master = hpo(*args, env={"SLOWOBJ_GATE": str(gate)})
    run_dir = tmp_path / "orphan"
    try:
        # states() counts nothing (a false condition) until the study is in its store.
        wait_for(lambda: states(run_dir)["RUNNING"] == 1, what="the first trial running")
        master.send_signal(signal.SIGUSR1)
        wait_for(lambda: stop_recorded(run_dir), what="the master stopping on SIGUSR1")
        # Inside the grace: the trial is still in its first step, the gate shut.
        assert master.poll() is None and states(run_dir)["RUNNING"] == 1
        master.send_signal(signal.SIGTERM)
    finally:
        gate.touch()  # the step ends; the trial checkpoints and suspends
    code, output = finish(master)
    assert code == 128 + signal.SIGUSR1, output
    assert states(run_dir)["SUSPENDED"] == 1 and states(run_dir)["RUNNING"] == 0


# -- a dead Dask scheduler --------------------------------------------------------------


class _Cluster:
    """A Dask scheduler and three worker processes, each its own process group."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "scheduler.json"
        self.file.unlink(missing_ok=True)
        self.scheduler = self._start("distributed.cli.dask_scheduler", "--scheduler-file", str(self.file),
                                     "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0")
        wait_for(self.file.exists, what="the scheduler file")
        self.workers = self._start("distributed.cli.dask_worker", "--scheduler-file", str(self.file),
                                   "--nworkers", "3", "--nthreads", "1", "--no-dashboard")

    @staticmethod
    def _start(module: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=ENV, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        for process in (self.workers, self.scheduler):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_dead_scheduler_ends_the_master_cleanly_and_the_resume_completes_every_trial(tmp_path):
    args = ("run", str(SPACES / "grid36.json"), "--engine", "dask", "--runs-dir", str(tmp_path), "--quiet")
    cluster = _Cluster(tmp_path)
    try:
        master = hpo(*args, "--scheduler", str(cluster.file))
        run_dir = tmp_path / "grid36"
        wait_for(lambda: run_dir.joinpath("journal.log").exists() and states(run_dir)["COMPLETE"] >= 3,
                 what="three trials done")
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        code, output = finish(master)
        assert code == 75, output
        assert "lost the Dask scheduler" in output and "Traceback" not in output
        assert states(run_dir)["FAILED"] == 0  # lost trials stay resumable
    finally:
        cluster.close()

    cluster = _Cluster(tmp_path)
    try:
        code, output = finish(hpo(*args, "--scheduler", str(cluster.file)))
    finally:
        cluster.close()
    assert code == 0, output
    trials = RunDir(run_dir).open_store(read_only=True).trials()
    done = [t for t in trials if status_of(t) is TrialStatus.COMPLETE]
    assert len(done) == 36 and not [t for t in trials if status_of(t) is TrialStatus.FAILED]
    assert len({json.dumps(t.params, sort_keys=True) for t in done}) == 36  # none twice


# -- one master per study ---------------------------------------------------------------


def test_a_master_killed_while_its_relay_commits_under_load_loses_nothing_acknowledged(tmp_path):
    # Two workers report a step every few milliseconds: the relay commits
    # without pause when the master is killed (SIGKILL: no clean-up at all).
    acks = tmp_path / "acks"
    acks.mkdir()
    space = {"name": "load", "objective": "acked:train", "metric": {"name": "value"},
             "search": {"parallel": 2}, "fixed": {"steps": 400, "acks": str(acks)},
             "space": {"x": [0, 1, 2, 3]}}
    space_file = tmp_path / "load.json"
    space_file.write_text(json.dumps(space))
    args = ("run", str(space_file), "--workers", "2", "--runs-dir", str(tmp_path), "--quiet")
    master = hpo(*args)
    acknowledged = lambda: sum(len(f.read_text().split()) for f in acks.glob("*.log"))  # noqa: E731
    wait_for(lambda: acknowledged() >= 300, what="300 acknowledged reports")
    cluster = psutil.Process(master.pid).children(recursive=True)
    master.kill()
    master.wait()
    psutil.wait_procs(cluster, timeout=5)
    for orphan in (p for p in cluster if p.is_running()):
        orphan.kill()  # the embedded cluster's workers would die with a real node
    kept = {int(f.stem): [int(s) for s in f.read_text().split()] for f in acks.glob("*.log")}
    stored = {t.number: t for t in RunDir(tmp_path / "load").open_store(read_only=True).trials()}
    for number, steps in kept.items():  # durable before it was acknowledged
        assert all(stored[number].intermediate_values.get(s) == number * 1000.0 + s for s in steps)

    code, output = finish(hpo(*args))
    assert code == 0, output
    trials = RunDir(tmp_path / "load").open_store(read_only=True).trials()
    assert sorted(status_of(t).name for t in trials).count("COMPLETE") == 4  # each configuration once
    assert {t.params["x"] for t in trials if status_of(t) is TrialStatus.COMPLETE} == {0, 1, 2, 3}
    for trial in (t for t in trials if status_of(t) is TrialStatus.COMPLETE):
        assert trial.intermediate_values == {s: trial.number * 1000.0 + s for s in range(400)}


def test_two_masters_started_at_once_run_the_study_once(tmp_path, dask_address):
    args = ("run", str(SPACES / "grid36.json"), "--engine", "dask", "--scheduler", dask_address,
            "--runs-dir", str(tmp_path), "--quiet")
    masters = [hpo(*args), hpo(*args)]
    results = sorted(finish(m) for m in masters)
    (ok, _), (refused, message) = results
    assert (ok, refused) == (0, 2), results
    assert "another master runs this study" in message and "pid" in message
    assert "Traceback" not in message
    assert states(tmp_path / "grid36") == {"COMPLETE": 36}


def test_a_lease_is_refused_while_held_and_taken_over_once_stale(tmp_path):
    with MasterLease(tmp_path, beat_s=0.2) as first:
        assert MasterLease(tmp_path).holder()["pid"] == os.getpid()
        with pytest.raises(StudyBusy, match=f"pid {os.getpid()}"):
            MasterLease(tmp_path, beat_s=0.2).acquire()
        first._stop.set()  # its master hangs: no renewals any more
        first._renewer.join()
        time.sleep(0.8)  # > 3 renewals missed
        with MasterLease(tmp_path, beat_s=0.2) as second:
            assert MasterLease(tmp_path).holder()["token"] == second.token
    assert not (tmp_path / "master.lease").exists()


def test_a_lease_left_by_a_dead_master_on_this_host_is_taken_over_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "master.lease").write_text(json.dumps(
        {"host": os.uname().nodename, "pid": dead.pid, "token": "old", "since": time.time()}))
    with MasterLease(tmp_path, beat_s=60) as lease:
        assert MasterLease(tmp_path).holder()["token"] == lease.token


# -- the in-flight window ---------------------------------------------------------------


def test_a_huge_parallel_is_bounded_by_the_slots_and_the_time_budget_is_kept(tmp_path):
    code, output = finish(hpo("run", str(SPACES / "p6.json"), "--workers", "1", "--timeout-s", "5",
                              "--runs-dir", str(tmp_path), "--quiet"), timeout=120)
    assert code == 0, output
    assert "stopped early: timeout_s" in output
    counted = states(tmp_path / "p6")
    assert counted["PENDING"] == 0 and counted["RUNNING"] == 0
    # One slot, one queued ahead: at most that many were prepared and then cancelled.
    assert counted["CANCELLED"] <= 2, counted


# -- storage and study mistakes refused before anything is recorded --------------------


@pytest.mark.parametrize("storage, said", [
    ("foo://bar", "not a storage URL"),
    ("sqlite://", "in-memory"),
    ("sqlite:///:memory:", "in-memory"),
    ("sqlite:///{tmp}/missing/study.db", "does not exist"),
    ("{tmp}/missing/journal.log", "does not exist"),
    ("postgresql+psycopg://user@127.0.0.1:1/db", "driver is not installed"),
])
def test_a_bad_storage_is_refused_before_anything_is_recorded(tmp_path, storage, said):
    storage = storage.format(tmp=tmp_path)
    runs = tmp_path / "runs"
    code, output = finish(hpo("run", str(SPACES / "tiny.json"), "--engine", "inline", "--storage",
                              storage, "--runs-dir", str(runs), "--quiet"))
    assert code == 2, output
    assert f"--storage {storage}" in output and said in output and "fix:" in output
    assert "Traceback" not in output
    assert not (runs / "tiny").exists()


@pytest.mark.parametrize("change, key", [
    ({"metric": {"name": "value", "direction": "minimize"}}, "metric.direction"),
    ({"fixed": {"offset": 1}}, "fixed"),
    ({"objective": "hpo.examples.toy:sleep"}, "objective"),
])
def test_a_changed_study_is_not_resumed_silently(tmp_path, change, key):
    base = json.loads((SPACES / "tiny.json").read_text())
    space = tmp_path / "tiny.json"
    space.write_text(json.dumps(base))
    run = ("run", str(space), "--engine", "inline", "--runs-dir", str(tmp_path), "--quiet")
    code, output = finish(hpo(*run, "--max-trials", "2"))
    assert code == 0, output
    before = (tmp_path / "tiny" / "study.json").read_text()

    space.write_text(json.dumps({**base, **change}))
    code, output = finish(hpo(*run))
    assert code == 2, output
    assert f'different "{key}"' in output and "fix:" in output
    assert (tmp_path / "tiny" / "study.json").read_text() == before

    code, output = finish(hpo(*run, "--allow-changes"))
    if key == "metric.direction":  # the store ranks by its first direction for good
        assert code == 2 and "--allow-changes" not in output.split("fix:")[1], output
    else:
        assert code == 0, output
        assert json.loads((tmp_path / "tiny" / "study.json").read_text())["earlier_specs"]


def test_a_scheduler_that_does_not_answer_is_refused_before_anything_is_recorded(tmp_path):
    runs = tmp_path / "runs"
    for scheduler in (str(SPACES / "tiny.json"), "tcp://127.0.0.1:1"):
        code, output = finish(hpo("run", str(SPACES / "tiny.json"), "--engine", "dask", "--scheduler",
                                  scheduler, "--runs-dir", str(runs), "--quiet",
                                  env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}))
        assert code == 2, output
        assert f"--scheduler {scheduler}" in output and "fix:" in output and "Traceback" not in output
        assert not (runs / "tiny").exists()


def test_a_file_in_the_way_of_the_run_directory_is_refused(tmp_path):
    (tmp_path / "runs").write_text("not a directory")
    code, output = finish(hpo("run", str(SPACES / "tiny.json"), "--engine", "inline", "--runs-dir",
                              str(tmp_path / "runs"), "--quiet"))
    assert code == 2 and "--runs-dir" in output and "Traceback" not in output, output
