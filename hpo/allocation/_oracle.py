"""A study's cost model: predicted time, training rate and memory per configuration.

The objective's module describes its model with a ``cost(config)`` function
returning a :class:`~hpo.allocation.ModelCost` (the Keras examples do), or the
space names one (``"allocation": {"cost_model": "pkg.mod:cost"}``). Layers
the function does not time itself are timed once per shape on this machine
(``profile_keras``, cached in the run directory).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.allocation import _cost
from hpo.allocation._cost import ModelCost, Network

__all__ = ["Oracle"]


class Oracle:
    """Predictions for the configurations of one study."""

    def __init__(self, cost_of: Callable[[dict[str, Any]], ModelCost], cache: Path | None = None,
                 network: Network | None = None) -> None:
        self._cost_of, self._cache, self._network = cost_of, cache, network
        self._profiled: dict[str, ModelCost] = {}

    def network(self, gpus: int) -> Network:
        """α and β, measured once on this machine when a prediction spans GPUs."""
        if gpus <= 1:
            return Network()
        if self._network is None:
            self._network = _cost.measure_network()
        return self._network

    @classmethod
    def of(cls, cost_model: str | None, objective: Any, cache: Path | None = None) -> Oracle | None:
        """The oracle of ``cost_model`` (``"module:function"``), else of the
        objective module's ``cost`` function; None when there is none."""
        function = _resolve(cost_model) if cost_model else _beside(objective)
        return None if function is None else cls(function, cache)

    def cost(self, config: dict[str, Any]) -> ModelCost:
        """The model of ``config``, its layers timed on this machine."""
        key = repr(sorted(config.items()))
        if key not in self._profiled:
            cost = self._cost_of(dict(config))
            untimed = any(layer.fw_bw_s is None for layer in cost.layers)
            self._profiled[key] = _cost.profile_keras(cost, cache=self._cache) if untimed else cost
        return self._profiled[key]

    def trial_s(self, config: dict[str, Any], gpus: int = 1, speed: float = 1.0) -> float:
        """Predicted seconds of the whole trial on ``gpus`` GPUs of ``speed``."""
        gpus = max(int(gpus), 1)
        return _cost.trial_time(self.cost(config), gpus, self.network(gpus), speed)

    def step_s(self, config: dict[str, Any], gpus: int = 1, speed: float = 1.0) -> float:
        gpus = max(int(gpus), 1)
        return _cost.step_time(self.cost(config), gpus, self.network(gpus), speed)

    def rate(self, config: dict[str, Any], gpus: int = 1, speed: float = 1.0) -> float:
        """Predicted samples per second."""
        gpus = max(int(gpus), 1)
        return _cost.training_rate(self.cost(config), gpus, self.network(gpus), speed)

    def samples(self, config: dict[str, Any]) -> float:
        """Samples the whole trial trains on (every epoch)."""
        cost = self.cost(config)
        return float(cost.samples * cost.epochs)

    def memory_gb(self, config: dict[str, Any], gpus: int = 1) -> float:
        return _cost.memory_bytes(self.cost(config), max(int(gpus), 1)) / 2**30


def _resolve(reference: str) -> Callable[[dict[str, Any]], ModelCost]:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _beside(objective: Any) -> Callable | None:
    """The ``cost`` function of the objective's module, if it has one."""
    module = objective.partition(":")[0] if isinstance(objective, str) else objective.__module__
    return getattr(importlib.import_module(module), "cost", None)
