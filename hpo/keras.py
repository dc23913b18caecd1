"""Keras integration: report every epoch to the trial and stop when told to.

Only Keras users import this module (it imports ``keras``)::

    from hpo.keras import HpoCallback

    def train(config, trial):
        model = build_model(config)
        history = model.fit(
            x_train, y_train,
            validation_data=(x_val, y_val),
            epochs=config.get("num_epochs", 10),
            callbacks=[HpoCallback(trial)],
            verbose=0,
        )
        best = max(range(len(history.epoch)),
                   key=lambda i: history.history["val_accuracy"][i])
        return {"val_accuracy": history.history["val_accuracy"][best],
                "val_loss": history.history["val_loss"][best]}

Each epoch becomes one ``trial.report(epoch, loss=..., accuracy=...,
val_loss=..., val_accuracy=...)`` with ``epoch`` counted from 0, so pruners
and dashboards see the learning curve. When ``trial.should_stop()`` turns
True (pruned, the study's target reached, or the trial's time is up) the
callback sets ``model.stop_training`` and ``fit`` returns after the current
epoch; the objective then returns its best result so far.
"""

from __future__ import annotations

from typing import Any

import keras

__all__ = ["HpoCallback"]


class HpoCallback(keras.callbacks.Callback):
    """Report each epoch's logs to ``trial`` and stop training when it says so.

    Parameters
    ----------
    trial:
        The trial handed to the objective (needs ``report`` and ``should_stop``).
    monitor_prefix:
        If given, only the metrics whose name starts with it are reported
        (``"val_"`` reports the validation metrics only). ``None`` reports all.
    """

    def __init__(self, trial: Any, monitor_prefix: str | None = None) -> None:
        super().__init__()
        self.trial = trial
        self.monitor_prefix = monitor_prefix

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics: dict[str, float] = {}
        for name, value in (logs or {}).items():
            if self.monitor_prefix is not None and not name.startswith(self.monitor_prefix):
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):  # strings, arrays, None: not a metric
                continue
            metrics[name] = number  # NaN stays: a diverged epoch is a real result
        self.trial.report(int(epoch), **metrics)
        if self.trial.should_stop():
            self.model.stop_training = True
