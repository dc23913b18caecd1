"""PyTorch integration: report, stop when told to, and resume exactly.

Only PyTorch users import this module (it imports ``torch``)::

    from hpo.torch import Training, device

    def train(config, trial):
        model = Net(config).to(device(trial))
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        training = Training(trial, model, optimizer, scheduler=scheduler)
        for epoch in training.epochs(config.get("max_epochs", 10)):
            train_one_epoch(model, optimizer, loader)
            scheduler.step()
            training.end_epoch(val_loss=..., val_accuracy=...)
        return training.best("val_accuracy", "maximize")

:meth:`Training.epochs` first restores the trial's checkpoint, if it has one,
and yields the epochs still to run. :meth:`Training.end_epoch` reports the
epoch's metrics (``trial.report``), then saves everything a straight run
depends on into ``trial.checkpoint_dir`` (model, optimizer, LR scheduler, AMP
scaler, epoch and step counters, the RNG states of Python, NumPy and torch,
CUDA's included, and the sampler's generator), then asks
``trial.should_stop()``: when the trial is pruned, the study's target is
reached, its time is up or the scheduler suspends it, the loop ends after
that epoch and the objective returns. A trial suspended by the scheduler, grown
onto more GPUs or retried after its worker died resumes from the epoch after
the last one saved, with the same data order and random draws it would have
had: ``hpo check-resume`` shows the same curve (exactly, on a CPU).

Reporting comes before the checkpoint: a crash between the two trains and
reports that epoch again (same step), and loses nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["Training", "best_epoch", "checkpoint_timer", "device", "limit_gpu_memory", "rng_states",
           "restore_rng_states", "torchrun_command"]

CHECKPOINT_NAME = "torch.pt"


def device(trial: Any) -> torch.device:
    """The device a trial's model goes on: its first assigned GPU (hpo sets
    ``CUDA_VISIBLE_DEVICES`` to the trial's GPUs, so it is ``cuda:0``), else
    the CPU. Also keeps a shared GPU within the trial's share
    (:func:`limit_gpu_memory`)."""
    if getattr(trial, "gpus", None) and torch.cuda.is_available():
        limit_gpu_memory()
        return torch.device("cuda", 0)
    return torch.device("cpu")


def limit_gpu_memory() -> None:
    """Keep this process within its share of each visible GPU when trials
    share one (``HPO_GPU_MEMORY_FRACTION``, set by hpo for ``"gpus": 0.25``):
    an allocation beyond it raises CUDA's out-of-memory error in this trial
    instead of starving its neighbours. Without GPUs it does nothing."""
    share = float(os.environ.get("HPO_GPU_MEMORY_FRACTION") or 1.0)
    if share >= 1.0 or not torch.cuda.is_available():
        return
    for index in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(share, index)


def rng_states() -> dict[str, Any]:
    """Every random state a training loop draws from (Python, NumPy, torch's
    CPU generator and each CUDA device's)."""
    state = np.random.get_state()
    if not isinstance(state, tuple):
        raise RuntimeError("hpo internal error: the legacy global generator's (MT19937) state")
    name, keys, position, has_gauss, cached = state
    # Plain numbers and tensors: torch's weights-only loader (Lightning's too) accepts them.
    states: dict[str, Any] = {"python": random.getstate(),
                              "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position,
                                        has_gauss, cached),
                              "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back what :func:`rng_states` returned."""
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class Training:
    """One trial's training loop: its reports, checkpoints and stopping.

    Parameters
    ----------
    trial:
        The trial handed to the objective (``report``, ``should_stop``; with a
        ``checkpoint_dir``, training resumes from its checkpoint).
    model, optimizer:
        What is trained (``state_dict`` / ``load_state_dict`` objects).
    scheduler, scaler:
        An LR scheduler and ``torch.amp.GradScaler``, when the loop has them.
    sampler:
        The training data's sampler when it draws from a generator of its own
        (``RandomSampler(generator=g)``: give ``g`` or the sampler); one with
        ``set_epoch`` (``DistributedSampler``) is told each epoch. A
        ``DataLoader(shuffle=True)`` without one draws from torch's generator,
        which is saved anyway.
    extra:
        Any other ``state_dict`` objects to save and restore (an EMA, a
        second optimizer), by name.

    :attr:`step` counts optimizer steps if the loop increments it; it is saved
    and restored with the rest.
    """

    def __init__(self, trial: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 *, scheduler: Any = None, scaler: Any = None, sampler: Any = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.trial = trial
        self.parts: dict[str, Any] = {"model": model, "optimizer": optimizer}
        self.parts.update({k: v for k, v in (("scheduler", scheduler), ("scaler", scaler))
                           if v is not None})
        self.parts.update(extra or {})
        self.sampler = sampler
        self.epoch = 0  # the epoch being trained
        self.step = 0
        self._stop = False
        self._max_epochs: int | None = None
        checkpoint_dir = getattr(trial, "checkpoint_dir", None)
        self.path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None

    def epochs(self, max_epochs: int) -> Iterator[int]:
        """Restore the checkpoint if there is one, then yield each epoch still
        to train, until ``max_epochs`` or until the trial is told to stop (seen
        by :meth:`end_epoch`)."""
        self._max_epochs = max_epochs
        self.epoch = self.restore()
        while self.epoch < max_epochs and not self._stop:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(self.epoch)
            ended = self.epoch
            yield self.epoch
            if self.epoch == ended:  # end_epoch not called: count the epoch anyway
                self.epoch += 1

    def end_epoch(self, **metrics: float) -> bool:
        """Report this epoch's metrics, checkpoint, and return whether the
        trial must stop (the loop of :meth:`epochs` then ends)."""
        self.trial.report(self.epoch, **{k: float(v) for k, v in metrics.items()})
        self.epoch += 1
        self.save()
        last = self._max_epochs is not None and self.epoch >= self._max_epochs
        self._stop = not last and self.trial.should_stop()  # after the last, the loop ends anyway
        return self._stop

    def best(self, metric: str, direction: str = "maximize") -> dict[str, float]:
        """The metrics of the best reported epoch (all segments and attempts
        of the trial: a resumed loop has seen only its own)."""
        return best_epoch(self.trial, metric, direction)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds."""
        state = {name: part.state_dict() for name, part in self.parts.items()}
        state.update(epoch=self.epoch, step=self.step, rng=rng_states())
        generator = self._generator()
        if generator is not None:
            state["sampler_generator"] = generator.get_state()
        return state

    def save(self) -> None:
        """Write :meth:`state` to the trial's checkpoint, atomically (a crash
        mid-write leaves the previous one)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with checkpoint_timer(self.trial, "save"):
            with open(partial, "wb") as f:
                torch.save(self.state(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, self.path)

    def restore(self) -> int:
        """Load the trial's checkpoint into the model and the rest; the epoch
        to train next (0 for a fresh trial)."""
        if self.path is None or not self.path.exists():
            return 0
        with checkpoint_timer(self.trial, "restore"):
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        for name, part in self.parts.items():
            part.load_state_dict(state[name])
        self.step = int(state["step"])
        restore_rng_states(state["rng"])
        generator = self._generator()
        if generator is not None and "sampler_generator" in state:
            generator.set_state(state["sampler_generator"])
        return int(state["epoch"])

    def _generator(self) -> torch.Generator | None:
        if isinstance(self.sampler, torch.Generator):
            return self.sampler
        return getattr(self.sampler, "generator", None)


def best_epoch(trial: Any, metric: str, direction: str = "maximize") -> dict[str, float]:
    """The metrics of ``trial``'s best reported epoch by ``metric``, over all
    its segments and attempts (``trial.reports``)."""
    reports = [m for _, m in trial.reports if metric in m]
    if not reports:
        raise ValueError(f"no epoch of this trial reported {metric!r}")
    sign = 1 if direction == "maximize" else -1
    return max(reports, key=lambda m: sign * m[metric])


def checkpoint_timer(trial: Any, kind: str) -> Any:
    """The trial's checkpoint timer (the scheduler keeps quanta long enough
    for a save and a restore), or none for a hand-made stand-in."""
    timer = getattr(trial, "checkpoint_timer", None)
    return timer(kind) if timer else contextlib.nullcontext()


def torchrun_command(trial: Any, script: str, *args: str, processes_per_node: int = 1,
                     port: int = 29500) -> list[list[str]]:
    """The ``torchrun`` command of each of a multi-node trial's nodes, in
    ``trial.hosts`` order (the first node hosts the rendezvous): run the
    i-th on the i-th host, e.g. with ``srun --nodes=1 -w HOST`` inside the
    trial's allocation, or ``ssh HOST``."""
    hosts = list(getattr(trial, "hosts", None) or ["localhost"])
    return [["torchrun", f"--nnodes={len(hosts)}", f"--node_rank={rank}",
             f"--nproc_per_node={processes_per_node}", f"--master_addr={hosts[0]}",
             f"--master_port={port}", script, *args] for rank in range(len(hosts))]
