"""The stored layout (hpo.store.records): one vocabulary, records built and
read in one place, and a cost that counts every attempt once."""

from __future__ import annotations

import os
import stat

import optuna
import pytest

import hpo
from hpo.dashboards import timeline
from hpo.dashboards.data import load_snapshot
from hpo.store import RunDir, write_atomically
from hpo.store.records import (
    ENDED_BY_ATTR, RETRIED, RUN_ATTR, TrialStatus, cost_of, start_run, status_of,
)
from conftest import toy_space


@pytest.mark.parametrize("status, run, ended_by", [
    (TrialStatus.PENDING, None, None),
    (TrialStatus.RUNNING, {"host": "h"}, None),
    (TrialStatus.SUSPENDED, {"host": "h", "suspended": True}, None),
    (TrialStatus.COMPLETE, {"host": "h"}, None),
    (TrialStatus.PRUNED, {"stop_reason": "pruned"}, None),
    (TrialStatus.STOPPED, {"stop_reason": "stopped: target"}, None),
    (TrialStatus.FAILED, {"error": {"type": "ValueError"}}, None),
    (TrialStatus.TIMEOUT, {"timed_out": True}, None),
    (TrialStatus.CANCELLED, None, {"reason": "cancelled", "message": "study stopped"}),
])
def test_every_status_is_read_back_from_what_it_is_stored_as(status, run, ended_by):
    attrs = {**({RUN_ATTR: run} if run else {}), **({ENDED_BY_ATTR: ended_by} if ended_by else {})}
    finished = status.stored_as.is_finished()
    trial = optuna.trial.create_trial(
        state=status.stored_as, value=1.0 if status.stored_as in (
            optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) else None,
        user_attrs=attrs)
    assert status_of(trial) is status and status.is_finished is finished


def test_a_retried_attempt_is_counted_once_in_results_and_dashboard(tmp_path):
    # Attempt 1 fails after 2 steps; attempt 2 goes on from its checkpoint.
    space = toy_space("retry", "hpo.examples.toy:flaky", retries={"objective": 1},
                      resources={"cpus": 2}, fixed={"steps": 6, "step_s": 0.2}, space={"fail_at": [2]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    (trial,) = result.trials
    run = RunDir(tmp_path / "retry").open_store().trials()[0].system_attrs[RUN_ATTR]
    (first,) = run["previous"]
    assert trial.attempt == 2 and first["error"]["type"] == "RuntimeError"
    # Each attempt's own cost: its busy time x 2 CPUs; the trial's: both together.
    assert first["core_seconds"] == pytest.approx(2 * (first["ended_at"] - first["started_at"]))
    second_busy = run["ended_at"] - run["attempt_started_at"]
    assert trial.core_seconds == pytest.approx(first["core_seconds"] + 2 * second_busy, rel=1e-6)
    assert trial.cost.retried_core_seconds == first["core_seconds"] > 0
    # One cost, wherever it is shown.
    spent = timeline.cost(load_snapshot(tmp_path / "retry"))
    assert spent["core_hours"] == pytest.approx(result.cost["core_hours"]) \
        == pytest.approx(trial.core_seconds / 3600)
    assert spent["core_hours_by"][RETRIED] == pytest.approx(first["core_seconds"] / 3600)
    assert spent["core_hours_by"]["COMPLETE"] == pytest.approx(2 * second_busy / 3600, rel=1e-6)


def test_a_lost_attempt_is_charged_up_to_its_last_sign_of_life():
    lost = {"attempt": 1, "host": "n1", "pid": 7, "cpus": 2, "started_at": 100.0,
            "attempt_started_at": 100.0, "segment_started_at": 100.0, "segment": 0,
            "core_seconds": 0.0, "gpu_seconds": 0.0}
    where = {"host": "n2", "pid": 8, "cpus": 2, "gpus": ["0"]}
    run = start_run(lost, where, now=200.0, gpus=1, last_seen=130.0)
    (brief,) = run["previous"]
    assert (brief["started_at"], brief["ended_at"]) == (100.0, 130.0)
    assert (brief["core_seconds"], brief["gpu_seconds"]) == (60.0, 30.0)
    assert (run["attempt"], run["started_at"], run["attempt_started_at"]) == (2, 100.0, 200.0)
    assert (run["core_seconds"], run["host"]) == (60.0, "n2")
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs={RUN_ATTR: run})
    assert cost_of(trial).at(210.0).core_seconds == 60.0 + 10.0 * 2  # the running attempt so far


def test_write_atomically_syncs_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_mode), real_fsync(fd)))
    target = tmp_path / "jobs.json"
    target.write_text("old")
    write_atomically(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["jobs.json"]
    assert len(synced) == 2 and stat.S_ISREG(synced[0]) and stat.S_ISDIR(synced[1])
