"""A synthetic study written straight into a run directory, for the scale
benchmark, the tests and trying the dashboard without running anything.

Trials carry the same attributes ``hpo`` writes (run record, reports,
events, segments, earlier attempts) and are scheduled on ``workers`` worker
processes spread over hosts, so every view has something real to draw. The
journal is built in memory through Optuna's own ``JournalStorage`` and
written in one go: 100,000 trials take seconds instead of the hours
100,000 x 20 fsync'd appends would.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages.journal import BaseJournalBackend

from hpo.store.records import (
    EVENT_ATTR,
    RUN_ATTR,
    SEGMENT_ATTR,
    EventRecord,
    TrialStatus,
    event_key,
    event_record,
    report_key,
    segment_key,
)

__all__ = ["write_study", "SPACE", "L1_RATIO", "OBJECTIVES"]

SPACE = {
    "learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "units": {"type": "int", "low": 16, "high": 512},
    "optimizer": {"type": "categorical", "choices": ["adam", "sgd", "rmsprop"]},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
}
_DISTRIBUTIONS = {
    "learning_rate": FloatDistribution(1e-4, 1e-1, log=True),
    "units": IntDistribution(16, 512),
    "optimizer": CategoricalDistribution(["adam", "sgd", "rmsprop"]),
    "dropout": FloatDistribution(0.0, 0.5),
}
# A conditional parameter (``conditional=True``): set only when the optimizer is sgd.
L1_RATIO = {"type": "float", "low": 0.0, "high": 1.0, "when": {"optimizer": "sgd"}}
# The objectives of a multi-objective study (``objectives=3``), first to last.
OBJECTIVES: tuple[dict[str, Any], ...] = ({"name": "val_accuracy", "direction": "maximize"},
                                          {"name": "latency_ms", "direction": "minimize"},
                                          {"name": "memory_mb", "direction": "minimize"})


class _Buffer(BaseJournalBackend):
    """A journal kept in a list, dumped to a file at the end."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int):
        return self.logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.logs.extend(logs)


def write_study(run_dir: str | Path, trials: int, *, workers: int = 64, steps: int = 10,
                seed: int = 0, name: str = "synthetic", running: int = 8,
                extra_choice: str | None = None, conditional: bool = False,
                objectives: int = 1) -> Path:
    """Write a study of ``trials`` trials into ``run_dir`` (created) and return it.

    ``extra_choice`` adds one more optimizer choice (e.g. a string with HTML in
    it, to test that views show it as text). ``conditional`` adds ``l1_ratio``,
    set only in the sgd trials, where it decides much of the metric.
    ``objectives`` (2 or 3) makes a multi-objective study of the first of
    :data:`OBJECTIVES` (its pruned trials have no value, as Optuna wants).
    """
    rng = random.Random(seed)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    choices = ["adam", "sgd", "rmsprop"] + ([extra_choice] if extra_choice else [])
    distributions = {**_DISTRIBUTIONS, "optimizer": CategoricalDistribution(choices)}
    space = {**SPACE, "optimizer": {"type": "categorical", "choices": choices}}
    if conditional:
        space["l1_ratio"] = L1_RATIO
    metrics = [dict(m) for m in OBJECTIVES[:objectives]] if objectives > 1 else \
        {"name": "val_accuracy", "direction": "maximize", "target": None}
    spec = {"name": name, "objective": "synthetic", "metric": metrics,
            "search": {"algorithm": "random", "max_trials": trials, "parallel": workers},
            "resources": {"cpus": 4, "gpus": 1}, "space": space}
    backend = _Buffer()
    storage = optuna.storages.JournalStorage(backend)
    study = optuna.create_study(study_name=name, storage=storage,
                                directions=[m["direction"] for m in OBJECTIVES[:max(objectives, 1)]])
    if objectives > 1:
        with warnings.catch_warnings():  # "experimental" since Optuna 3.2
            warnings.simplefilter("ignore")
            study.set_metric_names([m["name"] for m in OBJECTIVES[:objectives]])
    hosts = max(1, workers // 8)
    # Each worker takes the next trial as soon as it is free, as the engines do;
    # times start at 0 and are shifted at the end so that the study ends now.
    free = [(rng.random() * 5, slot) for slot in range(workers)]
    made, last = [], 0.0
    for number in range(trials):
        at, slot = heapq.heappop(free)
        is_running = number >= trials - min(running, trials // 4)
        frozen, ended = _trial(rng, number, slot, hosts, at, steps, is_running,
                               choices, distributions, conditional, objectives)
        last = last if is_running else max(last, ended)
        heapq.heappush(free, (ended + rng.random() * 0.5, slot))
        made.append(frozen)
    offset = time.time() - last - 30.0
    for start in range(0, len(made), 2000):
        study.add_trials([_shifted(t, offset) for t in made[start:start + 2000]])
    text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in backend.logs)
    (run_dir / "journal.log").write_text(text)
    (run_dir / "study.json").write_text(json.dumps({"spec": spec, "storage": "journal.log"}))
    return run_dir


def _trial(rng: random.Random, number: int, slot: int, hosts: int, start: float, steps: int,
           running: bool, choices: list[str], distributions: dict, conditional: bool = False,
           objectives: int = 1) -> tuple[Any, float]:
    params: dict[str, Any] = {
        "learning_rate": math.exp(rng.uniform(math.log(1e-4), math.log(1e-1))),
        "units": rng.randint(16, 512),
        "optimizer": rng.choice(choices),
        "dropout": rng.uniform(0.0, 0.5),
    }
    distributions = dict(distributions)
    if conditional and params["optimizer"] == "sgd":
        params["l1_ratio"] = rng.uniform(0.0, 1.0)
        distributions["l1_ratio"] = FloatDistribution(0.0, 1.0)
    final = (0.97 - 0.04 * abs(math.log10(params["learning_rate"]) + 2.5)
             - (0.03 if params["optimizer"] == "sgd" else 0.0) - 0.05 * params["dropout"] ** 2
             + 0.01 * math.log2(params["units"] / 16) / 5 + rng.gauss(0, 0.01)
             - 0.08 * params.get("l1_ratio", 0.0) ** 2)
    roll = rng.random()
    state = ("PRUNED" if roll < 0.12 else "FAILED" if roll < 0.16 else "TIMEOUT" if roll < 0.18
             else "COMPLETE")
    if running:
        state = "RUNNING"
    done_steps = rng.randint(1, max(1, steps // 2)) if state in ("PRUNED", "FAILED") else steps
    step_s = rng.uniform(5.0, 30.0)
    host, pid = f"node{slot % hosts:03d}", 10_000 + slot
    attrs: dict[str, Any] = {}
    t = start
    previous: list[dict[str, Any]] = []
    if rng.random() < 0.02:  # an earlier attempt lost to an infrastructure fault
        lost = t + rng.uniform(10, 60)
        previous.append({"attempt": 1, "host": f"node{(slot + 1) % hosts:03d}", "pid": pid + 1,
                         "started_at": t, "ended_at": lost,
                         "error": {"type": "Lost", "message": "worker died"},
                         "core_seconds": 4 * (lost - t), "gpu_seconds": lost - t})
        t = lost + 1.0
    started = t
    segmented = rng.random() < 0.05 and state == "COMPLETE"
    intermediate = {}
    for step in range(done_steps):
        value = final - 0.3 * math.exp(-0.5 * step) + rng.gauss(0, 0.003)
        intermediate[step] = value
        attrs[report_key(step)] = {"val_accuracy": value, "loss": 1.0 - value}
    ended = started + done_steps * step_s
    if segmented:  # suspended half-way, resumed later on the same worker
        half = done_steps // 2
        pause = rng.uniform(30, 120)
        cut = started + half * step_s
        ended += pause
        attrs[segment_key(0)] = _segment(0, host, pid, started, cut, 0, half - 1, "SUSPENDED")
        attrs[segment_key(1)] = _segment(1, host, pid, cut + pause, ended, half,
                                         done_steps - 1, "COMPLETE")
        attrs[event_key(int(cut * 1e9), 1)] = _event(cut, "suspended", half - 1, host)
        attrs[event_key(int((cut + pause) * 1e9), 1)] = _event(cut + pause, "resumed", half, host)
    if state == "PRUNED":
        attrs[event_key(int(ended * 1e9), 1)] = _event(ended, "pruned", done_steps - 1, host)
    run: dict[str, Any] = {"host": host, "pid": pid, "attempt": len(previous) + 1,
                           "started_at": previous[0]["started_at"] if previous else started,
                           "attempt_started_at": started, "segment_started_at": started,
                           "cpus": 4, "gpus": ["0"], "previous": previous}
    # As the worker keeps them: every attempt's cost, earlier ones included.
    retried = sum(p["gpu_seconds"] for p in previous)
    run.update(duration_s=retried, core_seconds=4 * retried, gpu_seconds=retried)
    if not running:
        duration = ended - started
        error = ({"type": "RuntimeError", "message": "CUDA out of memory"} if state == "FAILED"
                 else {"type": "TimeLimit", "message": "exceeded time_limit_s"}
                 if state == "TIMEOUT" else None)
        run.update(ended_at=ended, duration_s=duration + retried,
                   core_seconds=4 * (duration + retried), gpu_seconds=duration + retried,
                   metrics=attrs.get(report_key(done_steps - 1)),
                   error=error, timed_out=state == "TIMEOUT")
    attrs[RUN_ATTR] = run
    optuna_state = TrialStatus(state).stored_as
    value = intermediate.get(done_steps - 1) if state in ("COMPLETE", "PRUNED") else None
    values = _objective_values(value, params, objectives) if state == "COMPLETE" else None
    frozen = optuna.trial.create_trial(
        state=optuna_state, value=value if values is None and objectives < 2 else None,
        values=values, params=params, distributions={k: distributions[k] for k in params},
        system_attrs=attrs, intermediate_values=intermediate)
    return frozen, ended


def _objective_values(accuracy: float | None, params: dict[str, Any],
                      objectives: int) -> list[float] | None:
    """The objectives after the first: bigger networks are slower and bigger."""
    if objectives < 2 or accuracy is None:
        return None
    latency = 0.02 * params["units"] * (1.5 if params["optimizer"] == "adam" else 1.0)
    memory = 4.0 * params["units"] + 200 * params["dropout"]
    return [accuracy, latency, memory][:objectives]


def _shifted(trial: optuna.trial.FrozenTrial, offset: float) -> optuna.trial.FrozenTrial:
    """The trial with every time moved by ``offset`` seconds."""
    def move(d: dict[str, Any], *keys: str) -> dict[str, Any]:
        return {**d, **{k: d[k] + offset for k in keys if isinstance(d.get(k), float)}}

    attrs = {}
    for key, value in trial.system_attrs.items():
        if key == RUN_ATTR:
            value = move(value, "started_at", "ended_at", "attempt_started_at", "segment_started_at")
            value["previous"] = [move(p, "started_at", "ended_at") for p in value["previous"]]
        elif key.startswith(SEGMENT_ATTR):
            value = move(value, "started_at", "ended_at")
        elif key.startswith(EVENT_ATTR):
            value = move(value, "time")
            key = event_key(int(value["time"] * 1e9), 1)
        attrs[key] = value
    trial.system_attrs = attrs
    run = attrs[RUN_ATTR]
    trial.datetime_start = datetime.fromtimestamp(run["started_at"], UTC)
    if run.get("ended_at") is not None:
        trial.datetime_complete = datetime.fromtimestamp(run["ended_at"], UTC)
    return trial


def _segment(index: int, host: str, pid: int, start: float, end: float, first: int, last: int,
             outcome: str) -> dict[str, Any]:
    return {"index": index, "host": host, "pid": pid, "worker": None, "started_at": start,
            "ended_at": end, "first_step": first, "last_step": last, "outcome": outcome}


def _event(time: float, kind: str, step: int, host: str) -> EventRecord:
    return event_record(kind, step, f"synthetic {kind}", host, now=time)
