"""The digits MLP with an emulated resume cost, for bench/time_to_target.py.

A resumed trial first sleeps ``resume_cost_s`` (timed as a checkpoint
restore, as Keras's callback is), standing for loading a large model back
onto a GPU; scikit-learn's own checkpoints load in milliseconds.
"""

from __future__ import annotations

import time
from typing import Any

from hpo.examples.sklearn_digits import train_mlp


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    config = dict(config)
    cost = float(config.pop("resume_cost_s", 0.0))
    if cost and trial.next_step > 0:
        with trial.checkpoint_timer("restore"):
            time.sleep(cost)
    return train_mlp(config, trial)
