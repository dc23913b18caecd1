"""Engines: how trial tasks run (compss, dask, inline), behind one interface."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from hpo.engines._base import Engine
from hpo.errors import UsageError

if TYPE_CHECKING:
    from hpo.space import StudySpec

__all__ = ["Engine", "ENGINES", "make_engine", "default_engine_name"]

ENGINES = ("auto", "dask", "compss", "inline")


def default_engine_name() -> str:
    """compss under the COMPSs runtime, else the embedded dask engine."""
    from hpo.engines._compss import under_compss_runtime

    return "compss" if under_compss_runtime() else "dask"


def make_engine(name: str, spec: "StudySpec", scheduler: str | None = None,
                workers: int | None = None) -> Engine:
    """The engine called ``name`` ("auto" picks one), configured for ``spec``."""
    if name == "auto":
        name = default_engine_name()
    resources = spec.resources
    if scheduler and name != "dask":
        raise UsageError(f"--scheduler is for the dask engine, not {name!r}.\n  fix: add --engine dask")
    if scheduler and workers:
        raise UsageError("--workers sizes the embedded Dask cluster; with --scheduler the running "
                         "workers are used.\n  fix: drop one of --workers and --scheduler")
    if name == "dask":
        from hpo.engines._dask import DaskEngine

        return DaskEngine(scheduler, workers or spec.search.parallel, resources.cpus,
                          resources.gpus, spec.retries)
    if name == "compss":
        if importlib.util.find_spec("pycompss") is None:
            raise UsageError("the compss engine needs PyCOMPSs, which is not installed here.\n"
                             "  fix: run under a COMPSs installation (runcompss hpo_main.py SPACE), "
                             "or use --engine dask")
        from hpo.engines._compss import CompssEngine

        return CompssEngine(resources.cpus, resources.gpus, resources.memory_gb,
                            resources.time_limit_s, spec.search.parallel)
    if name == "inline":
        from hpo.engines._inline import InlineEngine

        return InlineEngine(spec.retries)
    raise UsageError(f"unknown engine {name!r}.\n  fix: use one of {', '.join(ENGINES)}")
