"""The handle an objective receives: ``train(config, trial)``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from numbers import Real
from pathlib import Path
from typing import Any

import optuna

from hpo.pruning import make_pruner
from hpo.trial._state import REPORT_ATTR, STOP_ATTR

__all__ = ["Trial"]


@dataclass
class _StoreLink:
    """Where a trial's reports go, and where its stop signals come from."""

    storage: optuna.storages.BaseStorage
    study_name: str
    study_id: int
    trial_id: int
    metric: str
    early_stopping: dict[str, Any] | None = None

    def report(self, step: int, metrics: dict[str, float]) -> None:
        # Each call appends (and fsyncs) before returning: durable when acknowledged.
        if self.metric in metrics:
            self.storage.set_trial_intermediate_value(self.trial_id, step, metrics[self.metric])
        self.storage.set_trial_user_attr(self.trial_id, f"{REPORT_ATTR}{step:06d}", metrics)

    def stop_reason(self) -> str | None:
        stop = self.storage.get_study_user_attrs(self.study_id).get(STOP_ATTR)
        if stop:
            return f"study stopped: {stop['reason']}"
        if self._pruner and self._pruner.prune(self._study, self.storage.get_trial(self.trial_id)):
            return "pruned"
        return None

    @cached_property
    def _pruner(self) -> optuna.pruners.BasePruner | None:
        return make_pruner(self.early_stopping)

    @cached_property
    def _study(self) -> optuna.Study:
        return optuna.Study(self.study_name, self.storage, pruner=self._pruner)


class Trial:
    """One evaluation of the objective, as the objective sees it.

    Parameters
    ----------
    number:
        The trial's number in its study.
    config:
        The configuration to evaluate (searched parameters and fixed values).
    checkpoint_dir:
        Per-trial directory on shared storage; a retried or resumed trial finds
        its last checkpoint there.
    cpus, gpus:
        What the engine assigned: a CPU count and the GPU ids.

    Examples
    --------
    A trial detached from any study records reports in memory, which is handy
    to try an objective by hand:

    >>> trial = Trial(0, {"lr": 0.1})
    >>> trial.report(0, val_accuracy=0.5)
    >>> trial.reports
    [(0, {'val_accuracy': 0.5})]
    >>> trial.should_stop()
    False
    """

    def __init__(
        self,
        number: int,
        config: dict[str, Any],
        checkpoint_dir: str | Path | None = None,
        *,
        cpus: int = 1,
        gpus: list[str] | None = None,
        _link: _StoreLink | None = None,
    ) -> None:
        self.number = number
        self.config = config
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.cpus = cpus
        self.gpus = list(gpus or [])
        self.reports: list[tuple[int, dict[str, float]]] = []
        self.stop_reason: str | None = None
        self._link = _link

    def report(self, step: int, **metrics: float) -> None:
        """Record the metrics of one step (an epoch, an iteration) durably.

        Raises
        ------
        TypeError
            If ``step`` is not a non-negative int or a metric is not a real number.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TypeError(f"trial.report: step must be an int >= 0, got {step!r}")
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"trial.report: metric {name!r} must be a number, got {value!r}")
            clean[name] = float(value)
        finite = {k: v for k, v in clean.items() if math.isfinite(v)}
        if self._link:
            self._link.report(step, finite)
        self.reports.append((step, clean))

    def should_stop(self) -> bool:
        """True when the objective should return now with its best result so far.

        That happens when a pruner finds this trial hopeless, or when the study
        stops (its target was reached or its time budget ran out).
        """
        if self.stop_reason is None and self._link is not None:
            self.stop_reason = self._link.stop_reason()
        return self.stop_reason is not None

    def __repr__(self) -> str:
        return f"Trial(number={self.number}, config={self.config!r})"
