"""A 27-configuration MLPClassifier grid on scikit-learn's digits, for bench/overhead.py.

Each configuration is scored by 3-fold cross-validation (scikit-learn's
default split for a classifier, as ``GridSearchCV(cv=3)`` makes it), so hpo,
joblib and ``GridSearchCV`` evaluate exactly the same fits and must find the
same best configuration. ``max_iter`` is small (about 1 s a configuration on
one core); most fits stop before converging, which is fine for a timing.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import cross_val_score
from sklearn.neural_network import MLPClassifier

GRID: dict[str, list[Any]] = {
    "units": [64, 128, 256],
    "alpha": [1e-3, 1e-1, 1.0],
    "learning_rate_init": [1e-3, 3e-3, 1e-2],
}
MAX_ITER = 70  # about 1 s a configuration; the best is then unique (no tie within 0.001)
FOLDS = 3


class QuietMLP(MLPClassifier):
    """MLPClassifier without the ConvergenceWarning every short fit raises
    (GridSearchCV's worker processes would print 81 of them)."""

    def fit(self, x, y):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return super().fit(x, y)


def configurations() -> list[dict[str, Any]]:
    """The 27 configurations, in grid order."""
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def model(units: int, alpha: float, learning_rate_init: float) -> QuietMLP:
    return QuietMLP(hidden_layer_sizes=(int(units),), alpha=float(alpha),
                    learning_rate_init=float(learning_rate_init), max_iter=MAX_ITER, random_state=0)


def cv_accuracy(config: dict[str, Any], trial: Any = None) -> dict[str, float]:
    """Mean 3-fold accuracy of one configuration; an hpo objective and a joblib task."""
    x, y = load_digits(return_X_y=True)
    scores = cross_val_score(model(**{k: config[k] for k in GRID}), x, y, cv=FOLDS)
    return {"accuracy": float(scores.mean())}
