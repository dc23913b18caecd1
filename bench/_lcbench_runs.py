"""The contenders of bench/lcbench.py, each one run on one task and seed.

Every run gets a surrogate (``hpo.examples.lcbench.Surrogate``), a task,
``workers`` and a budget of simulated seconds, and gives back a
:class:`Trace`: the best validation error reported so far (at any epoch of
any trial) at each simulated instant it improved, up to the budget.

**Optuna, on a simulated clock, with none of hpo's code in its loop**
(:func:`simulate_optuna`): a discrete-event simulation of ``workers``
asynchronous workers sharing one in-memory study. A free worker calls
``study.ask()``, then steps through its configuration's curve; each epoch
is an event at the worker's simulated time (one heap orders every worker's
events), where it calls ``trial.report(value, step)`` and
``trial.should_prune()``, and at the last epoch or when pruned
``study.tell`` (COMPLETE, or PRUNED) and asks again at that instant.
Optuna's steps are the epochs 1 to 52, so ``HyperbandPruner(min_resource=1,
max_resource=52)`` has its rungs at epochs 1, 3, 9 and 27. Asking, pruning
and telling take no simulated time: Optuna's overheads are not modelled.

**hpo, through its real master** (:func:`run_hpo`): ``hpo.run`` of the
space of ``hpo.examples.lcbench`` with ``SimulatedEngine(slots=workers)``
(hpo's own costs, ``SimulatedCosts``' defaults, added to simulated time),
the budget as ``search.timeout_s``; the objective is
``hpo.examples.lcbench:train`` with its trial wrapped to note each report's
simulated time (``hpo.trial.now()``).
"""

from __future__ import annotations

import heapq
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from hpo.examples.lcbench import Hyperparameter, Surrogate
from hpo.examples.lcbench import train as lcbench_train

SEGMENT_STEPS = 4
"""Convergence-aware scheduling's segment, in epochs: about 1/8 of a 52-epoch
training, as Hermes' 10 s quantum was of its median job. Hermes schedules a
given set of jobs: the convergence contenders time-share a pool of as many
configurations as the budget could train fully (``run``'s ``pool``). Without
that bound, new trials (which rank first) keep arriving and the suspended ones
are seldom resumed (task 3945, 32 workers, 200 full trainings, random search:
regret 0.065 at half the budget, against 0.024 with a pool of 200)."""

HPO: dict[str, dict[str, Any]] = {
    **{f"hpo:random+{p}": {"search": {"algorithm": "random"}, "early_stopping": {"pruner": p}}
       for p in ("median", "asha", "hyperband")},
    "hpo:random+convergence": {"search": {"algorithm": "random"},
                               "scheduling": {"policy": "convergence", "segment_steps": SEGMENT_STEPS}},
    **{f"hpo:tpe+{p}": {"search": {"algorithm": "bayesian", "sampler": "tpe"}, "early_stopping": {"pruner": p}}
       for p in ("median", "asha", "hyperband")},
    "hpo:tpe+convergence": {"search": {"algorithm": "bayesian", "sampler": "tpe"},
                            "scheduling": {"policy": "convergence", "segment_steps": SEGMENT_STEPS}},
    # Bayesian search's default where trials stop early: learns from every report.
    **{f"hpo:multifidelity+{p}": {"search": {"algorithm": "bayesian", "sampler": "multifidelity"},
                                  "early_stopping": {"pruner": p}}
       for p in ("asha", "hyperband")},
    "hpo:multifidelity+convergence": {"search": {"algorithm": "bayesian", "sampler": "multifidelity"},
                                      "scheduling": {"policy": "convergence", "segment_steps": SEGMENT_STEPS}},
}
"""hpo's contenders: a name to the settings added to the LCBench space."""

OPTUNA: dict[str, Callable[[int, int], tuple[optuna.samplers.BaseSampler, optuna.pruners.BasePruner]]] = {
    "optuna:tpe+hyperband": lambda seed, steps: (
        optuna.samplers.TPESampler(seed=seed),
        optuna.pruners.HyperbandPruner(min_resource=1, max_resource=steps)),
    "optuna:tpe+sha": lambda seed, steps: (
        optuna.samplers.TPESampler(seed=seed),
        optuna.pruners.SuccessiveHalvingPruner(min_resource=1)),
    "optuna:random": lambda seed, steps: (
        optuna.samplers.RandomSampler(seed=seed), optuna.pruners.NopPruner()),
}
"""Optuna's contenders: a name to ``(seed, steps) -> (sampler, pruner)``."""

REFERENCE = "optuna:tpe+hyperband"

SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
"""Where the run directories go (and are thrown away): memory where there is
some, so that the store's fsyncs cost nothing (on task 3945, 32 workers, 200
full trainings, random + median: 36 s of wall time against 49 s on disk)."""


@dataclass
class Trace:
    """What one contender did on one task and seed."""

    points: list[tuple[float, float]] = field(default_factory=list)  # (simulated s, best so far)
    trials: int = 0
    epochs: int = 0
    wall_s: float = 0.0

    def improve(self, t: float, value: float) -> None:
        if not self.points or value < self.points[-1][1]:
            self.points.append((t, value))

    def best_at(self, t: float) -> float:
        """The best value reported by simulated time ``t`` (inf before the first report)."""
        best = math.inf
        for when, value in self.points:
            if when > t:
                break
            best = value
        return best

    def as_dict(self) -> dict[str, Any]:
        return {"points": self.points, "trials": self.trials, "epochs": self.epochs,
                "wall_s": round(self.wall_s, 3)}


def distributions(hyperparameters: tuple[Hyperparameter, ...]) -> dict[str, Any]:
    """The scenario's space as Optuna distributions."""
    out: dict[str, Any] = {}
    for h in hyperparameters:
        if h.kind == "categorical":
            out[h.name] = optuna.distributions.CategoricalDistribution(list(h.choices))
        elif h.kind == "int":
            out[h.name] = optuna.distributions.IntDistribution(int(h.low), int(h.high), log=h.log)
        else:
            out[h.name] = optuna.distributions.FloatDistribution(h.low, h.high, log=h.log)
    return out


def simulate_optuna(surrogate: Surrogate, task: str, sampler: optuna.samplers.BaseSampler,
                    pruner: optuna.pruners.BasePruner, workers: int, budget_s: float) -> Trace:
    """One asynchronous Optuna study of ``workers`` on ``task`` for ``budget_s`` simulated seconds."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.perf_counter()
    # A fixed name: Hyperband puts a trial in a bracket by a hash of the study's name.
    study = optuna.create_study(study_name=f"lcbench-{task}", direction="minimize", sampler=sampler,
                                pruner=pruner)
    space = distributions(surrogate.hyperparameters)
    trace = Trace()
    events: list[tuple[float, int, int]] = []  # (simulated time, sequence, worker)
    running: dict[int, tuple[optuna.trial.Trial, Any, int]] = {}  # worker -> (trial, curve, next step)
    sequence = 0

    def start(worker: int, now: float) -> None:
        nonlocal sequence
        trial = study.ask(space)
        curve = surrogate.curve(task, trial.params)
        trace.trials += 1
        running[worker] = (trial, curve, 0)
        sequence += 1
        heapq.heappush(events, (now + float(curve.costs[0]), sequence, worker))

    for worker in range(workers):
        start(worker, 0.0)
    while events:
        now, _, worker = heapq.heappop(events)
        if now > budget_s:
            break
        trial, curve, step = running[worker]
        value = float(curve.errors[step])
        trace.epochs += 1
        trace.improve(now, value)
        trial.report(value, step + 1)
        if step + 1 == len(curve):
            study.tell(trial, value)
        elif trial.should_prune():
            study.tell(trial, state=TrialState.PRUNED)
        else:
            running[worker] = (trial, curve, step + 1)
            sequence += 1
            heapq.heappush(events, (now + float(curve.costs[step + 1]), sequence, worker))
            continue
        start(worker, now)
    trace.wall_s = time.perf_counter() - began
    return trace


class _Noting:
    """A trial whose reports are also noted, with their simulated time, in a :class:`Trace`."""

    def __init__(self, trial: Any, trace: Trace, now: Callable[[], float]) -> None:
        self._trial, self._trace, self._now = trial, trace, now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)

    def report(self, step: int, **metrics: float) -> None:
        self._trace.epochs += 1
        self._trace.improve(self._now(), metrics["val_error"])
        self._trial.report(step, **metrics)


def run_hpo(surrogate: Surrogate, task: str, settings: dict[str, Any], workers: int,
            budget_s: float, seed: int) -> Trace:
    """One hpo study through its real master on the simulated engine."""
    import hpo
    from hpo.engines import SimulatedEngine
    from hpo.trial import now

    began = time.perf_counter()
    trace = Trace()

    def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
        if trial.next_step == 0:
            trace.trials += 1
        return lcbench_train(config, _Noting(trial, trace, now))

    train.preflight = lcbench_train.preflight  # type: ignore[attr-defined]
    search = {"max_trials": 1_000_000, **settings.get("search", {}), "seed": seed,
              "parallel": workers, "timeout_s": budget_s}
    space = surrogate_space(surrogate, task, name=f"lcbench-{task}-{seed}",
                            **{**settings, "search": search})
    with tempfile.TemporaryDirectory(prefix="hpo-lcbench-", dir=SCRATCH) as runs:
        hpo.run(space, train, engine=SimulatedEngine(slots=workers), runs_dir=runs, progress=False)
    trace.points = [(t, v) for t, v in trace.points if t <= budget_s]  # the study's end comes after it
    trace.wall_s = time.perf_counter() - began
    return trace


def surrogate_space(surrogate: Surrogate, task: str, **settings: Any) -> dict[str, Any]:
    """``hpo.examples.lcbench.space`` for an open surrogate."""
    from hpo.examples.lcbench import space

    return space(task, surrogate.folder, surrogate.scenario.name, **settings)


def run(name: str, surrogate: Surrogate, task: str, workers: int, budget_s: float, seed: int,
        pool: int) -> Trace:
    """The contender ``name`` (a key of :data:`HPO` or :data:`OPTUNA`) on one
    task and seed. ``pool``: the configurations a time-sharing policy schedules
    (the study's ``max_trials``)."""
    if name in OPTUNA:
        sampler, pruner = OPTUNA[name](seed, surrogate.steps)
        return simulate_optuna(surrogate, task, sampler, pruner, workers, budget_s)
    settings = HPO[name]
    if "scheduling" in settings:
        settings = {**settings, "search": {**settings["search"], "max_trials": pool}}
    return run_hpo(surrogate, task, settings, workers, budget_s, seed)
