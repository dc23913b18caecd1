"""The CIFAR-10 CNN of the original PyCOMPSs study (Keras's classic ``cifar10_cnn``).

Data is read from local files, never downloaded: ``config["data_path"]`` or
``$HPO_CIFAR10_PATH`` names the python-version ``cifar-10-batches-py``
directory (from https://www.cs.toronto.edu/~kriz/cifar.html), a directory
containing it, or an ``.npz`` with ``x_train`` (N, 32, 32, 3), ``y_train``,
``x_test``, ``y_test``. The test batch is the validation set.

Config keys: ``optimizer`` ("Adam", "SGD", "RMSprop", any case; default
"RMSprop" as in the study), ``learning_rate`` (optional; 1e-4 for RMSprop as
in the study, the optimizer's default otherwise), ``num_epochs`` (10),
``batch_size`` (32), ``max_train_samples`` and ``max_val_samples`` (optional
ints, a fixed random subset for quick runs), ``data_path``, ``seed`` (0).

Returns the metrics of the best epoch (highest ``val_accuracy``):
``{"val_accuracy", "val_loss", "accuracy", "loss"}``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any

import keras
import numpy as np

from hpo.examples.datasets import load_cifar10, locate_cifar10, subsample
from hpo.examples.keras_training import epochs_from, fit

__all__ = ["train", "build_model", "load_data", "check_data"]


def load_data(config: dict[str, Any]):
    """Return ``(x_train, y_train), (x_val, y_val)``: float32 (N, 32, 32, 3) in [0, 1], int32 labels."""
    (x_train, y_train), (x_val, y_val) = load_cifar10(config.get("data_path"))
    x_train, y_train = subsample(x_train, y_train, config.get("max_train_samples"))
    x_val, y_val = subsample(x_val, y_val, config.get("max_val_samples"))
    return (
        (x_train.astype(np.float32) / 255.0, y_train.astype(np.int32)),
        (x_val.astype(np.float32) / 255.0, y_val.astype(np.int32)),
    )


def build_model() -> keras.Model:
    """Two Conv-Conv-MaxPool-Dropout(0.25) blocks (32, 64 filters), Dense 512, Dropout 0.5, Dense 10."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=(32, 32, 3)),
            layers.Conv2D(32, (3, 3), padding="same", activation="relu"),
            layers.Conv2D(32, (3, 3), activation="relu"),
            layers.MaxPooling2D((2, 2)),
            layers.Dropout(0.25),
            layers.Conv2D(64, (3, 3), padding="same", activation="relu"),
            layers.Conv2D(64, (3, 3), activation="relu"),
            layers.MaxPooling2D((2, 2)),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(512, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(10, activation="softmax"),
        ]
    )


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Train the study's CIFAR-10 CNN; report every epoch; return the best epoch's metrics."""
    keras.utils.set_random_seed(int(config.get("seed", 0)))
    optimizer = str(config.get("optimizer", "RMSprop"))
    learning_rate = config.get("learning_rate")
    if learning_rate is None and optimizer.lower() == "rmsprop":
        learning_rate = 1e-4
    return fit(build_model(), load_data(config), trial, optimizer=optimizer,
               learning_rate=learning_rate, epochs=epochs_from(config, 10),
               batch_size=config.get("batch_size", 32))


def check_data(fixed: dict[str, Any]) -> None:
    """Before the study: the data is where the trials will look (raises
    FileNotFoundError saying how to get it). ``fixed``: the study's fixed values."""
    locate_cifar10(fixed.get("data_path"))


# The objective's preflight hook (hpo.trial.preflight): an attribute mypy does not know functions to have.
train.preflight = check_data  # type: ignore[attr-defined]
