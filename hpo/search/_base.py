"""The ask side of ask/tell: the master asks, an engine evaluates, the worker
tells the result to the shared store (which the samplers read)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import optuna

from hpo.trial._state import TrialState

__all__ = ["Proposal", "Searcher"]


@dataclass(frozen=True)
class Proposal:
    """A configuration the master decided to evaluate, already stored as a trial."""

    trial_id: int
    number: int
    params: dict[str, Any]


class Searcher(abc.ABC):
    """Proposes configurations; one per :meth:`ask`, never one already tried.

    Subclasses implement :meth:`_propose`; the base class stores the trial and
    keeps the set of configurations already handed out (including those of an
    earlier, interrupted run of the same study).
    """

    def __init__(self, study: optuna.Study, distributions: dict[str, optuna.distributions.BaseDistribution]):
        self.study = study
        self.distributions = distributions
        self._seen = {_key(t.params) for t in study.get_trials(deepcopy=False) if _counts(t)}

    def ask(self) -> Proposal | None:
        """Store and return the next configuration, or None when none is left."""
        params = self._propose()
        if params is None:
            return None
        self._seen.add(_key(params))
        trial = self.study.ask(fixed_distributions=self.distributions)
        # The proposal sampler returns exactly ``params`` for this trial.
        return Proposal(trial._trial_id, trial.number, dict(trial.params))

    @abc.abstractmethod
    def _propose(self) -> dict[str, Any] | None:
        """The next unseen configuration, or None when the space is exhausted."""

    def _is_new(self, params: dict[str, Any]) -> bool:
        return _key(params) not in self._seen


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def _counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a stored trial used up its configuration (cancelled ones did not)."""
    return TrialState.of(trial) is not TrialState.CANCELLED
