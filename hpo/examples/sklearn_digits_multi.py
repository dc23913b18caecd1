"""Two objectives on scikit-learn's digits: accuracy against training time.

``hpo.examples.sklearn_digits_multi:train`` trains the linear model of
:func:`hpo.examples.sklearn_digits.train` (same config keys) and returns
``{"accuracy", "loss", "fit_seconds"}``: more epochs and some losses buy
accuracy with time, so the Pareto front shows what each point of accuracy costs.
``fit_seconds`` counts this task's training only (a resumed trial's earlier
segments are not added).
"""

from __future__ import annotations

import time
from typing import Any

from hpo.examples import sklearn_digits

__all__ = ["train"]


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """The digits SGDClassifier's best accuracy and the seconds its training took."""
    started = time.perf_counter()
    metrics = sklearn_digits.train(config, trial)
    return {**metrics, "fit_seconds": time.perf_counter() - started}
