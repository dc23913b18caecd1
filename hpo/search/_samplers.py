"""Grid, random and Bayesian search, built on Optuna's samplers."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import optuna

from hpo.errors import UsageError
from hpo.search._base import Searcher

__all__ = ["GridSearcher", "SamplerSearcher", "ProposalSampler"]

_TRIES = 20


class ProposalSampler(optuna.samplers.BaseSampler):
    """Hands Optuna's ``study.ask`` the configuration a Searcher chose.

    All parameters are sampled jointly (as one "relative" sample), so a whole
    configuration exists, and can be checked against those already tried,
    before anything is written to the store.
    """

    def __init__(self, distributions: dict[str, optuna.distributions.BaseDistribution]) -> None:
        self._distributions = distributions
        self.next_params: dict[str, Any] = {}

    def infer_relative_search_space(self, study, trial):
        return self._distributions

    def sample_relative(self, study, trial, search_space):
        return self.next_params

    def sample_independent(self, study, trial, param_name, param_distribution):
        raise RuntimeError(f"parameter {param_name!r} was not proposed")  # a bug, not user input


class _ProposingSearcher(Searcher):
    """Feeds each proposal to the study's ProposalSampler before asking."""

    def _set_next(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        if params is not None:
            self.study.sampler.next_params = params
        return params


class GridSearcher(_ProposingSearcher):
    """Every point of a lazy grid, in index order (sorted keys, first slowest)."""

    def __init__(self, study, distributions, grid: Sequence[dict[str, Any]]) -> None:
        super().__init__(study, distributions)
        self._grid = grid
        self._index = 0

    def _propose(self):
        while self._index < len(self._grid):
            params = self._grid[self._index]
            self._index += 1
            if self._is_new(params):
                return self._set_next(params)
        return None


class SamplerSearcher(_ProposingSearcher):
    """Random or Bayesian search through an Optuna sampler, without duplicates.

    A proposal equal to one already handed out is drawn again; on a finite
    space that keeps returning duplicates, an unseen grid point is taken at
    random instead, and the search ends once every point was tried.
    """

    def __init__(self, study, distributions, inner: optuna.samplers.BaseSampler,
                 grid: Sequence[dict[str, Any]] | None, seed: int | None) -> None:
        super().__init__(study, distributions)
        self._inner = inner
        self._grid = grid
        self._rng = random.Random(seed)

    def _propose(self):
        if self._grid is not None and len(self._seen) >= len(self._grid):
            return None
        for _ in range(_TRIES):
            params = self._sample()
            if self._is_new(params):
                return self._set_next(params)
        return self._set_next(self._unseen_grid_point())

    def _sample(self) -> dict[str, Any]:
        # The trial being proposed does not exist yet; the inner sampler sees
        # the stored trials (running ones included: constant liar for TPE).
        template = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
        template.number = len(self.study.get_trials(deepcopy=False))
        joint = self._inner.sample_relative(self.study, template, self.distributions)
        return {
            name: joint[name] if name in joint
            else self._inner.sample_independent(self.study, template, name, dist)
            for name, dist in self.distributions.items()
        }

    def _unseen_grid_point(self) -> dict[str, Any] | None:
        if self._grid is None:
            return None
        size = len(self._grid)
        candidates: list[int] = [self._rng.randrange(size) for _ in range(100)]
        for index in candidates + list(range(size)):
            if self._is_new(self._grid[index]):
                return self._grid[index]
        return None


def make_inner_sampler(algorithm: str, sampler: str, seed: int | None, max_trials: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind ``random`` or ``bayesian`` search."""
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sampler == "gp":
        try:
            return optuna.samplers.GPSampler(seed=seed)
        except ImportError as exc:
            raise UsageError(
                f"bayesian search with sampler \"gp\" needs torch and scipy ({exc}).\n"
                "  fix: pip install 'hpo[gp]', or use \"sampler\": \"tpe\""
            ) from exc
    startup = max(2, min(10, max_trials // 3))
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup,
    )

