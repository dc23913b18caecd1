"""A linear ``SGDClassifier`` on scikit-learn's digits, trained epoch by epoch with ``partial_fit``.

No Keras, no download: the quickest real objective with a learning curve, so
pruners have something to prune. Use it as ``hpo.examples.sklearn_digits:train``.

Config keys (all optional): ``alpha`` (1e-4), ``l1_ratio`` (0.15; the penalty
is elasticnet), ``loss`` ("hinge"; any ``SGDClassifier`` loss such as
"log_loss", "modified_huber"), ``max_epochs`` (20), ``seed`` (0).

Each epoch reports ``accuracy`` and ``loss = 1 - accuracy`` on the held-out
split. Returns the best epoch's ``{"accuracy", "loss"}``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hpo.examples._data import load_digits_split

__all__ = ["train"]


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Train for ``max_epochs`` epochs (fewer when told to stop); return the best epoch's accuracy."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier
    from sklearn.preprocessing import StandardScaler

    max_epochs = int(config.get("max_epochs", 20))
    if max_epochs < 1:
        raise ValueError(f"max_epochs must be at least 1, got {max_epochs}")
    seed = int(config.get("seed", 0))
    (x_train, y_train), (x_val, y_val) = load_digits_split()
    scaler = StandardScaler().fit(x_train)
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)
    classes = np.unique(y_train)
    model = SGDClassifier(
        loss=config.get("loss", "hinge"),
        penalty="elasticnet",
        alpha=float(config.get("alpha", 1e-4)),
        l1_ratio=float(config.get("l1_ratio", 0.15)),
        random_state=seed,
    )
    rng = np.random.default_rng(seed)
    best = -1.0
    for epoch in range(max_epochs):
        order = rng.permutation(len(x_train))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.partial_fit(x_train[order], y_train[order], classes=classes)
        accuracy = float(model.score(x_val, y_val))
        best = max(best, accuracy)
        trial.report(epoch, accuracy=accuracy, loss=1.0 - accuracy)
        if trial.should_stop():
            break
    return {"accuracy": best, "loss": 1.0 - best}
