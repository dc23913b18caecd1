"""scikit-learn on its bundled digits, trained epoch by epoch with ``partial_fit``.

No Keras, no download: the quickest real objectives with a learning curve, so
pruners and schedulers have something to work with.

- ``hpo.examples.sklearn_digits:train``: a linear ``SGDClassifier``. Config keys
  (all optional): ``alpha`` (1e-4), ``l1_ratio`` (0.15; the penalty is
  elasticnet), ``loss`` ("hinge"; any ``SGDClassifier`` loss), ``max_epochs``
  (20), ``seed`` (0). Each epoch reports ``accuracy`` and ``loss = 1 - accuracy``
  on the held-out split; returns the best epoch's ``{"accuracy", "loss"}``.
- ``hpo.examples.sklearn_digits:train_mlp``: an ``MLPClassifier`` (Adam or SGD).
  Config keys: ``learning_rate`` (1e-3), ``units`` (64), ``solver`` ("adam"),
  ``batch_size`` (64), ``max_epochs`` (20), ``seed`` (0); for SGD only
  ``momentum`` (0.9) and ``nesterov`` (true), for Adam only ``beta_1`` (0.9),
  as a conditional space gives them. Each epoch reports
  ``val_loss`` (log loss) and ``val_accuracy``; returns the epoch with the
  lowest ``val_loss``.

Both take ``reports_per_epoch`` (1): report after each part of an epoch, as
training loops that log every N mini-batches do.

Both checkpoint the model and their random state after every epoch into
``trial.checkpoint_dir`` and resume from it: a trial suspended at the end of a
segment (round-robin or convergence-aware scheduling) or retried after its
worker died continues exactly where it stopped, epoch counter included.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from hpo.examples.datasets import load_digits_split

__all__ = ["train", "train_mlp"]

Metrics = dict[str, float]


def train(config: dict[str, Any], trial: Any) -> Metrics:
    """A linear SGDClassifier; return the best epoch's accuracy."""
    from sklearn.linear_model import SGDClassifier

    def fresh_model():
        return SGDClassifier(
            loss=config.get("loss", "hinge"), penalty="elasticnet",
            alpha=float(config.get("alpha", 1e-4)), l1_ratio=float(config.get("l1_ratio", 0.15)),
            random_state=int(config.get("seed", 0)),
        )

    def score(model, x_val, y_val) -> Metrics:
        accuracy = float(model.score(x_val, y_val))
        return {"accuracy": accuracy, "loss": 1.0 - accuracy}

    return fit_in_epochs(fresh_model, score, config, trial, best=lambda m: m["accuracy"])


def train_mlp(config: dict[str, Any], trial: Any) -> Metrics:
    """A one-hidden-layer MLPClassifier; return the epoch with the lowest validation log loss."""
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier

    def fresh_model():
        return MLPClassifier(
            hidden_layer_sizes=(int(config.get("units", 64)),), solver=config.get("solver", "adam"),
            learning_rate_init=float(config.get("learning_rate", 1e-3)),
            batch_size=int(config.get("batch_size", 64)), random_state=int(config.get("seed", 0)),
            momentum=float(config.get("momentum", 0.9)), nesterovs_momentum=bool(config.get("nesterov", True)),
            beta_1=float(config.get("beta_1", 0.9)),
        )

    def score(model, x_val, y_val) -> Metrics:
        probabilities = model.predict_proba(x_val)
        return {"val_loss": float(log_loss(y_val, probabilities, labels=model.classes_)),
                "val_accuracy": float(model.score(x_val, y_val))}

    return fit_in_epochs(fresh_model, score, config, trial, best=lambda m: -m["val_loss"])


def fit_in_epochs(fresh_model: Callable[[], Any], score: Callable[..., Metrics],
                  config: dict[str, Any], trial: Any, best: Callable[[Metrics], float]) -> Metrics:
    """Train with ``partial_fit``, reporting and checkpointing after every
    1/``reports_per_epoch`` of an epoch (default 1: once per epoch); resume
    from the trial's checkpoint when there is one. Step s trains on chunk
    ``s % reports_per_epoch`` of epoch ``s // reports_per_epoch``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.preprocessing import StandardScaler

    max_epochs, per_epoch = int(config.get("max_epochs", 20)), int(config.get("reports_per_epoch", 1))
    if max_epochs < 1 or per_epoch < 1:
        raise ValueError(f"max_epochs and reports_per_epoch must be at least 1, got {max_epochs}, {per_epoch}")
    (x_train, y_train), (x_val, y_val) = load_digits_split()
    scaler = StandardScaler().fit(x_train)
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)
    state = _load(trial) or {
        "model": fresh_model(), "step": 0, "best": None, "order": None,
        "rng": np.random.default_rng(int(config.get("seed", 0))).bit_generator.state,
    }
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    model, classes, steps = state["model"], np.unique(y_train), max_epochs * per_epoch
    for step in range(state["step"], steps):
        if step % per_epoch == 0:
            state["order"] = rng.permutation(len(x_train))  # a new epoch
        chunk = np.array_split(state["order"], per_epoch)[step % per_epoch]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.partial_fit(x_train[chunk], y_train[chunk], classes=classes)
        metrics = score(model, x_val, y_val)
        trial.report(step, **metrics)
        if state["best"] is None or best(metrics) > best(state["best"]):
            state["best"] = metrics
        state.update(model=model, step=step + 1, rng=rng.bit_generator.state)
        _save(trial, state)
        if step + 1 < steps and trial.should_stop():  # the last step ends it anyway
            break
    if state["best"] is None:
        raise RuntimeError(f"no step to train: the checkpoint is at step {state['step']}")
    return dict(state["best"])


def _load(trial: Any) -> dict[str, Any] | None:
    return trial.load_checkpoint() if getattr(trial, "checkpoint_dir", None) else None


def _save(trial: Any, state: dict[str, Any]) -> None:
    if getattr(trial, "checkpoint_dir", None):
        trial.save_checkpoint(state)
