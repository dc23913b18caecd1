"""An emulated GPU training: sleeps instead of computing, at the pace its GPUs set.

For benchmarks and tests of GPU allocation on machines without GPUs
(``bench/allocation.py``); use it as ``hpo.examples.emulated_gpu:train`` with
``cost_model`` ``hpo.examples.emulated_gpu:cost``.

A trial trains ``samples`` samples per epoch for ``epochs`` epochs in batches
of ``batch_size``. A batch takes ``batch_size / r(m) / speed`` seconds, with
``m`` its GPU count, ``speed`` the slowest of its GPUs (``HPO_DEVICE_SPEED``,
set by hpo from the workers' ``HPO_GPU_SPEEDS``), and ``r(m)`` FLEET's rate
curve: ``rate`` samples/s on one GPU, each further GPU ``efficiency`` times
less useful (``r(m) = m * rate * efficiency ** (m - 1)``). It reports every
epoch, checkpoints, and resumes from its checkpoint (a grown trial goes on).

``cost(config)`` is its cost model as a user would write it: one layer whose
per-sample time was profiled with an error of ``profile_error`` (a fraction,
+ or -), and its weight count (the gradients the GPUs exchange).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hpo.allocation import Layer, ModelCost


def _own(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's own settings: ``configs[i]`` when the study lists them."""
    return config["configs"][config["i"]] if "configs" in config else config


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    config = _own(config)
    gpus = max(len(trial.gpus), 1) if trial.gpu_share >= 1 else 1
    speed = float(os.environ.get("HPO_DEVICE_SPEED") or 1.0)
    rate = float(config["rate"]) * gpus * float(config["efficiency"]) ** (gpus - 1)
    batch, per_epoch = int(config["batch_size"]), int(config["samples"])
    batch_s = batch / rate / speed
    start = trial.load_checkpoint() or 0
    for epoch in range(start, int(config["epochs"])):
        for _ in range(max(per_epoch // batch, 1)):
            time.sleep(batch_s)
            trial.batch(batch)
        trial.report(epoch, value=float(config["quality"]) * (epoch + 1) / int(config["epochs"]))
        trial.save_checkpoint(epoch + 1)
        if epoch + 1 < int(config["epochs"]) and trial.should_stop():
            break
    return {"value": trial.reports[-1][1]["value"]}


def cost(config: dict[str, Any]) -> ModelCost:
    config = _own(config)
    per_sample = (1 + float(config.get("profile_error", 0.0))) / float(config["rate"])
    layer = Layer(inputs=1, outputs=1, weights=int(config.get("weights", 1_000_000)), kind="given",
                  fw_bw_s=per_sample, wu_s=0.0)
    return ModelCost(layers=(layer,), samples=int(config["samples"]), batch_size=int(config["batch_size"]),
                     epochs=int(config["epochs"]))
