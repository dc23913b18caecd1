"""``hpo.run``: one call runs a whole study, from a script or a notebook."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from hpo.engines import Engine, make_engine
from hpo.errors import EngineError, UsageError
from hpo.master import Controller, nothing_left
from hpo.results import StudyResult
from hpo.space import StudySpec, load_spec, parse_spec
from hpo.store import RunDir, check_storage_url
from hpo.trial import Objective, preflight, reference_of, refuse_trials_while_importing, resolve_objective

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
        spec = parse_spec(space, default_name=_name_of(space))
    else:
        spec = load_spec(space)
    return spec.with_overrides(**overrides)


def _name_of(space: dict) -> str:
    """The study name of a space given as a dict without ``"name"``: from its
    content, so that the same dict resumes its study and another starts its own.

    >>> _name_of({"space": {"x": [1, 2]}}) == _name_of({"space": {"x": [1, 2]}})
    True
    """
    text = json.dumps(space, sort_keys=True, default=repr)
    return "study-" + hashlib.sha1(text.encode()).hexdigest()[:8]


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
        A dict without ``"name"`` is named from its content (``study-1a2b3c4d``).
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
        pruner is asked in the master, on its replica of the study, as Optuna
        asks it (its cost grows with the study: the space's named pruners
        keep their statistics as reports land instead).
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
    refuse_trials_while_importing("a study (hpo.run)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress line says enough
    if workers is not None and workers < 1:  # 0 would read as "the default"
        raise UsageError(f"workers={workers!r}: expected an integer >= 1.\n"
                         "  fix: pass workers=None for one worker per slot that fits the machine")
    spec = prepare(space, algorithm=algorithm, max_trials=max_trials, parallel=parallel,
                   seed=seed, timeout_s=timeout_s, name=name,
                   objective=objective if isinstance(objective, str) else None)
    say = _Say(progress)
    if not callable(objective):
        say(f"importing the objective {objective or spec.objective} to check it")
    # Fail before any task starts: an objective that cannot be found, or that
    # can tell no trial would run (its data missing), stops the study once here.
    preflight(resolve_objective(objective or spec.objective, spec.source), spec.fixed, spec.source)
    # Everything is checked before anything is recorded: a refused run leaves
    # the run directory as it was (or absent).
    run_dir = RunDir(Path(runs_dir) / spec.name)
    record = spec.to_dict()
    record["objective"] = reference_of(objective or spec.objective)
    run_dir.check(record, storage, allow_changes)
    if storage:
        check_storage_url(storage)
    _refuse_ignored(engine, scheduler, workers)
    done = _complete(run_dir, spec)
    if done is not None:  # said before any engine starts, and none is started
        why, result = done
        say(f"study {spec.name} is complete ({why}): nothing left to run, no engine started")
        return result
    try:
        chosen = _engine(engine, spec, scheduler, workers)
        say(f"starting the {chosen.name} engine")
        with run_dir.lease() as lease, chosen:  # one master per study; the engine reachable
            say(f"{chosen.name} engine ready: {chosen.slots} trial slots; the first results "
                "come as the first trials end")
            storage_url = run_dir.create(record, storage, allow_changes)
            controller = Controller(spec, run_dir, storage_url, chosen,
                                    objective=objective if callable(objective) else None,
                                    sampler=sampler, pruner=pruner, progress=progress, lease=lease)
            return controller.run()
    except EngineError as exc:  # resources no worker offers: name the file, as SpaceError does
        raise EngineError(f"{spec.source}: {exc}") from None


def _complete(run_dir: RunDir, spec: StudySpec) -> tuple[str, StudyResult] | None:
    """Why the study in ``run_dir`` has nothing left to run, and its results;
    None for a new study or one with trials left."""
    if not run_dir.study_file.exists():
        return None
    try:
        store = run_dir.open_store(read_only=True)
    except UsageError:  # no study in its store yet: the run creates it
        return None
    why = nothing_left(store, spec.max_trials)
    return None if why is None else (why, StudyResult.from_store(store, spec.metric.name))


class _Say:
    """One line on stderr per step of the start, so a slow one is not a silent one."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self._started = enabled, time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            print(f"hpo: {text} ({time.monotonic() - self._started:.1f} s)", file=sys.stderr, flush=True)


def _refuse_ignored(engine: str | Engine, scheduler: str | None, workers: int | None) -> None:
    """An engine object is configured already: scheduler= and workers= would be ignored."""
    if not isinstance(engine, Engine):
        return
    if scheduler or workers:  # they would be ignored: refuse rather than surprise
        raise UsageError("scheduler= and workers= configure an engine chosen by name; the "
                         f"{engine.name} engine object passed is configured already.\n"
                         "  fix: drop them, or set them on the engine object")


def _engine(engine: str | Engine, spec: StudySpec, scheduler: str | None,
            workers: int | None) -> Engine:
    if not isinstance(engine, Engine):
        return make_engine(engine, spec, scheduler=scheduler, workers=workers)
    return engine
