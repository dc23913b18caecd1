"""The paraDL cost model against Keras on the digits MLP, for bench/allocation.py.

For four configurations (units 32/256, batch 32/128, dropout 0/0.2): the step
time the model predicts (layers timed once on this machine) against the step
time ``model.fit`` takes (the fastest of 4 epochs after a warm-up one, as wall
time / steps). Prints one line per configuration with the thesis's accuracy
(``1 - |predicted - measured| / measured``; the cost model's tests check how the
prediction is computed, this how close it comes), the loopback network's
latency and bandwidth (``measure_network``), then ``min_accuracy=`` and, last,
``median_error_pct=``.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402

from hpo.allocation import accuracy, measure_network, profile_keras, step_time  # noqa: E402
from hpo.examples import keras_digits  # noqa: E402
from hpo.examples.datasets import load_digits_split  # noqa: E402
from hpo.examples.keras_training import make_optimizer  # noqa: E402


class _EpochTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._began)


def measured_step_s(config: dict) -> float:
    (x, y), validation = load_digits_split()
    model = keras_digits.build_model(config["units"], config.get("dropout", 0.0))
    model.compile(optimizer=make_optimizer("adam", 1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    timer = _EpochTimes()
    model.fit(x, y, validation_data=validation, epochs=5, batch_size=config["batch_size"], verbose=0,
              callbacks=[timer])
    return min(timer.times[1:]) / math.ceil(len(x) / config["batch_size"])


CONFIGS = [(32, 32, 0.0), (32, 128, 0.2), (256, 32, 0.2), (256, 128, 0.0)]  # units, batch, dropout


def main() -> None:
    errors, accuracies = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for units, batch, dropout in CONFIGS:
            config = {"units": units, "batch_size": batch, "dropout": dropout, "num_epochs": 5}
            predicted = step_time(profile_keras(keras_digits.cost(config), cache=Path(tmp, "c.json")))
            measured = measured_step_s(config)
            accuracies.append(accuracy(predicted, measured))
            errors.append(100 * abs(predicted - measured) / measured)
            print(f"digits MLP units={units:<4} batch={batch:<4} dropout={dropout:<4} "
                  f"predicted {predicted * 1e3:6.2f} ms  measured {measured * 1e3:6.2f} ms  "
                  f"accuracy {accuracies[-1]:.3f}  error {errors[-1]:5.1f}%")
    network = measure_network()
    bandwidth = 1 / network.beta_s_per_byte / 1e6 if network.beta_s_per_byte else math.inf
    print(f"loopback network: alpha {network.alpha_s * 1e6:.1f} us, bandwidth {bandwidth:.0f} MB/s")
    print(f"min_accuracy={min(accuracies):.3f}")
    print(f"median_error_pct={statistics.median(errors):.1f}")


if __name__ == "__main__":
    main()
