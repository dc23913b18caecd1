"""What a sampler sees of suspended trials: their curve so far.

A trial suspended by a time-sharing policy is RUNNING in Optuna, so TPE would
count it as running (with the constant liar, as bad as can be) and learn
nothing from the quanta it already trained. Shown as PRUNED at its last
reported step, it counts as Optuna counts a pruned trial: by its last
intermediate value, ranked below trials that got further. Nothing is written:
the store keeps the trial RUNNING, to be resumed.
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
    PRUNED (its last reported value), any other as it is."""
    if trial.state != TrialState.RUNNING or not trial.intermediate_values \
            or status_of(trial) is not TrialStatus.SUSPENDED:
        return trial
    seen = copy.copy(trial)
    seen.state = TrialState.PRUNED
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
        trials = map(as_seen, self._study._get_trials(deepcopy=deepcopy, states=None, use_cache=use_cache))
        return [t for t in trials if states is None or t.state in states]

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


def paused_view(study: optuna.Study) -> optuna.Study:
    """``study`` with its suspended trials shown to samplers as pruned ones."""
    return _PausedView(study)  # type: ignore[return-value]
