"""The training loop the Keras examples share: compile, fit with reports, best epoch
(imports Keras)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any

import keras

from hpo.keras import HpoCallback, limit_gpu_memory

limit_gpu_memory()  # before any model is built: trials sharing a GPU share its memory

__all__ = ["fit", "make_optimizer", "best_epoch", "epochs_from"]

_OPTIMIZERS = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop"}


def fit(model: keras.Model, data, trial: Any, *, optimizer: str, learning_rate: float | None,
        epochs: int, batch_size: int) -> dict[str, float]:
    """Train ``model`` on ``((x_train, y_train), (x_val, y_val))``, reporting every
    epoch to ``trial`` and stopping when it says so; return the best epoch's logs.

    A trial that resumes (next segment, or a retry) goes on from its checkpoint,
    and the best epoch is taken over all its reports, earlier segments included.
    """
    (x_train, y_train), (x_val, y_val) = data
    model.compile(optimizer=make_optimizer(optimizer, learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, validation_data=(x_val, y_val), epochs=epochs,
              batch_size=int(batch_size), verbose=0,
              callbacks=[HpoCallback(trial, batch_size=int(batch_size))])
    return best_epoch(trial.reports)


def make_optimizer(name: str, learning_rate: float | None = None) -> keras.optimizers.Optimizer:
    """Return a fresh Keras optimizer from a case-insensitive name (Adam, SGD, RMSprop)."""
    key = str(name).lower()
    if key not in _OPTIMIZERS:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {', '.join(_OPTIMIZERS.values())}"
        )
    cls = getattr(keras.optimizers, _OPTIMIZERS[key])
    return cls() if learning_rate is None else cls(learning_rate=float(learning_rate))


def best_epoch(reports: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Return the metrics of the reported epoch with the highest ``val_accuracy``
    (the earliest on ties)."""
    scored = [(step, m) for step, m in reports if "val_accuracy" in m]
    if not scored:
        raise RuntimeError("training ran no epoch: nothing to return")
    _, metrics = max(scored, key=lambda sm: (sm[1]["val_accuracy"], -sm[0]))
    return dict(metrics)


def epochs_from(config: dict[str, Any], default: int) -> int:
    """Read ``num_epochs`` from the config, checking it is at least 1."""
    epochs = int(config.get("num_epochs", default))
    if epochs < 1:
        raise ValueError(f"num_epochs must be at least 1, got {epochs}")
    return epochs
