"""A Lightning classifier on scikit-learn's bundled 8x8 digits.

``hpo.examples.lightning_digits:train``. Config keys (all optional):
``learning_rate`` (0.05), ``units`` (64), ``dropout`` (0.0), ``batch_size``
(64), ``max_epochs`` (10), ``seed`` (0); ``devices`` (1) and ``strategy``
("auto"; "ddp" trains on ``devices`` processes, each with its share of the
data, on the trial's GPUs or, without any, on CPUs with gloo).

:class:`hpo.lightning.HpoCallback` reports every epoch's ``val_loss`` and
``val_accuracy``, stops the trainer when the trial is told to, and
checkpoints so that a suspended or retried trial resumes exactly.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpo.examples.datasets import load_digits_split
from hpo.lightning import HpoCallback

__all__ = ["train", "DigitsClassifier"]

# Lightning's banners (devices found, tips) would fill every trial's log.
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


class DigitsClassifier(pl.LightningModule):
    """A one-hidden-layer network trained with SGD and a step LR schedule."""

    def __init__(self, units: int = 64, dropout: float = 0.0, learning_rate: float = 0.05) -> None:
        super().__init__()
        self.learning_rate = learning_rate
        self.net = nn.Sequential(nn.Linear(64, int(units)), nn.ReLU(), nn.Dropout(float(dropout)),
                                 nn.Linear(int(units), 10))
        self.loss = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        return self.loss(self.net(x), y)

    def validation_step(self, batch: Any, _: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", self.loss(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.learning_rate, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.9)]


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Fit the classifier with ``config``; the best epoch's metrics over the trial's life."""
    pl.seed_everything(int(config.get("seed", 0)), verbose=False)
    (x_train, y_train), (x_val, y_val) = load_digits_split()
    batch = int(config.get("batch_size", 64))
    train_data = DataLoader(_dataset(x_train, y_train), batch_size=batch, shuffle=True)
    val_data = DataLoader(_dataset(x_val, y_val), batch_size=len(x_val))
    callback = HpoCallback(trial, batch_size=batch)
    trainer = pl.Trainer(
        max_epochs=int(config.get("max_epochs", 10)), callbacks=[callback],
        accelerator="gpu" if getattr(trial, "gpus", None) else "cpu",
        devices=int(config.get("devices", 1)), strategy=config.get("strategy", "auto"),
        enable_checkpointing=False, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    model = DigitsClassifier(config.get("units", 64), config.get("dropout", 0.0),
                             float(config.get("learning_rate", 0.05)))
    trainer.fit(model, train_data, val_data, ckpt_path=callback.ckpt_path)
    return callback.best("val_accuracy", "maximize")


def _dataset(x: Any, y: Any) -> TensorDataset:
    # torch.tensor copies: the dataset loaders cache read-only arrays
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

