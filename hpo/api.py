"""``hpo.run``: one call runs a whole study, from a script or a notebook."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna

from hpo.control import Controller
from hpo.engines import Engine, make_engine
from hpo.errors import EngineError, UsageError
from hpo.results import StudyResult
from hpo.space import StudySpec, load_spec, parse_spec
from hpo.store import RunDir
from hpo.store._storage_url import check_storage_url
from hpo.trial import Objective, reference_of, resolve_objective

__all__ = ["run", "prepare"]


def prepare(space: str | os.PathLike | dict | StudySpec, **overrides: Any) -> StudySpec:
    """Load and validate a space (a path, a dict or a spec), applying overrides.

    Overrides are the search settings a command line may change: ``name``,
    ``objective``, ``algorithm``, ``sampler``, ``max_trials``, ``parallel``,
    ``seed``, ``timeout_s``; None values are ignored.
    """
    if isinstance(space, StudySpec):
        spec = space
    elif isinstance(space, dict):
        spec = parse_spec(space)
    else:
        spec = load_spec(space)
    return spec.with_overrides(**overrides)


def run(
    space: str | os.PathLike | dict | StudySpec,
    objective: str | Objective | None = None,
    *,
    algorithm: str | None = None,
    max_trials: int | None = None,
    parallel: int | None = None,
    seed: int | None = None,
    timeout_s: float | None = None,
    name: str | None = None,
    engine: str | Engine = "auto",
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    storage: str | None = None,
    runs_dir: str | os.PathLike = "runs",
    progress: bool = True,
    allow_changes: bool = False,
) -> StudyResult:
    """Run (or resume) a study and return its results, best first.

    Parameters
    ----------
    space:
        A space file path, a dict in the same format, or a parsed StudySpec.
    objective:
        ``train(config, trial)`` as a callable or as ``"package.module:function"``;
        defaults to the space's ``"objective"``. A callable defined in a notebook
        works with the dask and inline engines; COMPSs needs an importable one.
    algorithm, max_trials, parallel, seed, timeout_s, name:
        Override the space's settings.
    engine:
        ``"auto"`` (compss under the COMPSs runtime, else dask), ``"dask"``,
        ``"compss"`` or ``"inline"``; or an :class:`~hpo.engines.Engine` object.
    sampler, pruner:
        Optuna objects used instead of the space's ``search`` algorithm and
        ``early_stopping.pruner``, as ``optuna.create_study`` takes them. The
        pruner travels to the workers with each task: it must pickle.
    scheduler, workers:
        For dask: an existing scheduler's address or scheduler file; or the
        number of worker processes of the embedded cluster.
    storage:
        An Optuna storage URL (``sqlite:///...``, ``postgresql://...``) instead
        of the journal file in the run directory.
    runs_dir:
        Where run directories are created: ``<runs_dir>/<study name>/``.
    allow_changes:
        Resume a study whose space, fixed values, objective or metric name
        changed since its first run (refused otherwise: results would mix).

    Examples
    --------
    >>> import hpo, tempfile
    >>> def train(config, trial):
    ...     return -(config["x"] - 2) ** 2
    >>> result = hpo.run({"space": {"x": [0, 1, 2, 3]}, "metric": {"name": "score"}}, train,
    ...                  engine="inline", runs_dir=tempfile.mkdtemp(), progress=False)
    >>> result.best.params
    {'x': 2}
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress line says enough
    if workers is not None and workers < 1:  # 0 would read as "the default"
        raise UsageError(f"workers={workers!r}: expected an integer >= 1.\n"
                         "  fix: pass workers=None for one worker per slot that fits the machine")
    spec = prepare(space, algorithm=algorithm, max_trials=max_trials, parallel=parallel,
                   seed=seed, timeout_s=timeout_s, name=name,
                   objective=objective if isinstance(objective, str) else None)
    resolve_objective(objective or spec.objective, spec.source)  # fail before any task starts
    # Everything is checked before anything is recorded: a refused run leaves
    # the run directory as it was (or absent).
    run_dir = RunDir(Path(runs_dir) / spec.name)
    record = spec.to_dict()
    record["objective"] = reference_of(objective or spec.objective)
    run_dir.check(record, storage, allow_changes)
    if storage:
        check_storage_url(storage)
    try:
        chosen = _engine(engine, spec, scheduler, workers)
        with run_dir.lease(), chosen:  # one master per study; the engine reachable
            storage_url = run_dir.create(record, storage, allow_changes)
            controller = Controller(spec, run_dir, storage_url, chosen,
                                    objective=objective if callable(objective) else None,
                                    sampler=sampler, pruner=pruner, progress=progress)
            return controller.run()
    except EngineError as exc:  # resources no worker offers: name the file, as SpaceError does
        raise EngineError(f"{spec.source}: {exc}") from None


def _engine(engine: str | Engine, spec: StudySpec, scheduler: str | None,
            workers: int | None) -> Engine:
    if not isinstance(engine, Engine):
        return make_engine(engine, spec, scheduler=scheduler, workers=workers)
    if scheduler or workers:  # they would be ignored: refuse rather than surprise
        raise UsageError("scheduler= and workers= configure an engine chosen by name; the "
                         f"{engine.name} engine object passed is configured already.\n"
                         "  fix: drop them, or set them on the engine object")
    return engine
