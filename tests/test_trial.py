"""The trial wrapper: every outcome becomes a durable record, never an engine failure."""

from __future__ import annotations

import os
import socket
import time

import optuna
import pytest

from hpo.pruning import median_pruner
from hpo.store import StudyStore, open_storage
from hpo.trial import Trial, TrialStatus, TrialTask, run_trial
from hpo.store.records import ENDED_BY_ATTR, EVENT_ATTR, HEARTBEAT_ATTR, REPORT_ATTR, RUN_ATTR


def make_task(tmp_path, objective, config=None, **settings) -> TrialTask:
    url = str(tmp_path / "journal.log")
    study = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize",
                                load_if_exists=True)
    trial = study.ask()
    return TrialTask(storage=url, study_name="s",
                     trial_id=StudyStore.trial_id(trial), number=trial.number, config=config or {},
                     objective=objective, metric="value",
                     checkpoint_dir=str(tmp_path / "trials" / str(trial.number)), **settings)


def fresh(task: TrialTask) -> optuna.trial.FrozenTrial:
    """Read the trial back through a new storage object: what is on disk."""
    backend = optuna.storages.journal.JournalFileBackend(task.storage)
    return optuna.storages.JournalStorage(backend).get_trial(task.trial_id)


def test_complete_trial_is_recorded_durably(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": 2, "y": -1, "steps": 4}, cpus=3)
    outcome = run_trial(task)
    stored = fresh(task)
    run = stored.system_attrs[RUN_ATTR]
    assert outcome.state is TrialStatus.COMPLETE and outcome.value == pytest.approx(0.0)
    assert stored.state == optuna.trial.TrialState.COMPLETE and stored.value == pytest.approx(0.0)
    assert stored.intermediate_values == {0: -0.75, 1: -0.5, 2: -0.25, 3: 0.0}
    assert stored.system_attrs[f"{REPORT_ATTR}000002"] == {"value": -0.25}
    assert stored.user_attrs == {}  # the user's: hpo keeps its records in system attributes
    assert run["host"] == socket.gethostname() and run["pid"] == os.getpid()
    assert run["attempt"] == 1 and run["ended_at"] >= run["started_at"]
    assert run["core_seconds"] == pytest.approx(3 * run["duration_s"]) and run["gpu_seconds"] == 0
    assert run["metrics"] == {"value": 0.0} and run["error"] is None
    assert os.path.isdir(task.checkpoint_dir)


@pytest.mark.parametrize("objective, config, state, error_type, words", [
    ("hpo.examples.toy:fail", {"fail": True}, TrialStatus.FAILED, "RuntimeError", "boom"),
    ("hpo.examples.toy:nan", {}, TrialStatus.FAILED, "NonFiniteValue", "nan"),
    ("hpo.examples.toy:sleep", {"sleep_s": 0}, TrialStatus.COMPLETE, None, None),
    ("hpo.examples.sklearn_digits:no_such_function", {}, TrialStatus.FAILED, "SpaceError", "no callable"),
])
def test_user_errors_become_failed_records(tmp_path, objective, config, state, error_type, words):
    task = make_task(tmp_path, objective, config)
    outcome = run_trial(task)  # never raises because of user code
    run = fresh(task).system_attrs[RUN_ATTR]
    assert outcome.state is state
    if error_type:
        assert run["error"]["type"] == error_type and words in run["error"]["message"]
    if error_type == "RuntimeError":
        assert "Traceback" in run["error"]["traceback"] and "toy.py" in run["error"]["traceback"]


def test_wrong_return_values_fail_with_the_reason(tmp_path):
    task = make_task(tmp_path, lambda config, trial: {"accuracy": 0.9})
    assert run_trial(task).state is TrialStatus.FAILED
    error = fresh(task).system_attrs[RUN_ATTR]["error"]
    assert error["type"] == "BadReturnValue" and "'value'" in error["message"]
    task = make_task(tmp_path, lambda config, trial: "good")
    assert run_trial(task).state is TrialStatus.FAILED


def test_time_limit_kills_the_trial_and_records_timeout(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 60},
                     time_limit_s=1.5, isolate=True)
    began = time.monotonic()
    outcome = run_trial(task)
    run = fresh(task).system_attrs[RUN_ATTR]
    assert outcome.state is TrialStatus.TIMEOUT and time.monotonic() - began < 30
    assert run["timed_out"] and run["error"]["type"] == "TimeLimit"


def test_isolated_trial_reports_from_its_own_process(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": 1, "y": -1}, isolate=True)
    outcome = run_trial(task)
    assert outcome.state is TrialStatus.COMPLETE and outcome.value == pytest.approx(-1.0)
    assert len(fresh(task).intermediate_values) == 3


def test_finished_trial_run_again_is_counted_once(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": 2, "y": -1})
    first = run_trial(task)
    second = run_trial(task)  # e.g. an engine retry after the result was stored
    assert second == first and fresh(task).system_attrs[RUN_ATTR]["attempt"] == 1


def test_attempt_after_a_lost_worker_keeps_the_history(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0})
    lost = {"host": "node7", "pid": 1, "attempt": 1, "started_at": 1.0, "previous": []}
    # Written where studies before kept it (a user attribute): read all the same.
    open_storage(task.storage).set_trial_user_attr(task.trial_id, RUN_ATTR, lost)
    run_trial(task)
    run = fresh(task).system_attrs[RUN_ATTR]
    assert run["attempt"] == 2 and run["previous"][0]["host"] == "node7"


def test_should_stop_sees_the_study_stop(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": 0, "steps": 50})
    task.open_store().set_stop({"reason": "target"})
    run_trial(task)
    stored = fresh(task)
    assert len(stored.intermediate_values) == 1  # stopped at its first report
    assert TrialStatus.of(stored) is TrialStatus.STOPPED  # not failed: it has its value
    assert stored.value == stored.intermediate_values[0]
    assert stored.system_attrs[RUN_ATTR]["stop_reason"] == "stopped: target"
    events = [v for k, v in stored.system_attrs.items() if k.startswith(EVENT_ATTR)]
    assert [(e["kind"], e["step"]) for e in events] == [("stopped", 0)]


def test_median_pruner_prunes_a_clearly_worse_curve(tmp_path):
    pruning = {"pruner": median_pruner(min_steps=0)}
    for x in (2, 2):
        run_trial(make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": x, "y": -1, "steps": 6},
                            **pruning))
    bad = make_task(tmp_path, "hpo.examples.toy:quadratic", {"x": -20, "y": -1, "steps": 6},
                    **pruning)
    assert run_trial(bad).state is TrialStatus.PRUNED
    stored = fresh(bad)
    assert len(stored.intermediate_values) == 1
    assert stored.system_attrs[RUN_ATTR]["stop_reason"] == "pruned"


def test_report_rejects_wrong_types_precisely():
    trial = Trial(0, {})
    with pytest.raises(TypeError, match="step must be an int"):
        trial.report(-1, value=1.0)
    with pytest.raises(TypeError, match="metric 'acc' must be a number"):
        trial.report(0, acc="high")
    trial.report(0, acc=0.5, loss=1)
    assert trial.reports == [(0, {"acc": 0.5, "loss": 1.0})] and not trial.should_stop()


def test_isolated_trial_returning_something_unpicklable_fails_clearly(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0}, isolate=True)
    task = TrialTask(**{**task.__dict__, "objective": lambda config, trial: (lambda: 1)})
    assert run_trial(task).state is TrialStatus.FAILED
    error = fresh(task).system_attrs[RUN_ATTR]["error"]
    assert error["type"] == "BadReturnValue" and "lambda" in error["message"]


def test_the_start_record_is_written_while_the_objective_runs(tmp_path):
    task = make_task(tmp_path, "hpo.examples.toy:sleep")

    def objective(config, trial):  # started, as a master reading the store must see
        deadline = time.monotonic() + 10
        while TrialStatus.of(fresh(task)) is not TrialStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.01)
        return float(TrialStatus.of(fresh(task)) is TrialStatus.RUNNING)

    task = TrialTask(**{**task.__dict__, "objective": objective})
    assert run_trial(task).value == 1.0
    run = fresh(task).system_attrs[RUN_ATTR]
    assert run["attempt"] == 1 and run["started_at"] <= run["ended_at"]


def test_a_start_record_that_cannot_be_written_fails_the_task(tmp_path, monkeypatch):
    task = make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0})
    note = StudyStore.note

    def failing_once(self, trial_id, key, value):
        monkeypatch.setattr(StudyStore, "note", note)
        raise OSError("disk full")

    monkeypatch.setattr(StudyStore, "note", failing_once)
    with pytest.raises(OSError, match="disk full"):  # the engine's failure, as before the objective ran
        run_trial(task)
    assert TrialStatus.of(fresh(task)) is TrialStatus.PENDING


def test_heartbeats_are_written_while_the_objective_runs_and_stop_with_its_task(tmp_path, monkeypatch):
    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.05")
    tasks = [make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0.3}) for _ in range(2)]
    for task in tasks:
        run_trial(task)
    journal = tmp_path / "journal.log"
    size = journal.stat().st_size
    time.sleep(0.3)  # six beat periods
    assert journal.stat().st_size == size
    assert all(isinstance(fresh(task).system_attrs.get(HEARTBEAT_ATTR), float) for task in tasks)


def test_no_beat_overwrites_the_mark_of_a_cancelled_task(tmp_path, monkeypatch):
    from hpo.trial import _task

    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.02")

    def cancelled(task):
        time.sleep(0.2)  # beats meanwhile
        raise _task.TaskInterrupted("CancelError")

    monkeypatch.setattr(_task, "_run_here", cancelled)
    task = make_task(tmp_path, "hpo.examples.toy:sleep")
    assert run_trial(task).state is TrialStatus.RUNNING  # given up, to be resumed at once
    time.sleep(0.2)
    assert "abandoned_at" in fresh(task).system_attrs[HEARTBEAT_ATTR]


def test_a_trial_ended_by_the_master_meanwhile_keeps_the_stored_end(tmp_path, monkeypatch):
    task = make_task(tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0})
    finish = StudyStore.finish

    def master_first(self, trial_id, status, value, run=None):  # as end_without_result does
        self.write(trial_id, ENDED_BY_ATTR, {"reason": "cancelled", "message": "study stopped"})
        finish(self, trial_id, TrialStatus.CANCELLED, None)
        return finish(self, trial_id, status, value, run=run)

    monkeypatch.setattr(StudyStore, "finish", master_first)
    assert run_trial(task).state is TrialStatus.CANCELLED
