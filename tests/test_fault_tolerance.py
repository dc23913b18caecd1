"""Nothing lost when trials, workers or the master die: real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

import hpo
from hpo.trial import TrialStatus
from conftest import ROOT, hpo_run_on, running_pid, toy_space, wait_for

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test


def complete(run_dir) -> list[hpo.TrialRecord]:
    try:
        return [t for t in hpo.StudyResult.load(run_dir).trials if t.state is TrialStatus.COMPLETE]
    except (hpo.UsageError, KeyError, ValueError):
        return []  # not created yet


def reported_steps(trial: hpo.TrialRecord, run_dir) -> list[int]:
    frozen = hpo.store.RunDir(run_dir).load_study().trials[trial.number]
    return sorted(frozen.intermediate_values)


# ----------------------------------------------------------- user failures


@pytest.mark.parametrize("retries, state", [(1, TrialStatus.COMPLETE), (0, TrialStatus.FAILED)])
def test_failing_objective_is_retried_from_its_checkpoint(tmp_path, retries, state):
    space = toy_space("flaky", "hpo.examples.toy:flaky", retries=retries,
                      fixed={"steps": 5}, space={"fail_at": [2]})
    (trial,) = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False).trials
    assert trial.state is state
    if retries:
        run = hpo.store.RunDir(tmp_path / "flaky").load_study().trials[0].system_attrs["hpo:run"]
        assert trial.attempt == 2 and run["previous"][0]["error"]["type"] == "RuntimeError"
        assert run["previous"][0]["host"] == run["host"]
        (event,) = trial.events
        assert event["kind"] == "retried" and "attempt 1" in event["reason"] and "flaky" in event["reason"]
        # The retry went on from the checkpoint: steps 0-1 from attempt 1, 2-4 from attempt 2.
        assert reported_steps(trial, tmp_path / "flaky") == [0, 1, 2, 3, 4]
    else:
        assert "flaky: attempt 1" in trial.error


# ------------------------------------------------------------ worker loss


def test_trial_on_a_killed_worker_runs_again_elsewhere_and_counts_once(tmp_path):
    from distributed import LocalCluster

    space = toy_space("workerloss", "hpo.examples.toy:curve", fixed={"steps": 12, "step_s": 0.25},
                      search={"parallel": 1}, space={"quality": [1.0]})
    run_dir = tmp_path / "workerloss"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        study = hpo_run_on(cluster.scheduler_address, space, tmp_path)
        pid = wait_for(lambda: running_pid(run_dir, 3), what="the trial to report 3 steps")
        os.kill(pid, signal.SIGKILL)  # the worker process dies mid-trial
        assert study.wait(timeout=120) == 0
    (trial,) = hpo.StudyResult.load(run_dir).trials  # counted once
    assert trial.state is TrialStatus.COMPLETE and trial.attempt == 2
    assert [e["kind"] for e in trial.events] == ["retried"] and str(pid) in trial.events[0]["reason"]
    assert reported_steps(trial, run_dir) == list(range(12))  # resumed, not restarted


# ------------------------------------------------------------ master loss


def study_command(tmp_path, space: dict) -> list[str]:
    path = tmp_path / "space.json"
    path.write_text(json.dumps(space))
    return [sys.executable, str(ROOT / "hpo_main.py"), str(path), "--engine", "dask",
            "--workers", "2", "--runs-dir", str(tmp_path / "runs"), "--quiet"]


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HPO_HEARTBEAT_S": "0.5"}


def test_killed_master_resumes_with_the_same_command(tmp_path):
    space = toy_space("master", "hpo.examples.toy:curve", fixed={"steps": 8, "step_s": 0.2},
                      space={"quality": [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]})
    command, run_dir = study_command(tmp_path, space), tmp_path / "runs" / "master"
    master = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL)
    wait_for(lambda: len(complete(run_dir)) >= 2 and _mid_trial(run_dir), what="a trial mid-way")
    cluster = psutil.Process(master.pid).children(recursive=True)
    master.kill()  # SIGKILL: no clean-up at all
    master.wait()
    psutil.wait_procs(cluster, timeout=5)
    for orphan in (p for p in cluster if p.is_running()):
        orphan.kill()  # the embedded cluster's workers would die with a real node
    before = {t.number: t.value for t in complete(run_dir)}
    interrupted = _mid_trial(run_dir)
    subprocess.run(command, env=ENV, check=True, timeout=120, stdout=subprocess.DEVNULL)
    result = hpo.StudyResult.load(run_dir)
    done = {t.number: t for t in result.trials if t.state is TrialStatus.COMPLETE}
    # Every configuration once; the finished ones kept; the lost one resumed as itself.
    assert sorted(t.params["quality"] for t in done.values()) == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert all(done[n].value == v for n, v in before.items())
    resumed = done[interrupted]
    assert resumed.attempt == 2 and reported_steps(resumed, run_dir) == list(range(8))
    assert [e["kind"] for e in resumed.events] == ["resumed", "retried"]


def _mid_trial(run_dir) -> int | None:
    """The number of a running trial with 2 or more reports, if any."""
    try:
        trials = hpo.store.RunDir(run_dir).load_study().trials
    except (hpo.UsageError, ValueError, KeyError):
        return None
    return next((t.number for t in trials if t.state.name == "RUNNING"
                 and len(t.intermediate_values) >= 2), None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_suspends_running_trials_and_the_next_run_resumes_them(tmp_path, signum):
    space = toy_space("signal", "hpo.examples.toy:curve", fixed={"steps": 10, "step_s": 0.2},
                      space={"quality": [1.0, 0.9, 0.8]})
    command, run_dir = study_command(tmp_path, space), tmp_path / "runs" / "signal"
    master = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    wait_for(lambda: _mid_trial(run_dir) is not None, what="a trial mid-way")
    master.send_signal(signum)
    _, stderr = master.communicate(timeout=60)
    assert master.returncode == 128 + signum and "letting 2 running trials checkpoint" in stderr
    suspended = [t for t in hpo.StudyResult.load(run_dir).trials if t.state is TrialStatus.SUSPENDED]
    assert len(suspended) == 2
    for trial in suspended:
        (event,) = trial.events
        assert event["kind"] == "suspended" and signal.Signals(signum).name in event["reason"]
    subprocess.run(command, env=ENV, check=True, timeout=120, stdout=subprocess.DEVNULL)
    result = hpo.StudyResult.load(run_dir)
    # The queued third trial was cancelled by the stop and its configuration run again.
    assert sorted(t.params["quality"] for t in result.trials
                  if t.state is TrialStatus.COMPLETE) == [0.8, 0.9, 1.0]
    assert result.counts["COMPLETE"] + result.counts["CANCELLED"] == len(result.trials)
    for trial in (t for t in result.trials if t.number in {s.number for s in suspended}):
        assert trial.attempt == 1  # the same attempt went on: a resumption, not a retry
        assert [e["kind"] for e in trial.events] == ["suspended", "resumed"]
        assert reported_steps(trial, run_dir) == list(range(10))
