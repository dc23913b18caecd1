"""Search algorithms behind one ask interface: grid, random, bayesian (TPE, GP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from hpo.search._base import Proposal, ProposalSampler, Searcher
from hpo.search._samplers import GridSearcher, SamplerSearcher, make_inner_sampler

if TYPE_CHECKING:
    from hpo.space import StudySpec

__all__ = ["Proposal", "Searcher", "GridSearcher", "SamplerSearcher", "open_search"]


def open_search(spec: "StudySpec", storage: optuna.storages.BaseStorage) -> Searcher:
    """Create (or resume) the study in ``storage`` and its searcher."""
    distributions = spec.distributions()
    study = optuna.create_study(
        study_name=spec.name, storage=storage, direction=spec.metric.direction,
        sampler=ProposalSampler(distributions), load_if_exists=True,
    )
    search = spec.search
    grid = spec.grid() if spec.grid_size is not None else None
    if search.algorithm == "grid":
        return GridSearcher(study, distributions, grid)
    inner = make_inner_sampler(search.algorithm, search.sampler, search.seed, spec.max_trials)
    return SamplerSearcher(study, distributions, inner, grid, search.seed)
