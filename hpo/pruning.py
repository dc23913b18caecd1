"""Pruners for the space's ``early_stopping`` settings, taken from Optuna.

A pruner decides, from the learning curves in the shared store, whether a
running trial is hopeless. Workers call it from ``Trial.should_stop()``, so
decisions see the curves of trials running on other hosts. The names a space
may use are :data:`hpo.registry.PRUNERS`; ``hpo.run(pruner=...)`` also takes
any Optuna pruner object.
"""

from __future__ import annotations

from typing import Any

import optuna

from hpo.registry import PRUNERS

__all__ = ["make_pruner", "median_pruner", "asha_pruner", "hyperband_pruner"]


def make_pruner(settings: dict[str, Any] | None) -> optuna.pruners.BasePruner | None:
    """The Optuna pruner for ``{"pruner": name, "min_steps": k}``, or None.

    >>> type(make_pruner({"pruner": "asha", "min_steps": 2})).__name__
    'SuccessiveHalvingPruner'
    """
    settings = settings or {}
    return PRUNERS.make(settings.get("pruner", "none"), min_steps=int(settings.get("min_steps", 0)))


def median_pruner(min_steps: int = 0) -> optuna.pruners.BasePruner:
    """Below the median of the other trials at the same step, after ``min_steps``."""
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=min_steps)


def asha_pruner(min_steps: int = 0) -> optuna.pruners.BasePruner:
    """Asynchronous successive halving, with ``min_steps`` as the first rung."""
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, min_steps))


def hyperband_pruner(min_steps: int = 0) -> optuna.pruners.BasePruner:
    """Hyperband's brackets of successive halving (needs several trials per bracket)."""
    return optuna.pruners.HyperbandPruner(min_resource=max(1, min_steps))
