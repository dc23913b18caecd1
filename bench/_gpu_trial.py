"""The trial bench/gpu.py packs onto a GPU: the PyTorch example's CNN
(``hpo.examples.torch_digits.build_model``) trained on generated 28x28 images
for a fixed number of steps, through :class:`hpo.torch.Training`.

It also writes what its process saw into ``probe_dir``: the GPU ids it was
given, how many devices torch sees, its memory share and its peak memory, so
the bench checks isolation from inside each trial, and when its objective
started and took its first step (the start and the resume it paid).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpo.examples.torch_digits import build_model
from hpo.torch import Training, device


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    entered_at = time.time()  # the objective's first line: the trial's process start ends here
    torch.manual_seed(int(config.get("seed", 0)))
    where = device(trial)  # cuda:0 of the trial's GPUs; its memory share applied
    batch, steps = int(config["batch_size"]), int(config["steps_per_epoch"])
    images = torch.rand(batch * 8, 1, 28, 28, device=where)  # 8 batches, reused
    labels = torch.randint(0, 10, (batch * 8,), device=where)
    model = build_model(28, int(config["channels"])).to(where)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("learning_rate", 0.01)))
    training = Training(trial, model, optimizer)
    loss_of = nn.CrossEntropyLoss()
    started = time.perf_counter()
    first_step_at = None
    for _ in training.epochs(int(config.get("max_epochs", 2))):
        if first_step_at is None:  # CUDA initialised, the model on it, its checkpoint restored
            first_step_at = time.time()
        for step in range(steps):
            part = slice((step % 8) * batch, (step % 8 + 1) * batch)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(model(images[part]), labels[part])
            loss.backward()
            optimizer.step()
        training.end_epoch(loss=loss.item())
    _probe(config, trial, where, time.perf_counter() - started, entered_at, first_step_at)
    return {"loss": loss.item()}


def _probe(config: dict[str, Any], trial: Any, where: torch.device, seconds: float,
           entered_at: float, first_step_at: float | None) -> None:
    if not config.get("probe_dir"):
        return
    seen: dict[str, Any] = {
        "number": trial.number, "pid": os.getpid(), "gpus": list(trial.gpus),
        "entered_at": entered_at, "first_step_at": first_step_at,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "memory_fraction": float(os.environ.get("HPO_GPU_MEMORY_FRACTION") or 1.0),
        "device_count": torch.cuda.device_count() if where.type == "cuda" else 0,
        "train_s": seconds,
    }
    if where.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        seen.update(peak_reserved_gb=torch.cuda.max_memory_reserved() / 2**30,
                    total_gb=total / 2**30, uuid=str(torch.cuda.get_device_properties(0).uuid),
                    beyond_share_refused=_refused(total, seen["memory_fraction"]))
    Path(config["probe_dir"], f"trial-{trial.number}.json").write_text(json.dumps(seen))


def _refused(total: int, fraction: float) -> bool | None:
    """Whether one allocation a little beyond the trial's share is refused
    (the limit is checked before any memory is taken); None without a share."""
    if fraction >= 1.0:
        return None
    try:
        block = torch.empty(int((fraction + 0.02) * total), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        return True
    del block
    return False
