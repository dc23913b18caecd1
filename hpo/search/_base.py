"""The ask side of ask/tell: the master asks, an engine evaluates, the worker
tells the result to the shared store (which the samplers read)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from hpo.space import Param
from hpo.store import StudyStore
from hpo.store.records import TrialStatus, status_of

__all__ = ["Proposal", "Searcher", "ProposalSampler"]


@dataclass(frozen=True)
class Proposal:
    """A configuration the master decided to evaluate, already stored as a trial."""

    trial_id: int
    number: int
    params: dict[str, Any]


class ProposalSampler(optuna.samplers.BaseSampler):
    """The study's sampler: hands ``study.ask`` what the Searcher proposes.

    All parameters are sampled jointly, as one "relative" sample, so that a
    whole configuration exists, and can be checked against those already
    tried, before anything is written to the store.
    """

    def __init__(self, distributions: dict[str, optuna.distributions.BaseDistribution]) -> None:
        self._distributions = distributions
        # Set by the Searcher: (study, trial) -> params, and (trial) -> None, Optuna's before_trial.
        self.propose: Callable[[optuna.Study, optuna.trial.FrozenTrial | None], dict[str, Any]] | None = None
        self.before: Callable[[optuna.trial.FrozenTrial], None] | None = None

    def before_trial(self, study, trial):
        if self.before is not None:  # optuna.Trial calls it on the trial just created
            self.before(trial)

    def infer_relative_search_space(self, study, trial):
        return self._distributions

    def sample_relative(self, study, trial, search_space):
        if self.propose is None:
            raise RuntimeError("hpo internal error: a Searcher proposes through it")
        return self.propose(study, trial)

    def sample_independent(self, study, trial, param_name, param_distribution):
        raise RuntimeError(f"parameter {param_name!r} was not proposed")  # a bug, not user input


class Searcher(abc.ABC):
    """Proposes configurations, one per :meth:`ask`, never one already tried.

    Subclasses implement :meth:`_propose` and :meth:`_exhausted`. The base
    class stores the trial and keeps the set of configurations handed out,
    including those of an earlier, interrupted run of the same study. A
    configuration holds its active parameters only (conditional spaces).
    """

    #: Whether proposals need their trial first. Adaptive ones are sampled on
    #: the stored trial, as Optuna's ``study.ask`` samples (TPE reads it, a
    #: sampler's ``before_trial`` prepares it); the others are chosen first and
    #: the trial is created with them in one journal write.
    adaptive = False

    def __init__(self, study: optuna.Study, params: Mapping[str, Param]):
        self.study = study
        self.params = params
        self.distributions = {name: param.distribution() for name, param in params.items()}
        self._store = StudyStore.of(study)
        sampler = cast(ProposalSampler, study.sampler)  # the one create_study() gave the study
        sampler.propose = self._propose
        sampler.before = self._before_trial
        self._seen = {_key(t.params) for t in study.get_trials(deepcopy=False) if _counts(t)}

    def ask(self) -> Proposal | None:
        """Store and return the next configuration, or None when none is left."""
        asked = self.ask_many(1)
        return asked[0] if asked else None

    def ask_many(self, count: int) -> list[Proposal]:
        """Store and return up to ``count`` configurations (fewer when the
        space runs out). A search that does not learn from results stores
        them in one write; an adaptive one asks one at a time, as each
        proposal is sampled on its trial."""
        if self.adaptive:
            proposals: list[Proposal] = []
            while len(proposals) < count and not self._exhausted():
                # What study.ask() does, without popping a queued (WAITING) trial.
                trial_id, _ = self._store.create_trial({}, {})
                trial = optuna.Trial(self.study, trial_id)
                for name in trial.relative_params:  # the proposal, sampled on the new trial
                    _suggest(trial, name, self.distributions[name])
                params = dict(trial.params)
                self._seen.add(_key(params))
                proposals.append(Proposal(StudyStore.trial_id(trial), trial.number, params))
            return proposals
        chosen: list[dict[str, Any]] = []
        while len(chosen) < count and not self._exhausted():
            params = self._propose(self.study, None)
            self._seen.add(_key(params))
            chosen.append(params)
        created = self._store.create_trials(
            [(params, {k: self.distributions[k] for k in params}) for params in chosen])
        return [Proposal(trial_id, number, params) for (trial_id, number), params in zip(created, chosen)]

    def finished(self, trial: optuna.trial.FrozenTrial) -> None:
        """Tell the search that ``trial``, as stored, ended: what Optuna's
        ``study.tell`` does for its sampler (``after_trial``). The master
        calls it for each trial it learns ended; once per trial."""

    def _before_trial(self, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's ``before_trial``, on an adaptive search's new trial."""

    @abc.abstractmethod
    def _exhausted(self) -> bool:
        """Whether no unseen configuration is left."""

    @abc.abstractmethod
    def _propose(self, study: optuna.Study, trial: optuna.trial.FrozenTrial | None) -> dict[str, Any]:
        """A configuration not seen yet: for ``trial``, just created in the store,
        when adaptive; else (``trial`` None) for a trial about to be created."""

    def _is_new(self, params: dict[str, Any]) -> bool:
        return _key(params) not in self._seen


def _suggest(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> Any:
    """Store the proposed value of ``name`` on ``trial``, as ``study.ask`` would."""
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step,
                                 log=distribution.log)
    if not isinstance(distribution, FloatDistribution):
        raise RuntimeError("hpo internal error: hpo's parameters have these three kinds")
    return trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step,
                               log=distribution.log)


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def _counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a stored trial used up its configuration (cancelled ones did not)."""
    return status_of(trial) is not TrialStatus.CANCELLED
