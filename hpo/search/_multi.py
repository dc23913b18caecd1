"""Samplers for multi-objective studies (Optuna's TPE handles them too)."""

from __future__ import annotations

import optuna

from hpo.search._samplers import startup_trials

__all__ = ["nsga2_sampler"]


def nsga2_sampler(seed: int | None = None, max_trials: int = 0,
                  conditional: bool = False) -> optuna.samplers.BaseSampler:
    """Optuna's NSGA-II: a genetic search for the Pareto front. Its population
    is a third of the budget (2 to 10), so that a short study still breeds."""
    population = startup_trials(max_trials)
    return optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
