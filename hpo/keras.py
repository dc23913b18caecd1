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

With a ``trial.checkpoint_dir`` the callback also checkpoints every epoch
(Keras's ``BackupAndRestore``: weights, optimizer state, epoch counter) and
restores the checkpoint when ``fit`` starts. A trial suspended at the end of
a segment, or retried after its worker died, goes on from the epoch after the
last one saved; the model must be built before ``fit`` (give it an ``Input``).
As the history of a resumed ``fit`` holds only its own epochs, compute the
result from ``trial.reports``, which holds every epoch.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import keras

__all__ = ["HpoCallback", "limit_gpu_memory"]


def limit_gpu_memory() -> None:
    """Keep TensorFlow within the trial's share of its GPU when trials share
    one (``HPO_GPU_MEMORY_FRACTION``, set by hpo for ``"gpus": 0.25``). Call it
    before the first model is built; without GPUs it does nothing."""
    import os

    share = float(os.environ.get("HPO_GPU_MEMORY_FRACTION") or 1.0)
    if share >= 1.0:
        return
    import tensorflow as tf

    from hpo.machine import gpu_memory_gb, visible_gpus

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    total_gb = gpu_memory_gb((visible_gpus() or ["0"])[0])
    for gpu in gpus:
        if total_gb:
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(total_gb * 1024 * share))])
        else:
            tf.config.experimental.set_memory_growth(gpu, True)


class HpoCallback(keras.callbacks.Callback):
    """Report each epoch's logs to ``trial``, checkpoint, and stop when told to.

    Parameters
    ----------
    trial:
        The trial handed to the objective (needs ``report`` and ``should_stop``;
        with a ``checkpoint_dir``, training also resumes from its checkpoint).
    monitor_prefix:
        If given, only the metrics whose name starts with it are reported
        (``"val_"`` reports the validation metrics only). ``None`` reports all.
    batch_size:
        The batch size ``fit`` uses: the trial's profile then gives its
        training rate in samples per second (``trial.batch``).
    """

    def __init__(self, trial: Any, monitor_prefix: str | None = None,
                 batch_size: int | None = None) -> None:
        super().__init__()
        self.trial = trial
        self.monitor_prefix = monitor_prefix
        self.batch_size = batch_size  # the profile then measures samples/s, else batches/s
        checkpoint_dir = getattr(trial, "checkpoint_dir", None)
        # Weights, optimizer state and the epoch counter, saved every epoch and
        # kept after fit returns: a suspended or retried trial resumes exactly.
        self._backup = None if checkpoint_dir is None else keras.callbacks.BackupAndRestore(
            str(Path(checkpoint_dir) / "keras"), delete_checkpoint=False)

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self._backup is not None:
            self._backup.set_model(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._backup is not None:
            with self._timer("restore"):
                self._backup.on_train_begin(logs)  # restores the last checkpoint, if any

    def _timer(self, kind: str) -> Any:
        timer = getattr(self.trial, "checkpoint_timer", None)  # the scheduler sizes quanta by it
        return timer(kind) if timer else contextlib.nullcontext()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        timer = getattr(self.trial, "batch", None)  # times the first batches (rate allocation)
        if timer is not None:
            timer(self.batch_size)

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
        # Report before checkpointing: after a crash between the two, the epoch
        # is trained and reported again (same step), never lost.
        self.trial.report(int(epoch), **metrics)
        if self._backup is not None:
            with self._timer("save"):
                self._backup.on_epoch_end(epoch, logs)
        last = epoch + 1 >= (getattr(self, "params", None) or {}).get("epochs", float("inf"))
        if not last and self.trial.should_stop():  # after the last epoch, fit ends anyway
            self.model.stop_training = True
