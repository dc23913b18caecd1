"""``hpo.examples.lcbench:train`` with its time scaled and read back: each
epoch costs the surrogate's time times the fixed key ``time_scale``, and
each report carries ``clock``, the trial's clock when it was made
(:func:`hpo.trial.now`: simulated time on the simulated engine, the
machine's monotonic clock elsewhere), so that a simulated run and a real one
can be laid side by side (``bench/sim_vs_real.py``)."""

from __future__ import annotations

from typing import Any

from hpo.examples.lcbench import train as lcbench_train
from hpo.trial import now


class _Scaled:
    def __init__(self, trial: Any, scale: float) -> None:
        self._trial, self._scale = trial, scale

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)

    def elapse(self, seconds: float) -> None:
        self._trial.elapse(seconds * self._scale)

    def report(self, step: int, **metrics: float) -> None:
        self._trial.report(step, **metrics, clock=now())


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    config = dict(config)
    scale = float(config.pop("time_scale", 1.0))
    return lcbench_train(config, _Scaled(trial, scale))


train.preflight = lambda fixed: lcbench_train.preflight(  # type: ignore[attr-defined]
    {k: v for k, v in fixed.items() if k != "time_scale"})
