"""What a sampler sees of the study: queued trials as running, suspended
ones by their curve so far, and what it wrote on trials once they ended.

A queued trial is WAITING in Optuna, which samplers skip: shown as RUNNING, it
counts as a trial under way (TPE's constant liar), as it is. A trial suspended
by a time-sharing policy is WAITING too; as running, TPE would count it with
the constant liar, as bad as can be, and learn nothing from the quanta it
already trained. Shown as PRUNED at its last reported step, it counts as
Optuna counts a pruned trial: by its last intermediate value, ranked below
trials that got further. Nothing is written: the store keeps the trial
WAITING, to be resumed.

Optuna calls a sampler's ``after_trial`` before it stores the trial's end;
in hpo a worker stores it and the master learns of it after. What the
sampler then writes on the trial (the "constraints" of TPE, NSGA-II and GP)
cannot go on the trial itself: every Optuna storage refuses to change a
finished trial, and hpo's readers rely on that. It is stored as the study
system attribute ``hpo:sampler:<trial number>`` (those attributes of that
trial), and samplers, and :func:`sampler_view`'s readers, see it among the
trial's system attributes, as they would in Optuna.
"""

from __future__ import annotations

import copy
from collections.abc import Container
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.store.records import TrialStatus, status_of

__all__ = ["sampler_view", "paused_view", "as_seen", "LATE_ATTR"]

LATE_ATTR = "hpo:sampler:"  # + the trial's number, 6 digits


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


class _LateAttrs:
    """System attributes samplers wrote on trials after they ended, by trial
    number; read once, then kept up to date by this master (the only writer)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_id: int) -> None:
        self._storage, self._study_id = storage, study_id
        attrs = storage.get_study_system_attrs(study_id)
        self._by_number = {int(key[len(LATE_ATTR):]): value for key, value in attrs.items()
                           if key.startswith(LATE_ATTR)}

    def write(self, trial: FrozenTrial, key: str, value: Any) -> None:
        attrs = {**self._by_number.get(trial.number, {}), key: value}
        self._storage.set_study_system_attr(self._study_id, f"{LATE_ATTR}{trial.number:06d}", attrs)
        self._by_number[trial.number] = attrs

    def onto(self, trial: FrozenTrial) -> FrozenTrial:
        late = self._by_number.get(trial.number)
        if not late:
            return trial
        seen = copy.copy(trial)
        seen.system_attrs = {**trial.system_attrs, **late}
        return seen


class _SeenStorage:
    """The study's storage as samplers reach it (GridSampler and
    BruteForceSampler read trials from it directly): trials as seen, and a
    sampler's writes on an ended trial kept aside. Everything else is the
    storage's own."""

    def __init__(self, storage: optuna.storages.BaseStorage, late: _LateAttrs,
                 told: Container[int] | None) -> None:
        self._storage, self._late, self._told = storage, late, told

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        # Read afresh: the study's cache is only reset by study.ask(), which
        # the searcher does not call (it would pop a queued trial).
        trials = map(self._seen, self._storage.get_all_trials(study_id, deepcopy=False))
        chosen = [t for t in trials if states is None or t.state in states]
        return copy.deepcopy(chosen) if deepcopy else chosen

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._seen(self._storage.get_trial(trial_id))

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        return self.get_trial(trial_id).system_attrs

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        trial = self._storage.get_trial(trial_id)
        if trial.state.is_finished():  # after_trial: the worker ended it already
            self._late.write(trial, key, value)
        else:
            self._storage.set_trial_system_attr(trial_id, key, value)

    def _seen(self, trial: FrozenTrial) -> FrozenTrial:
        if self._told is not None and trial.state.is_finished() and trial.number not in self._told:
            return _running(trial)  # in Optuna, a trial ends once its sampler was told
        return self._late.onto(as_seen(trial))


def _running(trial: FrozenTrial) -> FrozenTrial:
    seen = copy.copy(trial)
    seen.state, seen.values = TrialState.RUNNING, None
    return seen


if TYPE_CHECKING:  # the view stands in for a Study wherever samplers take one
    _StudyLike = optuna.Study
else:
    _StudyLike = object


class _SamplerView(_StudyLike):
    """A study as :func:`sampler_view` says; everything else is the study's
    own. ``stopped`` says whether a sampler called :meth:`stop`."""

    def __init__(self, study: optuna.Study, told: Container[int] | None = None) -> None:
        self._study = study
        late = _LateAttrs(study._storage, study._study_id)
        # A proxy of the study's storage, as samplers reach it.
        self._storage = cast(optuna.storages.BaseStorage, _SeenStorage(study._storage, late, told))
        self.stopped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        return self._storage.get_all_trials(self._study._study_id, deepcopy=deepcopy, states=states)

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()

    def trial(self, trial_id: int) -> FrozenTrial:
        """Trial ``trial_id`` as samplers see it."""
        return self._storage.get_trial(trial_id)

    def stop(self) -> None:
        """What a sampler's ``study.stop()`` does: the study asks for no more
        trials (Optuna's own refuses outside ``optimize``)."""
        self.stopped = True


def sampler_view(study: optuna.Study, told: Container[int] | None = None) -> _SamplerView:
    """``study`` as hpo shows it to samplers: queued trials as running,
    suspended ones as pruned at their last report, and each trial with the
    system attributes samplers wrote once it ended (its "constraints").
    With ``told`` (the numbers of the ended trials the sampler was told of),
    an ended trial not among them still reads as running.

    Examples
    --------
    >>> storage = optuna.storages.InMemoryStorage()
    >>> study = optuna.create_study(storage=storage)
    >>> study.enqueue_trial({"x": 1.0})
    >>> [t.state.name for t in sampler_view(study).trials]  # queued: running, to a sampler
    ['RUNNING']
    """
    return _SamplerView(study, told)


paused_view = sampler_view  # its earlier name
