"""A real Keras MLP on scikit-learn's bundled 8x8 digits: the quick-start objective.

The data ships with scikit-learn, so this runs anywhere with no download, and
a few epochs take well under two seconds on a CPU. Use it as
``hpo.examples.keras_digits:train``.

Config keys (all optional): ``optimizer`` ("adam", "sgd", "rmsprop", any
case), ``learning_rate`` (1e-3), ``units`` (64), ``num_epochs`` (10),
``batch_size`` (32), ``dropout`` (0.0), ``seed`` (0).

Returns the metrics of the best epoch (highest ``val_accuracy``, the first
one on ties): ``{"val_accuracy", "val_loss", "accuracy", "loss"}``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any  # noqa: E402

import keras  # noqa: E402

from hpo.examples._data import load_digits_split  # noqa: E402
from hpo.keras import HpoCallback  # noqa: E402

__all__ = ["train", "build_model", "make_optimizer", "best_epoch", "epochs_from"]

_OPTIMIZERS = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop"}


def make_optimizer(name: str, learning_rate: float | None = None) -> keras.optimizers.Optimizer:
    """Return a fresh Keras optimizer from a case-insensitive name (Adam, SGD, RMSprop)."""
    key = str(name).lower()
    if key not in _OPTIMIZERS:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {', '.join(_OPTIMIZERS.values())}"
        )
    cls = getattr(keras.optimizers, _OPTIMIZERS[key])
    return cls() if learning_rate is None else cls(learning_rate=float(learning_rate))


def best_epoch(history: keras.callbacks.History) -> dict[str, float]:
    """Return the logs of the epoch with the highest ``val_accuracy`` (first on ties)."""
    logs = history.history
    if not logs.get("val_accuracy"):
        raise RuntimeError("training ran no epoch: nothing to return")
    scores = logs["val_accuracy"]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return {name: float(values[best]) for name, values in logs.items() if len(values) > best}


def epochs_from(config: dict[str, Any], default: int) -> int:
    """Read ``num_epochs`` from the config, checking it is at least 1."""
    epochs = int(config.get("num_epochs", default))
    if epochs < 1:
        raise ValueError(f"num_epochs must be at least 1, got {epochs}")
    return epochs


def build_model(units: int = 64, dropout: float = 0.0) -> keras.Model:
    """Dense(units, relu) -> Dropout -> Dense(10, softmax) on 64 inputs."""
    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(int(units), activation="relu"),
            keras.layers.Dropout(float(dropout)),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Train the digits MLP with ``config``; report every epoch; return the best epoch's metrics."""
    keras.utils.set_random_seed(int(config.get("seed", 0)))
    (x_train, y_train), (x_val, y_val) = load_digits_split()
    model = build_model(config.get("units", 64), config.get("dropout", 0.0))
    model.compile(
        optimizer=make_optimizer(config.get("optimizer", "adam"), config.get("learning_rate", 1e-3)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = model.fit(
        x_train,
        y_train,
        validation_data=(x_val, y_val),
        epochs=epochs_from(config, 10),
        batch_size=int(config.get("batch_size", 32)),
        callbacks=[HpoCallback(trial)],
        verbose=0,
    )
    return best_epoch(history)
