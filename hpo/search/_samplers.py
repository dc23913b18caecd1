"""Grid, random and Bayesian search, built on Optuna's samplers."""

from __future__ import annotations

import copy
import itertools
import random
import warnings
from typing import Any

import optuna

from hpo.errors import UsageError
from hpo.search._base import Proposal, Searcher, _key
from hpo.search._paused import sampler_view
from hpo.space import Grid, is_active, ordered
from hpo.store import StudyStore

__all__ = ["GridSearcher", "SamplerSearcher", "random_sampler", "tpe_sampler", "gp_sampler",
           "startup_trials"]

_TRIES = 20
_ENDED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


class GridSearcher(Searcher):
    """Every point of a lazy grid, in index order (sorted keys, first slowest).

    Sizes are ``grid.size``, never ``len(grid)``, which fails beyond ``sys.maxsize``
    (20 parameters of 10 choices make 10**20 points).
    """

    def __init__(self, study, params, grid: Grid) -> None:
        super().__init__(study, params)
        self._grid = grid
        self._index = 0

    def _exhausted(self) -> bool:
        while self._index < self._grid.size and not self._is_new(self._grid[self._index]):
            self._index += 1
        return self._index >= self._grid.size

    def _propose(self, study, trial):
        self._index += 1
        return self._grid[self._index - 1]


class SamplerSearcher(Searcher):
    """Random or Bayesian search through an Optuna sampler, without duplicates,
    driven as Optuna drives it: ``before_trial`` on each new trial before it
    is sampled, ``after_trial`` once it ended (:meth:`finished`), and a
    ``study.stop()`` in either ends the asking.

    A proposal equal to one already handed out is drawn again. With a
    sampler of hpo's own (``fills_in``), on a finite space that keeps
    returning duplicates, an unseen grid point is taken at random instead,
    and the search ends once every point was tried; a user's sampler has
    the last word (it may have noted its choice on the trial, as GridSampler
    and CmaEsSampler do). Conditional parameters are sampled define-by-run,
    as an Optuna objective would: each only when the values drawn before it
    make it active.
    """

    def __init__(self, study, params, inner: optuna.samplers.BaseSampler,
                 grid: Grid | None, seed: int | None, fills_in: bool = True) -> None:
        super().__init__(study, params)
        self._inner = inner
        self._order = ordered(params)
        self._conditional = any(param.when for param in params.values())
        self.adaptive = not _plain_random(inner)
        self._grid = grid
        self._fills_in = fills_in
        self._rng = random.Random(seed)
        # Configurations an earlier run of this study handed out: a seeded
        # sampler, made afresh, draws its sequence again from the start.
        self._replay = set(self._seen)
        # Trials the sampler was told ended (an earlier run's count as told);
        # None: its after_trial is Optuna's, doing nothing, so none is told.
        tells = type(inner).after_trial is not optuna.samplers.BaseSampler.after_trial
        self._told = {t.number for t in self._store.trials(*_ENDED)} if tells else None
        self._view = sampler_view(study, self._told)  # what the sampler sees and writes through

    def ask_many(self, count: int) -> list[Proposal]:
        # Trials that ended since are told first, so that the sampler never
        # sees an ended trial it was not told of (Optuna tells before storing the end).
        if self._told is not None:
            for trial in self._store.trials(*_ENDED):
                self.finished(trial)
        return super().ask_many(count)

    def finished(self, trial: optuna.trial.FrozenTrial) -> None:
        if self._told is None or trial.number in self._told or not trial.state.is_finished():
            return
        self._told.add(trial.number)
        seen = self._view.trial(StudyStore.trial_id(trial))
        self._inner.after_trial(self._view, seen, seen.state, seen.values)

    def _before_trial(self, trial: optuna.trial.FrozenTrial) -> None:
        self._inner.before_trial(self._view, self._view.trial(StudyStore.trial_id(trial)))

    def _exhausted(self) -> bool:
        return self._view.stopped or (self._grid is not None and len(self._seen) >= self._grid.size)

    def _propose(self, study, trial):
        tries = 0
        while tries < _TRIES:
            params = self._sample(trial)
            if self._is_new(params):
                return params
            if _key(params) in self._replay:
                # The earlier run's own proposal, drawn again: skipped without
                # counting as a duplicate, so that a resumed study goes on with
                # the draws the uninterrupted one would have made.
                self._replay.discard(_key(params))
                tries = 0
                continue
            tries += 1
        return (self._fills_in and self._unseen_grid_point()) or params

    def _sample(self, trial: optuna.trial.FrozenTrial | None) -> dict[str, Any]:
        # The inner sampler sees the stored trials, running ones included
        # (constant liar for TPE), suspended ones by their curves so far, and
        # samples jointly where it can: all parameters of a plain space, what
        # the trials so far share of a conditional one.
        study = self._view
        if trial is not None:  # as stored now: before_trial may have written on it
            trial = self._view.trial(StudyStore.trial_id(trial))
        # A sampler that is not adaptive (plain random) is asked before the trial
        # exists, with None for it: it reads none. Optuna's signatures say a FrozenTrial.
        space = (self._inner.infer_relative_search_space(study, trial) if self._conditional  # type: ignore[arg-type]
                 else self.distributions)
        joint = self._inner.sample_relative(study, trial, space)  # type: ignore[arg-type]
        params: dict[str, Any] = {}
        for name in self._order:
            if is_active(self.params[name], params):
                params[name] = (joint[name] if name in joint else self._inner.sample_independent(
                    study, self._so_far(trial, params), name, self.distributions[name]))  # type: ignore[arg-type]
        return params

    def _so_far(self, trial: optuna.trial.FrozenTrial | None,
                params: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
        """``trial`` with the values drawn for it so far, as Optuna's trial holds
        them when its next parameter is suggested (BruteForceSampler reads them)."""
        if trial is None or not params:
            return trial
        seen = copy.copy(trial)
        seen.params = {**trial.params, **params}
        seen.distributions = {**trial.distributions, **{k: self.distributions[k] for k in params}}
        return seen

    def _unseen_grid_point(self) -> dict[str, Any] | None:
        if self._grid is None:
            return None
        size = self._grid.size
        candidates = [self._rng.randrange(size) for _ in range(100)]
        for index in itertools.chain(candidates, range(size)):  # lazily: the grid may be huge
            if self._is_new(self._grid[index]):
                return self._grid[index]
        return None


def _plain_random(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether ``sampler`` is Optuna's RandomSampler with its ``before_trial``
    doing nothing: it needs no trial to sample, so configurations can be
    chosen before their trials are created, many in one write."""
    base = optuna.samplers.BaseSampler
    return (isinstance(sampler, optuna.samplers.RandomSampler)
            and type(sampler).before_trial is base.before_trial)


def random_sampler(seed: int | None = None, max_trials: int = 0,
                   conditional: bool = False) -> optuna.samplers.BaseSampler:
    """Optuna's RandomSampler (random search)."""
    return optuna.samplers.RandomSampler(seed=seed)


def tpe_sampler(seed: int | None = None, max_trials: int = 0,
                conditional: bool = False) -> optuna.samplers.BaseSampler:
    """Multivariate TPE with the constant liar (running trials count as bad),
    random for the first third of the budget (2 to 10 trials). On a
    conditional space, grouped: one joint model per set of parameters that
    occur together, as Optuna advises for define-by-run spaces."""
    with warnings.catch_warnings():  # "group" is experimental since Optuna 2.8; stable in use
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True, group=conditional,
            n_startup_trials=startup_trials(max_trials),
        )


def startup_trials(max_trials: int) -> int:
    """Trials an adaptive sampler draws at random before it learns: a third
    of the budget, 2 to 10."""
    return max(2, min(10, max_trials // 3))


def gp_sampler(seed: int | None = None, max_trials: int = 0,
               conditional: bool = False) -> optuna.samplers.BaseSampler:
    """Optuna's Gaussian-process sampler; needs torch and scipy."""
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"bayesian search with sampler \"gp\" needs torch and scipy ({exc}).\n"
            "  fix: pip install 'hpo[gp]', or use \"sampler\": \"tpe\""
        ) from exc
    return optuna.samplers.GPSampler(seed=seed)
