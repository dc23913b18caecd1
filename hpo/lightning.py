"""Lightning integration: one callback reports, stops, suspends and resumes.

Only Lightning users import this module (it imports ``lightning``)::

    from hpo.lightning import HpoCallback

    def train(config, trial):
        hpo_callback = HpoCallback(trial)
        trainer = lightning.Trainer(max_epochs=config["max_epochs"],
                                    callbacks=[hpo_callback], enable_checkpointing=False)
        trainer.fit(Model(config), datamodule, ckpt_path=hpo_callback.ckpt_path)
        return hpo_callback.best("val_accuracy", "maximize")

At the end of each training epoch (after its validation) the callback reports
the logged metrics (``trainer.callback_metrics``, numbers only) as
``trial.report(epoch, ...)``, saves a Lightning checkpoint into
``trial.checkpoint_dir`` (model, optimizers, LR schedulers, AMP scaler, loop
counters, plus the RNG states of Python, NumPy and torch that Lightning does
not save), then asks ``trial.should_stop()`` and sets ``trainer.should_stop``:
pruned, target reached, time up or suspended by the scheduler, ``fit`` returns
after that epoch. ``ckpt_path`` is the last checkpoint when there is one, so
a suspended or retried trial resumes where it was, with the same curve.

Under DDP (``strategy="ddp"``) only global rank 0 reports and asks; its
decision is broadcast, so every rank stops at the same epoch (a rank that
asked on its own would hang the others at their next collective). hpo runs
the other ranks Lightning starts as followers of the trial: they train, they
neither report nor decide.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from hpo.torch import best_epoch, checkpoint_timer, restore_rng_states, rng_states

__all__ = ["HpoCallback", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "lightning.ckpt"
_RNG_KEY = "hpo_rng_states"


class HpoCallback(pl.Callback):
    """Report each epoch's logged metrics to ``trial``, checkpoint, and stop
    when told to.

    Parameters
    ----------
    trial:
        The trial handed to the objective.
    monitor_prefix:
        If given, only the metrics whose name starts with it are reported.
    batch_size:
        The training batch size: the trial's profile then gives its rate in
        samples per second (``trial.batch``).
    """

    def __init__(self, trial: Any, monitor_prefix: str | None = None,
                 batch_size: int | None = None) -> None:
        super().__init__()
        self.trial = trial
        self.monitor_prefix = monitor_prefix
        self.batch_size = batch_size
        checkpoint_dir = getattr(trial, "checkpoint_dir", None)
        self.path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint to pass to ``trainer.fit(..., ckpt_path=...)``: the
        last one saved, or None for a fresh trial."""
        return str(self.path) if self.path is not None and self.path.exists() else None

    def best(self, metric: str, direction: str = "maximize") -> dict[str, float]:
        """The metrics of the trial's best reported epoch, over all its
        segments and attempts (a resumed ``fit`` has seen only its own)."""
        return best_epoch(self.trial, metric, direction)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        timer = getattr(self.trial, "batch", None)  # times the first batches (rate allocation)
        if timer is not None and trainer.is_global_zero:
            timer(self.batch_size)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        epoch = trainer.current_epoch
        # Rank 0 reports to the study; a follower hpo started keeps its own
        # copy (its trial has no link), so that best() answers on every rank.
        if trainer.is_global_zero or getattr(self.trial, "rank", 0) > 0:
            self.trial.report(int(epoch), **self._metrics(trainer))
        self._save(trainer)
        last = epoch + 1 >= (trainer.max_epochs if trainer.max_epochs not in (None, -1)
                             else float("inf"))
        stop = bool(trainer.is_global_zero and not last and self.trial.should_stop())
        if trainer.strategy.broadcast(stop, src=0):  # every rank stops at the same epoch
            trainer.should_stop = True

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[_RNG_KEY] = rng_states()  # Lightning saves none: an exact resume needs them

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if _RNG_KEY in checkpoint:
            restore_rng_states(checkpoint[_RNG_KEY])

    def _metrics(self, trainer: pl.Trainer) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, value in trainer.callback_metrics.items():
            if self.monitor_prefix is not None and not name.startswith(self.monitor_prefix):
                continue
            with contextlib.suppress(TypeError, ValueError, RuntimeError):  # not a scalar
                metrics[name] = float(value)
        return metrics

    def _save(self, trainer: pl.Trainer) -> None:
        """Every rank takes part (sharded strategies gather); rank 0 writes
        beside the last checkpoint and renames it over, so a crash mid-write
        leaves the last good one."""
        if self.path is None:
            return
        partial = self.path.with_name(f".{self.path.name}.partial")
        with checkpoint_timer(self.trial, "save"):
            trainer.save_checkpoint(partial)
            trainer.strategy.barrier("hpo-checkpoint")
            if trainer.is_global_zero:
                os.replace(partial, self.path)
