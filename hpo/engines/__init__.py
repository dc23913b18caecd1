"""Engines: how trial tasks run (compss, dask, inline; simulated: on simulated
time, in the master's process), behind one interface.

Chosen by name through :data:`hpo.registry.ENGINES` (``make_engine``), or
passed to ``hpo.run`` as an :class:`Engine` object.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from hpo.engines._base import (
    Abandons,
    Engine,
    FollowsTasks,
    HasInventory,
    MasterClock,
    ReachesEveryWorker,
    SubmitsMany,
    WallClock,
    gather,
)
from hpo.engines._compss import CompssEngine, under_compss_runtime
from hpo.engines._dask import DaskEngine
from hpo.engines._inline import InlineEngine
from hpo.engines._simulated import SimulatedCosts, SimulatedEngine, SimulatedTime
from hpo.errors import UsageError
from hpo.machine import trials_per_node, visible_gpus
from hpo.registry import ENGINES

if TYPE_CHECKING:
    from hpo.space import StudySpec

__all__ = ["Engine", "MasterClock", "WallClock", "gather", "SubmitsMany", "ReachesEveryWorker", "Abandons",
           "HasInventory", "FollowsTasks", "DaskEngine", "CompssEngine",
           "InlineEngine", "SimulatedEngine", "SimulatedCosts", "SimulatedTime", "make_engine",
           "default_engine_name", "under_compss_runtime", "visible_gpus", "trials_per_node"]


def default_engine_name() -> str:
    """compss under the COMPSs runtime, else the embedded dask engine."""
    return "compss" if under_compss_runtime() else "dask"


def make_engine(name: str, spec: StudySpec, scheduler: str | None = None,
                workers: int | None = None) -> Engine:
    """The engine called ``name`` ("auto" picks one), configured for ``spec``."""
    if name == "auto":
        name = default_engine_name()
    if name not in ENGINES:
        raise UsageError(f"{ENGINES.unknown(name)}.\n  fix: use auto or one of {', '.join(ENGINES.names)}")
    if name == "compss" and importlib.util.find_spec("pycompss") is None:
        raise UsageError("the compss engine needs PyCOMPSs, which is not installed here.\n"
                         "  fix: run under a COMPSs installation (runcompss hpo_main.py SPACE), "
                         "or use --engine dask")
    return ENGINES.factory(name).from_spec(spec, scheduler=scheduler, workers=workers)
