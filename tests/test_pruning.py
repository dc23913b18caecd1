"""The master's pruners decide as Optuna's pruners with the same settings,
decision by decision, while keeping their statistics as reports land."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from hpo.master import AshaPruning, HyperbandPruning, MedianPruning, make_pruning

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _curve(rng: random.Random, steps: int, maximize: bool) -> list[float]:
    """A noisy learning curve, sometimes with a NaN in it."""
    quality = rng.random()
    sign = 1.0 if maximize else -1.0
    curve = [sign * quality * (1 - math.exp(-(s + 1) / rng.uniform(2, 8))) + rng.gauss(0, 0.02)
             for s in range(steps)]
    if rng.random() < 0.05:
        curve[rng.randrange(steps)] = math.nan
    return curve


def _decisions(theirs: optuna.pruners.BasePruner, ours, maximize: bool, seed: int,
               trials: int = 120, steps: int = 30, parallel: int = 6) -> tuple[list, list]:
    """Run the same asynchronous study through both: each report is followed
    by a decision; a pruned trial ends PRUNED, one that reports every step
    ends COMPLETE. The two lists of (trial, step, pruned) must match."""
    rng = random.Random(seed)
    study = optuna.create_study(direction="maximize" if maximize else "minimize", pruner=theirs,
                                study_name=ours.study_name)
    waiting = list(range(trials))
    active: dict[int, tuple[optuna.Trial, list[float], int]] = {}
    mine, optunas = [], []
    values: dict[int, dict[int, float]] = {}
    while waiting or active:
        while waiting and len(active) < parallel:
            waiting.pop(0)
            trial = study.ask()
            active[trial.number] = (trial, _curve(rng, steps, maximize), 0)
            values[trial.number] = {}
        number = rng.choice(sorted(active))
        trial, curve, step = active[number]
        value = curve[step]
        trial.report(value, step)
        values[number][step] = value
        ours.observe(number, step, values[number])
        mine.append((number, step, ours.decide(trial._trial_id, number, step, values[number]) is not None))
        optunas.append((number, step, trial.should_prune()))
        if optunas[-1][2]:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            del active[number]
        elif step + 1 == steps:
            if math.isnan(value):  # no value to end with: FAILED, in hpo as in Optuna
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
                ours.completed(number, values[number])
            del active[number]
        else:
            active[number] = (trial, curve, step + 1)
    return mine, optunas


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("startup, warmup, interval", [(2, 0, 1), (5, 3, 2), (1, 1, 3)])
def test_median_decides_as_optunas_median_pruner(maximize, seed, startup, warmup, interval):
    theirs = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup,
                                         interval_steps=interval)
    ours = MedianPruning(n_startup_trials=startup, n_warmup_steps=warmup, interval_steps=interval,
                         maximize=maximize, study_name="s")
    mine, optunas = _decisions(theirs, ours, maximize, seed)
    assert mine == optunas and any(p for *_, p in mine)


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_resource, factor, rate", [(1, 4, 0), (2, 3, 1), (3, 2, 0)])
def test_asha_decides_as_optunas_successive_halving(maximize, seed, min_resource, factor, rate):
    theirs = optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource,
                                                    reduction_factor=factor,
                                                    min_early_stopping_rate=rate)
    ours = AshaPruning(min_resource=min_resource, reduction_factor=factor,
                       min_early_stopping_rate=rate, maximize=maximize, study_name="s")
    mine, optunas = _decisions(theirs, ours, maximize, seed)
    assert mine == optunas and any(p for *_, p in mine)


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_resource, factor", [(1, 3), (2, 2)])
def test_hyperband_decides_as_optunas_hyperband(maximize, seed, min_resource, factor):
    theirs = optuna.pruners.HyperbandPruner(min_resource=min_resource, reduction_factor=factor)
    ours = HyperbandPruning(min_resource=min_resource, reduction_factor=factor, maximize=maximize,
                            study_name=f"hyperband-{seed}")
    mine, optunas = _decisions(theirs, ours, maximize, seed)
    assert mine == optunas and any(p for *_, p in mine)


def test_the_space_names_build_the_masters_pruners():
    built = {name: make_pruning({"pruner": name, "min_steps": 2}, maximize=True, study_name="s",
                                metric="acc") for name in ("none", "median", "asha", "hyperband")}
    assert built["none"] is None
    assert [type(built[n]).__name__ for n in ("median", "asha", "hyperband")] == [
        "MedianPruning", "AshaPruning", "HyperbandPruning"]
    assert not any(built[n].slow for n in ("median", "asha", "hyperband"))
    custom = make_pruning(None, maximize=True, study_name="s", metric="acc",
                          pruner=optuna.pruners.PatientPruner(None, patience=2))
    assert custom.slow and custom.name == "PatientPruner"
