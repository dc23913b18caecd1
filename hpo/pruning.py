"""Pruners for the space's ``early_stopping`` settings, taken from Optuna.

A pruner decides, from the learning curves in the shared store, whether a
running trial is hopeless. Workers call it from ``Trial.should_stop()``, so
decisions see the curves of trials running on other hosts.
"""

from __future__ import annotations

from typing import Any

import optuna

__all__ = ["make_pruner", "PRUNERS"]

PRUNERS = ("none", "median", "asha", "hyperband")


def make_pruner(settings: dict[str, Any] | None) -> optuna.pruners.BasePruner | None:
    """The Optuna pruner for ``{"pruner": name, "min_steps": k}``, or None.

    >>> type(make_pruner({"pruner": "median", "min_steps": 2})).__name__
    'MedianPruner'
    """
    name = (settings or {}).get("pruner", "none")
    min_steps = int((settings or {}).get("min_steps", 0))
    if name == "none":
        return None
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=min_steps)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, min_steps))
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, min_steps))
    raise ValueError(f"unknown pruner {name!r}; expected one of {PRUNERS}")
