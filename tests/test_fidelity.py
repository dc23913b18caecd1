"""Multi-fidelity search's decisions on a fixed history (hpo.search's
``multifidelity`` sampler: BOHB's model per budget)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.search import MultiFidelitySampler, budgets

SPACE = {"x": FloatDistribution(0.0, 1.0)}


def history(early: int, far: int) -> optuna.Study:
    """``early`` trials pruned after one step, where small x looks best, and
    ``far`` trials that went 9 steps, where large x is best (a learning rate
    that starts slow and ends well)."""
    study = optuna.create_study(direction="minimize", sampler=MultiFidelitySampler(seed=0, random_fraction=0))
    for i in range(early):
        x = (i + 0.5) / early
        study.add_trial(create_trial(params={"x": x}, distributions=SPACE, state=TrialState.PRUNED,
                                     intermediate_values={0: x}))
    for i in range(far):
        x = (i + 0.5) / far
        curve = {step: x if step == 0 else 1.0 - x for step in range(9)}
        study.add_trial(create_trial(params={"x": x}, distributions=SPACE, state=TrialState.RUNNING,
                                     intermediate_values=curve))
    return study


def proposals(study: optuna.Study, count: int) -> list[float]:
    sampler = study.sampler
    asked = []
    for _ in range(count):
        trial = study.ask(fixed_distributions=SPACE)
        asked.append((trial.params["x"], sampler.last_budget))
        study.tell(trial, state=TrialState.FAIL)
    return asked


def test_the_budgets_are_hyperbands_rungs_up_to_the_longest_curve():
    assert budgets(52) == [1, 3, 9, 27, 52] and budgets(9) == [1, 3, 9] and budgets(1) == [1]
    assert budgets(0) == []


def test_the_model_follows_the_largest_budget_with_enough_points_running_trials_included():
    asked = proposals(history(early=20, far=6), 10)
    assert {budget for _, budget in asked} == {9}  # 6 >= dimension + 2 trials reached 9 steps
    assert sorted(x for x, _ in asked)[len(asked) // 2] > 0.5  # where the longer curves end best


def test_with_too_few_long_curves_the_model_reads_the_first_step():
    asked = proposals(history(early=20, far=2), 10)
    assert {budget for _, budget in asked} == {1}
    assert sorted(x for x, _ in asked)[len(asked) // 2] < 0.5  # where the first step looks best


def test_nothing_to_learn_from_draws_at_random():
    study = optuna.create_study(sampler=MultiFidelitySampler(seed=0, random_fraction=0))
    asked = proposals(study, 3)
    assert [budget for _, budget in asked] == [None] * 3
    assert len({x for x, _ in asked}) == 3


def test_a_share_of_proposals_is_random_as_in_bohb():
    study = history(early=20, far=6)
    study.sampler = MultiFidelitySampler(seed=1)
    budgets_used = [budget for _, budget in proposals(study, 60)]
    assert 0 < budgets_used.count(None) < 60 and budgets_used.count(9) > 0


def test_the_space_names_it():
    import hpo

    spec = hpo.parse_spec({"objective": "hpo.examples.toy:curve", "metric": {"name": "value"},
                           "search": {"algorithm": "bayesian", "sampler": "multifidelity", "max_trials": 10},
                           "space": {"rate": {"type": "float", "low": 0.1, "high": 2.0}}})
    assert spec.search.sampler == "multifidelity"
    with pytest.raises(hpo.SpaceError, match="fix: write \"multifidelity\""):
        hpo.parse_spec({"objective": "hpo.examples.toy:curve", "metric": {"name": "value"},
                        "search": {"algorithm": "bayesian", "sampler": "multifidelty", "max_trials": 10},
                        "space": {"rate": {"type": "float", "low": 0.1, "high": 2.0}}})


def test_several_objectives_are_refused_with_the_fix():
    import hpo

    with pytest.raises(hpo.SpaceError, match='(?s)sampler "multifidelity" with 2 objectives.*fix'):
        hpo.parse_spec({"objective": "hpo.examples.toy:curve",
                        "metric": [{"name": "a"}, {"name": "b"}],
                        "search": {"algorithm": "bayesian", "sampler": "multifidelity", "max_trials": 10},
                        "space": {"rate": {"type": "float", "low": 0.1, "high": 2.0}}})
