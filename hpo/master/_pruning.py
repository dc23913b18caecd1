"""Pruning in the master: Optuna's median, successive-halving (ASHA) and
Hyperband pruners, with statistics kept as reports land.

The study's relay asks the pruner after each report it writes and sends the
verdict back with the report's acknowledgement (``trial.should_stop()`` then
reads it), so a decision sees the curves of trials on every host. Optuna's
pruners scan every trial of the study at each call (measured: 2.3 ms a call
for the median pruner at 10,000 trials, growing with the study); the master
answers thousands of reports a second, so the pruners a space names keep,
instead, what their rule needs as reports and ends go by: a sorted list of
the completed trials' values per step (median), a sorted list of values per
rung (ASHA, and Hyperband's brackets of it). They decide as Optuna's
pruners with the same settings decide when asked after every report (the
tests compare them decision by decision). A pruner object passed to
``hpo.run(pruner=...)`` is asked as Optuna asks it, on the master's replica,
off the relay's thread.

The names a space may use are :data:`hpo.registry.PRUNERS`.
"""

from __future__ import annotations

import binascii
import math
import pickle
from bisect import bisect_left, insort
from collections import defaultdict
from typing import Any

import optuna

from hpo.registry import PRUNERS
from hpo.store import StudyStore

__all__ = ["make_pruning", "MedianPruning", "AshaPruning", "HyperbandPruning", "OptunaPruning",
           "median_pruning", "asha_pruning", "hyperband_pruning"]


def make_pruning(settings: dict[str, Any] | None, *, maximize: bool, study_name: str, metric: str,
                 pruner: optuna.pruners.BasePruner | None = None) -> Any:
    """The master's pruner for a space's ``early_stopping`` settings
    (``{"pruner": name, "min_steps": k}``), or for an Optuna ``pruner``
    object; None when nothing prunes.

    >>> type(make_pruning({"pruner": "asha", "min_steps": 2}, maximize=True, study_name="s",
    ...                   metric="acc")).__name__
    'AshaPruning'
    """
    if pruner is not None:
        return OptunaPruning(pruner, metric)
    settings = settings or {}
    return PRUNERS.make(settings.get("pruner", "none"), min_steps=int(settings.get("min_steps", 0)),
                        maximize=maximize, study_name=study_name, metric=metric)


def median_pruning(min_steps: int = 0, **kwargs: Any) -> MedianPruning:
    """Below the median of the completed trials at the same step, after
    ``min_steps`` (Optuna's ``MedianPruner(n_startup_trials=2, n_warmup_steps=min_steps)``)."""
    return MedianPruning(n_startup_trials=2, n_warmup_steps=min_steps, **kwargs)


def asha_pruning(min_steps: int = 0, **kwargs: Any) -> AshaPruning:
    """Asynchronous successive halving, ``min_steps`` the first rung
    (Optuna's ``SuccessiveHalvingPruner(min_resource=max(1, min_steps))``)."""
    return AshaPruning(min_resource=max(1, min_steps), **kwargs)


def hyperband_pruning(min_steps: int = 0, **kwargs: Any) -> HyperbandPruning:
    """Hyperband's brackets of successive halving (Optuna's
    ``HyperbandPruner(min_resource=max(1, min_steps))``)."""
    return HyperbandPruning(min_resource=max(1, min_steps), **kwargs)


class _Pruning:
    """What every pruner here shares: the words of a verdict."""

    slow = False
    name = "pruner"

    def __init__(self, *, maximize: bool = True, study_name: str = "", metric: str = "value") -> None:
        self.maximize, self.study_name, self.metric = maximize, study_name, metric

    def observe(self, number: int, step: int, values: dict[int, float]) -> None:
        pass

    def completed(self, number: int, values: dict[int, float]) -> None:
        pass

    def learnt(self) -> bytes | None:
        """What :meth:`observe` and :meth:`completed` learnt from the study's
        records so far, with the settings they learnt it under, for the
        store's snapshot (the next master starts from it instead of
        replaying every record: :mod:`hpo.store._relay`); None when they
        learn nothing."""
        kind = type(self)
        if kind.observe is _Pruning.observe and kind.completed is _Pruning.completed:
            return None
        return pickle.dumps(vars(self), protocol=pickle.HIGHEST_PROTOCOL)

    def relearn(self, learnt: bytes) -> None:
        """Know again what :meth:`learnt` gave (by a pruner of these settings)."""
        vars(self).update(pickle.loads(learnt))

    def _why(self, step: int, values: dict[int, float]) -> str:
        value = values.get(step)
        shown = "no value" if value is None else f"{value:.4g}"
        return (f"{self.name} pruner: {self.metric}={shown} at step {step} is hopeless "
                "against the other trials' curves in the store")


class MedianPruning(_Pruning):
    """Optuna's ``PercentilePruner`` rule (the median at 50), from per-step
    sorted values of the completed trials."""

    name = "median"

    def __init__(self, percentile: float = 50.0, n_startup_trials: int = 5, n_warmup_steps: int = 0,
                 interval_steps: int = 1, n_min_trials: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.percentile, self.n_startup_trials = percentile, n_startup_trials
        self.n_warmup_steps, self.interval_steps, self.n_min_trials = n_warmup_steps, interval_steps, n_min_trials
        self._completed = 0
        self._at: dict[int, list[float]] = defaultdict(list)  # step -> sorted values (NaN aside)
        self._nan_at: dict[int, int] = defaultdict(int)

    def completed(self, number: int, values: dict[int, float]) -> None:
        self._completed += 1
        for step, value in values.items():
            if math.isnan(value):
                self._nan_at[step] += 1
            else:
                insort(self._at[step], value)

    def decide(self, trial_id: int, number: int, step: int, values: dict[int, float]) -> str | None:
        if not values or self._completed == 0 or self._completed < self.n_startup_trials:
            return None
        step = max(values)
        if step < self.n_warmup_steps or not self._first_in_interval(step, values):
            return None
        finite = [v for v in values.values() if not math.isnan(v)]
        if not finite:
            return self._why(step, values)
        best = max(finite) if self.maximize else min(finite)
        cut = self._percentile_at(step)
        if math.isnan(cut):
            return None
        hopeless = best < cut if self.maximize else best > cut
        return self._why(step, values) if hopeless else None

    def _first_in_interval(self, step: int, values: dict[int, float]) -> bool:
        nearest = (step - self.n_warmup_steps) // self.interval_steps * self.interval_steps \
            + self.n_warmup_steps
        second_last = max((s for s in values if s != step), default=-1)
        return second_last < nearest

    def _percentile_at(self, step: int) -> float:
        """``np.nanpercentile`` of the completed trials' values at ``step``
        (linear interpolation, as NumPy computes it)."""
        known = self._at.get(step, [])
        if len(known) + self._nan_at.get(step, 0) < self.n_min_trials or not known:
            return math.nan
        q = (100 - self.percentile if self.maximize else self.percentile) / 100
        rank = (len(known) - 1) * q
        low = math.floor(rank)
        high = min(low + 1, len(known) - 1)
        t = rank - low
        a, b = known[low], known[high]
        return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


class _Rungs:
    """One successive-halving ladder (Optuna's ``SuccessiveHalvingPruner``):
    the values that reached each rung, sorted, and each trial's rung."""

    def __init__(self, min_resource: int, reduction_factor: int, min_early_stopping_rate: int,
                 bootstrap_count: int, maximize: bool) -> None:
        self.min_resource, self.reduction_factor = min_resource, reduction_factor
        self.min_early_stopping_rate, self.bootstrap_count = min_early_stopping_rate, bootstrap_count
        self.maximize = maximize
        self._values: dict[int, list[float]] = defaultdict(list)  # rung -> sorted values
        self._rung: dict[int, int] = {}  # trial number -> its next rung

    def judge(self, number: int, step: int, value: float) -> bool:
        """Record the rungs the trial's latest report reaches; whether it is pruned."""
        rung = self._rung.get(number, 0)
        while True:
            promotion = self.min_resource * self.reduction_factor ** (self.min_early_stopping_rate + rung)
            if step < promotion:
                return False
            if math.isnan(value):
                return True
            others = self._values[rung]
            promotable = self._promotable(value, others)
            count = len(others) + 1
            insort(others, value)
            self._rung[number] = rung + 1
            if count <= self.bootstrap_count or not promotable:
                return True
            rung += 1

    def _promotable(self, value: float, others: list[float]) -> bool:
        """Whether ``value`` is in the top 1/reduction_factor of ``others`` and itself."""
        count = len(others) + 1
        index = max(count // self.reduction_factor - 1, 0)
        if self.maximize:
            index = count - 1 - index
        where = bisect_left(others, value)
        kth = others[index] if index < where else value if index == where else others[index - 1]
        return value >= kth if self.maximize else value <= kth


class AshaPruning(_Pruning):
    """Asynchronous successive halving, as Optuna's pruner decides when asked
    after every report."""

    name = "asha"

    def __init__(self, min_resource: int = 1, reduction_factor: int = 4,
                 min_early_stopping_rate: int = 0, bootstrap_count: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rungs = _Rungs(min_resource, reduction_factor, min_early_stopping_rate, bootstrap_count,
                             self.maximize)
        self._pruned: dict[int, int] = {}  # trial number -> the step its verdict was made at

    def observe(self, number: int, step: int, values: dict[int, float]) -> None:
        last = max(values)
        if self._rungs.judge(number, last, values[last]):
            self._pruned[number] = last

    def decide(self, trial_id: int, number: int, step: int, values: dict[int, float]) -> str | None:
        pruned_at = self._pruned.get(number)
        return None if pruned_at is None else self._why(pruned_at, values)


class HyperbandPruning(_Pruning):
    """Hyperband as Optuna's pruner runs it: brackets of successive halving,
    a trial's bracket from a hash of the study's name and its number, set up
    (``max_resource="auto"``) once a trial has completed."""

    name = "hyperband"

    def __init__(self, min_resource: int = 1, max_resource: int | str = "auto",
                 reduction_factor: int = 3, bootstrap_count: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_resource, self.max_resource = min_resource, max_resource
        self.reduction_factor, self.bootstrap_count = reduction_factor, bootstrap_count
        self._brackets: list[_Rungs] = []
        self._budgets: list[int] = []
        self._longest_completed: int | None = None  # the largest last step of a completed trial
        self._pruned: dict[int, int] = {}

    def completed(self, number: int, values: dict[int, float]) -> None:
        if values:
            self._longest_completed = max(self._longest_completed or 0, max(values))

    def observe(self, number: int, step: int, values: dict[int, float]) -> None:
        if not self._brackets and not self._set_up():
            return
        last = max(values)
        if self._brackets[self._bracket(number)].judge(number, last, values[last]):
            self._pruned[number] = last

    def decide(self, trial_id: int, number: int, step: int, values: dict[int, float]) -> str | None:
        pruned_at = self._pruned.get(number)
        return None if pruned_at is None else self._why(pruned_at, values)

    def _set_up(self) -> bool:
        max_resource = self.max_resource
        if max_resource == "auto":
            if self._longest_completed is None:
                return False
            max_resource = self._longest_completed + 1
        if isinstance(max_resource, str):
            raise RuntimeError("hpo internal error: \"auto\" is the only word")
        count = math.floor(math.log(max_resource / self.min_resource, self.reduction_factor)) + 1
        for bracket in range(count):
            s = count - 1 - bracket
            self._budgets.append(math.ceil(count * self.reduction_factor ** s / (s + 1)))
            self._brackets.append(_Rungs(self.min_resource, self.reduction_factor, bracket,
                                         self.bootstrap_count, self.maximize))
        return True

    def _bracket(self, number: int) -> int:
        n = binascii.crc32(f"{self.study_name}_{number}".encode()) % sum(self._budgets)
        for bracket, budget in enumerate(self._budgets):
            n -= budget
            if n < 0:
                return bracket
        return len(self._budgets) - 1


class OptunaPruning(_Pruning):
    """Any Optuna pruner object, asked as Optuna asks it (``prune(study,
    trial)``) on the master's replica; its cost grows with the study, so the
    relay asks it off its own thread."""

    slow = True

    def __init__(self, pruner: optuna.pruners.BasePruner, metric: str) -> None:
        super().__init__(maximize=True, metric=metric)
        self.pruner = pruner
        self.name = type(pruner).__name__
        self._study: optuna.Study | None = None

    def attach(self, study: optuna.Study) -> None:
        """The study the pruner reads (the master's, over its replica)."""
        self._study = study

    def decide(self, trial_id: int, number: int, step: int, values: dict[int, float]) -> str | None:
        if self._study is None:
            return None
        trial = StudyStore.of(self._study).trial(trial_id)
        return self._why(step, values) if self.pruner.prune(self._study, trial) else None
