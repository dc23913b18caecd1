"""The MNIST models of the original PyCOMPSs study: an MLP (:func:`train`) and a CNN (:func:`train_cnn`).

Data is MNIST-format (MNIST or Fashion-MNIST) read from local files, never
downloaded: ``config["data_path"]`` or ``$HPO_MNIST_PATH`` names a directory
of the four IDX files (``train-images-idx3-ubyte.gz`` ...) or a keras-style
``mnist.npz``. On Debian, ``apt-get install dataset-fashion-mnist`` puts
Fashion-MNIST in ``/usr/share/datasets/fashion-mnist``, used when neither is
set. The t10k set is the validation set. Both objectives check that the data
is there before the study starts (``preflight``), so a missing data set is
one error, not one failed trial per configuration.

Config keys: ``optimizer`` ("Adam", "SGD", "RMSprop", any case; default
"Adam"), ``num_epochs`` (5), ``batch_size`` (128), ``learning_rate``
(optional; the optimizer's default otherwise), ``max_train_samples`` and
``max_val_samples`` (optional ints, a fixed random subset for quick runs),
``data_path`` (optional), ``seed`` (0).

Both return the metrics of the best epoch (highest ``val_accuracy``):
``{"val_accuracy", "val_loss", "accuracy", "loss"}``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any

import keras
import numpy as np

from hpo.examples.datasets import load_mnist, locate_mnist, subsample
from hpo.examples.keras_training import epochs_from, fit

__all__ = ["train", "train_cnn", "build_mlp", "build_cnn", "load_data", "check_data"]


def load_data(config: dict[str, Any], channels: bool = False):
    """Return ``(x_train, y_train), (x_val, y_val)`` as float32 in [0, 1] and int32 labels.

    ``channels`` adds the trailing channel axis the CNN needs.
    """
    (x_train, y_train), (x_val, y_val) = load_mnist(config.get("data_path"))
    x_train, y_train = subsample(x_train, y_train, config.get("max_train_samples"))
    x_val, y_val = subsample(x_val, y_val, config.get("max_val_samples"))

    def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = x.astype(np.float32) / 255.0
        return (x[..., None] if channels else x), y.astype(np.int32)

    return prepare(x_train, y_train), prepare(x_val, y_val)


def build_mlp(input_shape: tuple[int, ...] = (28, 28)) -> keras.Model:
    """Flatten -> Dense 512 relu -> Dropout 0.2 -> Dense 512 relu -> Dropout 0.2 -> Dense 10 softmax."""
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def build_cnn(input_shape: tuple[int, ...] = (28, 28, 1)) -> keras.Model:
    """Conv 32 -> Conv 64 -> MaxPool -> Dropout 0.25 -> Dense 128 -> Dropout 0.5 -> Dense 10."""
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.Conv2D(64, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def _fit(model: keras.Model, config: dict[str, Any], trial: Any, data) -> dict[str, float]:
    return fit(model, data, trial, optimizer=config.get("optimizer", "Adam"),
               learning_rate=config.get("learning_rate"), epochs=epochs_from(config, 5),
               batch_size=config.get("batch_size", 128))


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Train the study's MNIST MLP; report every epoch; return the best epoch's metrics."""
    keras.utils.set_random_seed(int(config.get("seed", 0)))
    data = load_data(config)
    return _fit(build_mlp(data[0][0].shape[1:]), config, trial, data)


def train_cnn(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Train the study's MNIST CNN; report every epoch; return the best epoch's metrics."""
    keras.utils.set_random_seed(int(config.get("seed", 0)))
    data = load_data(config, channels=True)
    return _fit(build_cnn(data[0][0].shape[1:]), config, trial, data)


def check_data(fixed: dict[str, Any]) -> None:
    """Before the study: the data is where the trials will look (raises
    FileNotFoundError saying how to get it). ``fixed``: the study's fixed values."""
    locate_mnist(fixed.get("data_path"))


# The objective's preflight hook (hpo.trial.preflight): an attribute mypy does not know functions to have.
train.preflight = train_cnn.preflight = check_data  # type: ignore[attr-defined]
