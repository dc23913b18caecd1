"""Every name a user may write for an extension point, and what it builds.

One table per kind: engines, search algorithms, Bayesian samplers, pruners and
scheduling policies. Space validation, the command line's choices and error
messages all read their names from here. Factories are import references,
resolved only when used, so this module sits at the bottom of the package:
the space layer imports it without reaching up into the layers it names.

>>> PRUNERS.names
('none', 'median', 'asha', 'hyperband')
>>> type(PRUNERS.make("median", min_steps=2, maximize=True)).__name__
'MedianPruning'
"""

from __future__ import annotations

import importlib
from typing import Any

from hpo.errors import closest

__all__ = ["Registry", "ENGINES", "ALGORITHMS", "SAMPLERS", "PRUNERS", "POLICIES"]


class Registry:
    """Names of one kind of extension, each with the factory that builds it
    (``"package.module:callable"``, or None for "nothing to build")."""

    def __init__(self, kind: str, entries: dict[str, str | None]) -> None:
        self.kind = kind
        self._entries = entries

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def factory(self, name: str) -> Any:
        """The callable registered as ``name`` (a class, a function: whatever
        the reference names), or None; ValueError naming the choices."""
        if name not in self._entries:
            raise ValueError(self.unknown(name))
        reference = self._entries[name]
        if reference is None:
            return None
        module, _, attr = reference.partition(":")
        return getattr(importlib.import_module(module), attr)

    def make(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Build ``name`` (None for an entry with nothing to build)."""
        factory = self.factory(name)
        return None if factory is None else factory(*args, **kwargs)

    def unknown(self, name: object) -> str:
        """The message for a name that is not registered."""
        hint = closest(str(name), self.names)
        guess = f" (did you mean {hint!r}?)" if hint else ""
        return f"unknown {self.kind} {name!r}{guess}; expected one of {', '.join(self.names)}"

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self._entries!r})"


ENGINES = Registry("engine", {
    "dask": "hpo.engines:DaskEngine",
    "compss": "hpo.engines:CompssEngine",
    "inline": "hpo.engines:InlineEngine",
    "simulated": "hpo.engines:SimulatedEngine",
})
# Grid search needs no sampler; random search uses Optuna's RandomSampler,
# Bayesian search one of SAMPLERS.
ALGORITHMS = Registry("search algorithm", {
    "grid": None,
    "random": "hpo.search:random_sampler",
    "bayesian": None,
})
SAMPLERS = Registry("sampler", {
    "tpe": "hpo.search:tpe_sampler",
    "gp": "hpo.search:gp_sampler",
    "multifidelity": "hpo.search:multifidelity_sampler",  # BOHB's model per budget: every report counts
    "nsga2": "hpo.search._multi:nsga2_sampler",  # multi-objective studies
})
PRUNERS = Registry("pruner", {
    "none": None,
    "median": "hpo.master:median_pruning",
    "asha": "hpo.master:asha_pruning",
    "hyperband": "hpo.master:hyperband_pruning",
})
# FIFO runs every trial to its end: no segments (a policy all the same, so the master has one mode).
POLICIES = Registry("scheduling policy", {
    "fifo": "hpo.master:Fifo",
    "round_robin": "hpo.master:RoundRobin",
    "convergence": "hpo.master:ConvergenceAware",
    "slaq": "hpo.master:Slaq",
})
