"""Search algorithms behind one ask interface: grid, random, bayesian (TPE, GP,
multi-fidelity TPE).

The names a space may use are :data:`hpo.registry.ALGORITHMS` and
:data:`hpo.registry.SAMPLERS`; ``hpo.run(sampler=...)`` also takes any
Optuna sampler object, driven as Optuna drives it (``before_trial`` on each
new trial, ``after_trial`` once it ended, ``study.stop()`` honoured).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import optuna

from hpo.registry import ALGORITHMS, SAMPLERS
from hpo.search._base import Proposal, ProposalSampler, Searcher
from hpo.search._fidelity import MultiFidelitySampler, budgets, multifidelity_sampler
from hpo.search._paused import paused_view, sampler_view
from hpo.search._samplers import (
    GridSearcher,
    SamplerSearcher,
    gp_sampler,
    random_sampler,
    startup_trials,
    tpe_sampler,
)

if TYPE_CHECKING:
    from hpo.space import StudySpec

__all__ = ["Proposal", "Searcher", "GridSearcher", "SamplerSearcher", "create_study", "open_search",
           "random_sampler", "tpe_sampler", "gp_sampler", "multifidelity_sampler", "MultiFidelitySampler",
           "budgets", "startup_trials", "paused_view", "sampler_view"]


def create_study(spec: StudySpec, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Create the study in ``storage``, or load it to resume; the metrics' names
    are the study's metric names in Optuna (optuna-dashboard shows them)."""
    study = optuna.create_study(
        study_name=spec.name, storage=storage, directions=[m.direction for m in spec.metrics],
        sampler=ProposalSampler(spec.distributions()), load_if_exists=True,
    )
    names = [m.name for m in spec.metrics]
    if study.metric_names != names:  # written once, not at every resume
        with warnings.catch_warnings():  # "experimental" since Optuna 3.2; stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    return study


def open_search(spec: StudySpec, study: optuna.Study,
                sampler: optuna.samplers.BaseSampler | None = None) -> Searcher:
    """The searcher for ``spec`` over ``study`` (made by :func:`create_study`);
    ``sampler`` replaces the space's algorithm with an Optuna sampler object."""
    search = spec.search
    grid = spec.grid() if spec.grid_size is not None else None
    if sampler is None and search.algorithm == "grid":
        if grid is None:
            raise RuntimeError("hpo internal error: the space's validation: a grid search's parameters are finite")
        return GridSearcher(study, spec.params, grid)
    if sampler is not None:  # the user's: drawn again on a duplicate, never overruled
        return SamplerSearcher(study, spec.params, sampler, grid, search.seed, fills_in=False)
    factory = ALGORITHMS.factory(search.algorithm)
    if factory is None:  # bayesian search: the space's validation chose its sampler
        if search.sampler is None:
            raise RuntimeError("hpo internal error: search.sampler is not None")
        factory = SAMPLERS.factory(search.sampler)
    sampler = factory(seed=search.seed, max_trials=spec.max_trials, conditional=spec.conditional)
    return SamplerSearcher(study, spec.params, sampler, grid, search.seed)
