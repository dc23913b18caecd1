"""Whole studies on a real Dask cluster of 2 worker processes, records checked in the store."""

from __future__ import annotations

import os

import optuna
import pytest

import hpo
from hpo.store import RunDir
from hpo.store.records import REPORT_ATTR, RUN_ATTR
from conftest import ROOT, toy_space


def stored_trials(run_dir) -> list[optuna.trial.FrozenTrial]:
    """The trials as on disk, read through a new storage object."""
    run = RunDir(run_dir)
    backend = optuna.storages.journal.JournalFileBackend(run.storage_url())
    study = optuna.load_study(study_name=run.read()["spec"]["name"],
                              storage=optuna.storages.JournalStorage(backend))
    return study.get_trials()


def test_keras_quick_start_records_every_trial(dask_address, worker_pids, tmp_path):
    result = hpo.run(ROOT / "search_spaces/digits_quick.json", engine="dask",
                     scheduler=dask_address, max_trials=4, runs_dir=tmp_path, progress=False)
    trials = stored_trials(tmp_path / "digits-quick")
    assert len(trials) == 4 and result.counts["COMPLETE"] == 4
    for trial in trials:
        run = trial.system_attrs[RUN_ATTR]
        assert trial.state == optuna.trial.TrialState.COMPLETE and 0.1 < trial.value <= 1.0
        assert run["pid"] in worker_pids and run["pid"] != os.getpid() and run["host"]
        assert run["attempt"] == 1 and run["started_at"] < run["ended_at"]
        assert run["duration_s"] > 0 and run["core_seconds"] == pytest.approx(run["duration_s"])
        assert run["metrics"]["val_accuracy"] == pytest.approx(trial.value)
        assert len(trial.intermediate_values) == 8  # num_epochs, one report each
        assert sum(k.startswith(REPORT_ATTR) for k in trial.system_attrs) == 8
        assert os.path.isdir(RunDir(tmp_path / "digits-quick").checkpoint_dir(trial.number))
    # Which of the two workers each trial went to is the scheduler's choice: on
    # a loaded machine one may take all four. Each ran on a worker (above).
    assert result.best.value == max(t.value for t in trials)
    run = RunDir(tmp_path / "digits-quick")  # optuna-dashboard shows the metric by name
    study = optuna.load_study(study_name="digits-quick", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(run.storage_url())))
    assert study.metric_names == ["val_accuracy"]


def test_target_stops_the_study_and_its_running_trials(dask_address, tmp_path):
    # Trial 0 is slow (400 steps, 40 s), trial 1 reaches the target (-1) after 3 steps.
    space = toy_space("target", metric={"target": -1}, fixed={"step_s": 0.1, "y": 0},
                      space={"steps": [400, 3, 4, 5, 6, 7, 8, 9], "x": [2]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert result.stop == {"reason": "target", "trial": 1, "value": -1.0}
    assert len(result.trials) < 8  # no new trials after the stop
    slow = next(t for t in stored_trials(tmp_path / "target") if t.number == 0)
    # Stopped at its next report, and recorded as stopped (with its value), not failed.
    assert hpo.TrialStatus.of(slow) is hpo.TrialStatus.STOPPED and len(slow.intermediate_values) < 400
    assert slow.value == slow.intermediate_values[max(slow.intermediate_values)]
    assert slow.system_attrs[RUN_ATTR]["stop_reason"] == "stopped: target"


def test_wall_clock_budget_stops_running_trials(dask_address, tmp_path):
    space = toy_space("budget", "hpo.examples.toy:slow", fixed={"sleep_s": 60},
                      search={"timeout_s": 1.0}, space={"x": [0, 1, 2, 3]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "timeout_s"
    # Each trial that had started was stopped (run to its end, it would be
    # COMPLETE after 60 s), the others never ran: how many had started by the
    # 1 s budget is the loaded machine's say.
    ran = [t for t in result.trials if t.state is hpo.TrialStatus.STOPPED]
    assert 1 <= len(ran) <= 2 and result.counts["COMPLETE"] == 0
    assert all(t.state is hpo.TrialStatus.CANCELLED for t in result.trials if t not in ran)
    assert all(e["kind"] == "stopped" and "timeout_s" in e["reason"] for t in ran for e in t.events)


def test_same_command_resumes_without_repeating_trials(dask_address, tmp_path):
    space = toy_space("resume")
    first = hpo.run(space, engine="dask", scheduler=dask_address, max_trials=3,
                    runs_dir=tmp_path, progress=False)
    done = {t.number: (t.params, t.value) for t in first.trials}
    second = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert second.counts["COMPLETE"] == 8 and len(second.trials) == 8
    assert {t.number: (t.params, t.value) for t in second.trials if t.number in done} == done
    assert len({tuple(sorted(t.params.items())) for t in second.trials}) == 8
    third = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert len(third.trials) == 8  # nothing left to do


def test_trials_a_dead_master_created_and_never_started_are_run_as_they_are(dask_address, tmp_path):
    space = toy_space("leftover")
    hpo.run(space, engine="dask", scheduler=dask_address, max_trials=2, runs_dir=tmp_path,
            progress=False)
    study = RunDir(tmp_path / "leftover").load_study()
    study.enqueue_trial({"x": 3, "y": 0})
    orphan = study.ask(fixed_distributions=hpo.parse_spec(space).distributions())  # never started
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    # The orphan ran as itself: one trial per configuration, none cancelled.
    assert {k: n for k, n in result.counts.items() if n} == {"COMPLETE": 8}
    reused = next(t for t in result.trials if t.number == orphan.number)
    assert reused.params == {"x": 3, "y": 0} and reused.state is hpo.TrialStatus.COMPLETE


def test_sqlite_storage_with_two_worker_processes(dask_address, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    result = hpo.run(toy_space("sqlite"), engine="dask", scheduler=dask_address, storage=url,
                     runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8
    assert hpo.StudyResult.load(tmp_path / "sqlite").counts == result.counts


def test_notebook_style_callable_objective(dask_address, tmp_path):
    offset = 10.0

    def train(config, trial):  # a closure: shipped by value, as from a notebook
        trial.report(0, score=config["x"] + offset)
        return {"score": config["x"] + offset}

    result = hpo.run({"space": {"x": [1, 2, 3]}, "metric": {"name": "score"}}, train,
                     engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert result.best.value == 13.0 and result.best.params == {"x": 3}
    assert "COMPLETE" in result.table()


def test_random_search_is_reproducible_end_to_end(dask_address, tmp_path):
    space = toy_space("rand", search={"algorithm": "random", "seed": 5, "max_trials": 6},
                      space={"x": {"type": "float", "low": -5, "high": 5},
                             "y": {"type": "float", "low": -5, "high": 5}})
    one = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path / "a", progress=False)
    two = hpo.run(space, engine="inline", runs_dir=tmp_path / "b", progress=False)
    by_number = lambda result: {t.number: (t.params, t.value) for t in result.trials}  # noqa: E731
    assert by_number(one) == by_number(two)
