"""PyTorch CNNs: scikit-learn's bundled 8x8 digits (quick, for tests and a
first study) and Fashion-MNIST (Debian's ``dataset-fashion-mnist``, as the
Keras MNIST example reads it).

- ``hpo.examples.torch_digits:train``: a small CNN on the digits; a few
  epochs take about a second on one CPU core.
- ``hpo.examples.torch_digits:train_fashion``: a two-block CNN on Fashion-MNIST
  28x28 (``HPO_MNIST_PATH`` or the config's ``data_path`` names the IDX files,
  else Debian's package; ``train_samples`` (12000) takes a stratified subset so
  a trial stays minutes on a CPU).

Config keys (all optional): ``optimizer`` ("sgd", "adam"), ``learning_rate``
(0.05), ``momentum`` (0.9, SGD only), ``channels`` (16), ``dropout`` (0.0),
``batch_size`` (64), ``max_epochs`` (10), ``seed`` (0), ``lr_decay`` (1.0:
a step LR schedule multiplying the rate by it every epoch), ``device``
("auto": the trial's GPU, else the CPU; "cuda" or "cpu" to choose, e.g. for
``hpo check-resume`` on a GPU) and ``deterministic`` (false: true asks torch
for deterministic kernels, so that a resumed run on a GPU repeats a straight
one bit for bit).

Every epoch reports ``val_loss`` and ``val_accuracy`` and checkpoints through
:class:`hpo.torch.Training`; the objective returns the best epoch's metrics
over the trial's whole life (earlier segments and attempts included).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from hpo.examples.datasets import load_digits_split, load_mnist, subsample
from hpo.torch import Training, device

__all__ = ["train", "train_fashion", "build_model"]


def build_model(side: int, channels: int = 16, dropout: float = 0.0) -> nn.Module:
    """Two conv blocks (the second halves the image) and a linear classifier."""
    c = int(channels)
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(float(dropout)),
        nn.Linear(2 * c * (side // 2) ** 2, 10),
    )


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """The digits CNN (8x8 images)."""
    (x_train, y_train), (x_val, y_val) = load_digits_split()
    return _fit(config, trial, _images(x_train, 8), y_train, _images(x_val, 8), y_val)


def train_fashion(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """The Fashion-MNIST CNN (28x28 images)."""
    (x_train, y_train), (x_val, y_val) = load_mnist(config.get("data_path"))
    seed = int(config.get("seed", 0))
    x_train, y_train = subsample(x_train, y_train, int(config.get("train_samples", 12000)), seed)
    x_val, y_val = subsample(x_val, y_val, int(config.get("val_samples", 2000)), seed)
    return _fit(config, trial, _images(x_train, 28), y_train, _images(x_val, 28), y_val)


def _images(x: np.ndarray, side: int) -> torch.Tensor:
    flat = np.asarray(x, dtype=np.float32).reshape(len(x), 1, side, side)
    return torch.from_numpy(flat / max(float(flat.max()), 1.0))


def _fit(config: dict[str, Any], trial: Any, x_train: torch.Tensor, y_train: np.ndarray,
         x_val: torch.Tensor, y_val: np.ndarray) -> dict[str, float]:
    if config.get("deterministic"):
        # cuBLAS needs a fixed workspace before CUDA starts for repeatable sums.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(int(config.get("seed", 0)))
    torch.set_num_threads(max(1, int(getattr(trial, "cpus", 1))))
    chosen = str(config.get("device", "auto"))
    where = device(trial) if chosen == "auto" else torch.device(chosen)
    model = build_model(x_train.shape[-1], config.get("channels", 16),
                        config.get("dropout", 0.0)).to(where)
    optimizer = _optimizer(config, model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, float(config.get("lr_decay", 1.0)))
    # torch.tensor copies: the dataset loaders cache read-only arrays
    data = TensorDataset(x_train, torch.tensor(y_train, dtype=torch.long))
    order = torch.Generator().manual_seed(int(config.get("seed", 0)))
    sampler = RandomSampler(data, generator=order)  # its position is saved with the checkpoint
    loader = DataLoader(data, batch_size=int(config.get("batch_size", 64)), sampler=sampler)
    targets = torch.tensor(y_val, dtype=torch.long)
    training = Training(trial, model, optimizer, scheduler=scheduler, sampler=sampler)
    loss_of = nn.CrossEntropyLoss()
    for _ in training.epochs(int(config.get("max_epochs", 10))):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss_of(model(x.to(where)), y.to(where)).backward()
            optimizer.step()
            training.step += 1
            trial.batch(len(x))
        scheduler.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_val.to(where)).cpu()
        training.end_epoch(val_loss=float(loss_of(logits, targets)),
                           val_accuracy=float((logits.argmax(1) == targets).float().mean()))
    return training.best("val_accuracy", "maximize")


def _optimizer(config: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    rate = float(config.get("learning_rate", 0.05))
    name = str(config.get("optimizer", "sgd")).lower()
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=rate)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=rate, momentum=float(config.get("momentum", 0.9)))
    raise ValueError(f"optimizer {name!r}: use 'sgd' or 'adam'")
