"""The master loop: the two kinds of retry, and what ``hpo.run`` accepts in
place of names (an engine, an Optuna sampler, an Optuna pruner)."""

from __future__ import annotations

import optuna
import pytest

import hpo
from hpo.engines import InlineEngine
from conftest import toy_space


def infrastructure_fault(calls: list[int]):
    def lost(task):  # the wrapper itself raised: not the objective's fault
        calls.append(task.number)
        raise OSError("node lost")
    return lost


@pytest.mark.parametrize("retries, tries", [(2, 3), ({"engine": 1, "objective": 5}, 2),
                                            ({"objective": 2}, 1)])
def test_engine_retries_rerun_a_task_the_infrastructure_failed(tmp_path, monkeypatch, retries, tries):
    calls: list[int] = []
    monkeypatch.setattr("hpo.engines._inline.run_trial", infrastructure_fault(calls))
    result = hpo.run(toy_space("lost", retries=retries), engine="inline", max_trials=2,
                     runs_dir=tmp_path, progress=False)
    assert calls == [0] * tries + [1] * tries  # each task tried 1 + engine retries times
    assert result.counts["FAILED"] == 2
    assert all(t.error == "EngineError: OSError: node lost" for t in result.trials)


@pytest.mark.parametrize("retries, state, attempts", [
    ({"objective": 1}, hpo.TrialStatus.COMPLETE, 2),
    ({"engine": 3}, hpo.TrialStatus.FAILED, 1),  # engine retries never re-run user errors
])
def test_objective_retries_rerun_a_failing_objective(tmp_path, retries, state, attempts):
    space = toy_space("flaky", "hpo.examples.toy:flaky", retries=retries, fixed={"steps": 4},
                      space={"fail_at": [2]})
    (trial,) = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False).trials
    assert trial.state is state and trial.attempt == attempts


def test_run_takes_an_engine_object(tmp_path):
    engine = InlineEngine()
    result = hpo.run(toy_space("object"), engine=engine, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8 and engine._thread is not None  # this engine ran them
    with pytest.raises(hpo.UsageError, match="configured already"):  # not silently ignored
        hpo.run(toy_space("object"), engine=InlineEngine(), workers=2, runs_dir=tmp_path,
                progress=False)


class CountingSampler(optuna.samplers.RandomSampler):
    """A user's own sampler: Optuna's random one, counting what it was asked."""

    asked = 0

    def sample_independent(self, study, trial, param_name, param_distribution):
        type(self).asked += 1
        return super().sample_independent(study, trial, param_name, param_distribution)


def test_run_takes_an_optuna_sampler_in_place_of_the_algorithm(tmp_path):
    space = toy_space("sampler", search={"algorithm": "bayesian", "max_trials": 5},
                      space={"x": {"type": "float", "low": 0, "high": 4}, "y": [-1, 0]})
    result = hpo.run(space, engine="inline", sampler=CountingSampler(seed=3), runs_dir=tmp_path,
                     progress=False)
    assert result.counts["COMPLETE"] == 5 and CountingSampler.asked >= 10  # x and y, 5 times


def test_run_takes_an_optuna_pruner_in_place_of_the_named_one(tmp_path):
    space = toy_space("pruned", "hpo.examples.toy:curve", fixed={"steps": 9},
                      search={"parallel": 1}, space={"quality": [1.0, 0.95, 0.9, 0.2]})
    pruner = optuna.pruners.ThresholdPruner(lower=0.1)
    result = hpo.run(space, engine="inline", pruner=pruner, runs_dir=tmp_path, progress=False)
    by_quality = {t.params["quality"]: t for t in result.trials}
    assert by_quality[0.2].state is hpo.TrialStatus.PRUNED and by_quality[0.2].steps < 9
    assert "ThresholdPruner" in by_quality[0.2].events[-1]["reason"]
    assert all(by_quality[q].state is hpo.TrialStatus.COMPLETE for q in (1.0, 0.95, 0.9))
