"""Bayesian search that learns from partial learning curves (BOHB's model
per budget: Falkner, Klein and Hutter, "BOHB: Robust and Efficient
Hyperparameter Optimization at Scale", ICML 2018).

Pruners and time-sharing policies stop most trials early: a sampler that
learns from finished trials alone (TPE) sees few. Here every report counts.
A *budget* is a number of steps; the values all trials reported at that
step, the running and the suspended ones included, are one data set. TPE is
fitted on the largest budget with enough points (BOHB's rule: the
dimension plus two), so the model follows the trials as they get further,
and a paused trial's curve informs the next proposal while it waits. A
third of the proposals are random, as in BOHB, which keeps its guarantee of
random search's convergence. Asynchronous: each proposal uses what the
study holds at that moment; there are no rounds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

__all__ = ["MultiFidelitySampler", "multifidelity_sampler", "budgets"]

ETA = 3  # budgets grow by this factor (Hyperband's and ASHA's rungs: 1, 3, 9, 27...)
RANDOM_FRACTION = 1 / 3  # BOHB's rho


def budgets(longest: int, eta: int = ETA) -> list[int]:
    """The budgets, in steps, up to ``longest`` (itself included).

    >>> budgets(52)
    [1, 3, 9, 27, 52]
    """
    found, budget = [], 1
    while budget < longest:
        found.append(budget)
        budget *= eta
    return [*found, longest] if longest >= 1 else []


class MultiFidelitySampler(optuna.samplers.BaseSampler):
    """TPE on the values trials reported at the largest budget that holds
    enough of them; random until one does, and a third of the time.

    Parameters
    ----------
    seed:
        Seeds the random draws and the models.
    random_fraction:
        Share of proposals drawn at random (BOHB: 1/3).
    min_points:
        Points a budget needs for a model (default: the dimension plus 2).
    """

    def __init__(self, seed: int | None = None, random_fraction: float = RANDOM_FRACTION,
                 min_points: int | None = None) -> None:
        self._rng = np.random.RandomState(seed)
        self._seed = seed
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self.random_fraction = random_fraction
        self.min_points = min_points
        self._models: dict[int, tuple[optuna.Study, set[int]]] = {}  # budget -> model, trials in it
        self.last_budget: int | None = None  # the budget of the last proposal's model (None: random)

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The parameters every trial with a value has, alike (Optuna's
        intersection search space, running trials included: their reports
        count here)."""
        common: dict[str, BaseDistribution] | None = None
        for seen in study.get_trials(deepcopy=False):
            if seen.state == TrialState.COMPLETE or seen.intermediate_values:
                dists = seen.distributions
                common = dict(dists) if common is None else {
                    name: dist for name, dist in common.items() if dists.get(name) == dist}
        return dict(sorted((common or {}).items()))

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self.last_budget = None
        if not search_space or self._rng.rand() < self.random_fraction:
            return {}
        trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
        budget = self._budget(trials, len(search_space))
        if budget is None:
            return {}
        model = self._model(study, budget, trials, search_space)
        with warnings.catch_warnings():  # fixed_distributions: a sampler's own model study
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            proposal = model.ask(fixed_distributions=search_space)
        model.tell(proposal, state=TrialState.FAIL)  # a proposal, not a point: the model skips it
        self.last_budget = budget
        return {name: proposal.params[name] for name in search_space}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def _budget(self, trials: Sequence[FrozenTrial], dimension: int) -> int | None:
        """The largest budget with enough values, or None."""
        needed = self.min_points or dimension + 2
        reached = [max(t.intermediate_values) + 1 for t in trials]
        for budget in reversed(budgets(max(reached, default=0))):
            if sum(r >= budget for r in reached) >= needed:
                return budget
        return None

    def _model(self, study: optuna.Study, budget: int, trials: Sequence[FrozenTrial],
               space: dict[str, BaseDistribution]) -> optuna.Study:
        """TPE's study of the values at ``budget`` steps; values once reported
        never change, so each trial is added once."""
        if budget not in self._models:
            sampler = optuna.samplers.TPESampler(seed=self._model_seed(budget), multivariate=True,
                                                 n_startup_trials=0)
            model = optuna.create_study(direction=study.direction, sampler=sampler)
            self._models[budget] = (model, set())
        model, added = self._models[budget]
        step = budget - 1
        for t in trials:
            value = t.intermediate_values.get(step)
            if t.number in added or value is None or not math.isfinite(value):
                continue
            if not all(name in t.params for name in space):
                continue
            model.add_trial(optuna.trial.create_trial(
                params={name: t.params[name] for name in space},
                distributions={name: space[name] for name in space}, value=value))
            added.add(t.number)
        return model

    def _model_seed(self, budget: int) -> int | None:
        return None if self._seed is None else (self._seed * 7919 + budget) % 2**31


def multifidelity_sampler(seed: int | None = None, max_trials: int = 0,
                          conditional: bool = False) -> optuna.samplers.BaseSampler:
    """:class:`MultiFidelitySampler` (the space's ``"sampler": "multifidelity"``)."""
    return MultiFidelitySampler(seed=seed)
