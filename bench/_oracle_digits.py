"""The paraDL cost model against Keras on the digits MLP, for bench/allocation.py.

For four configurations (units 32/256, batch 32/128): the step time the model
predicts (layers timed once on this machine) against the step time
``model.fit`` takes (the fastest of 4 epochs after a warm-up one, as wall
time / steps). Prints one line per configuration, then ``median_error_pct=``.
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

from hpo.allocation import profile_keras, step_time  # noqa: E402
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


def main() -> None:
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for units in (32, 256):
            for batch in (32, 128):
                config = {"units": units, "batch_size": batch, "num_epochs": 5}
                predicted = step_time(profile_keras(keras_digits.cost(config), cache=Path(tmp, "c.json")))
                measured = measured_step_s(config)
                errors.append(100 * abs(predicted - measured) / measured)
                print(f"digits MLP units={units:<4} batch={batch:<4} predicted {predicted * 1e3:6.2f} ms"
                      f"  measured {measured * 1e3:6.2f} ms  error {errors[-1]:5.1f}%")
    print(f"median_error_pct={statistics.median(errors):.1f}")


if __name__ == "__main__":
    main()
