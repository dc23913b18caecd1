"""What a sampler sees of unfinished trials: queued ones as running, and
suspended ones by their curve so far.

A queued trial is WAITING in Optuna, which samplers skip: shown as RUNNING, it
counts as a trial under way (TPE's constant liar), as it is. A trial suspended
by a time-sharing policy is WAITING too; as running, TPE would count it with
the constant liar, as bad as can be, and learn nothing from the quanta it
already trained. Shown as PRUNED at its last reported step, it counts as
Optuna counts a pruned trial: by its last intermediate value, ranked below
trials that got further. Nothing is written: the store keeps the trial
WAITING, to be resumed.
"""

from __future__ import annotations

import copy
from collections.abc import Container
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.store.records import TrialStatus, status_of

__all__ = ["paused_view", "as_seen"]


def as_seen(trial: FrozenTrial) -> FrozenTrial:
    """``trial`` as samplers should see it: a suspended trial with reports as
    PRUNED (its last reported value), any other unfinished one as RUNNING,
    a finished one as it is."""
    if trial.state.is_finished():
        return trial
    suspended = trial.intermediate_values and status_of(trial) is TrialStatus.SUSPENDED
    state = TrialState.PRUNED if suspended else TrialState.RUNNING
    if trial.state == state:
        return trial
    seen = copy.copy(trial)
    seen.state = state
    return seen


class _PausedView:
    """A study whose trials read as :func:`as_seen` says; everything else is
    the study's own (samplers read trials through ``_get_trials``)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        # Read afresh: the study's cache is only reset by study.ask(), which
        # the searcher does not call (it would pop a queued trial).
        trials = map(as_seen, self._study._get_trials(deepcopy=deepcopy, states=None))
        return [t for t in trials if states is None or t.state in states]

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


def paused_view(study: optuna.Study) -> optuna.Study:
    """``study`` with its suspended trials shown to samplers as pruned ones."""
    return _PausedView(study)  # type: ignore[return-value]
