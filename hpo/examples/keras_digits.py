"""A real Keras MLP on scikit-learn's bundled 8x8 digits: the quick-start objective.

The data ships with scikit-learn, so this runs anywhere with no download, and
a few epochs take well under two seconds on a CPU. Use it as
``hpo.examples.keras_digits:train``.

Config keys (all optional): ``optimizer`` ("adam", "sgd", "rmsprop", any
case), ``learning_rate`` (1e-3), ``units`` (64), ``num_epochs`` (10),
``batch_size`` (32), ``dropout`` (0.0), ``seed`` (0).

:func:`cost` describes a configuration to the cost model of
:mod:`hpo.allocation` (time per step, memory).

Returns the metrics of the best epoch (highest ``val_accuracy``, the first
one on ties): ``{"val_accuracy", "val_loss", "accuracy", "loss"}``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any

import keras

from hpo.allocation import Layer, ModelCost
from hpo.examples.datasets import load_digits_split
from hpo.examples.keras_training import epochs_from, fit

__all__ = ["train", "build_model", "cost"]

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
    model = build_model(config.get("units", 64), config.get("dropout", 0.0))
    return fit(model, load_digits_split(), trial, optimizer=config.get("optimizer", "adam"),
               learning_rate=config.get("learning_rate", 1e-3), epochs=epochs_from(config, 10),
               batch_size=config.get("batch_size", 32))


def cost(config: dict[str, Any]) -> ModelCost:
    """The cost model's view of ``build_model`` trained as ``train`` trains it.

    Layer sizes are per sample; times are left for ``profile_keras`` to measure.
    """
    units, dropout = int(config.get("units", 64)), float(config.get("dropout", 0.0))
    (x_train, _), (x_val, _) = load_digits_split()
    inputs, classes = x_train.shape[1], 10
    layers = (
        Layer(inputs, units, inputs * units + units, "dense",
              (("units", units), ("activation", "relu"))),
        Layer(units, units, 0, "dropout", (("rate", dropout),)),
        Layer(units, classes, units * classes + classes, "dense",
              (("units", classes), ("activation", "softmax"))),
    )
    return ModelCost(layers, samples=len(x_train), batch_size=int(config.get("batch_size", 32)),
                     epochs=epochs_from(config, 10), validation_samples=len(x_val),
                     optimizer=str(config.get("optimizer", "adam")).lower(),
                     loss="sparse_categorical_crossentropy", metrics=("accuracy",))
