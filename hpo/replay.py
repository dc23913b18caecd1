"""An earlier study's learning curves as an objective: try a pruner, a
scheduling policy or a search on what was already trained, on the
simulated engine, before spending GPU-hours on it.

``hpo.replay:curves`` reads the run directory named by the fixed key
``replay`` and, for each configuration, reports what the recorded trial
with that configuration reported, step by step, each step costing the
recorded trial's running time divided by its steps (:meth:`hpo.Trial.elapse`).
A configuration the earlier study did not run is an error, unless
``replay_nearest`` is true: then the recorded trial nearest to it (each
numeric parameter scaled to its range, categories equal or not) stands in.
Curves resume where they were suspended, as real training does.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.results import StudyResult
from hpo.store import TrialStatus

__all__ = ["curves", "Recorded", "recorded"]


@dataclass(frozen=True)
class Recorded:
    """One recorded trial: its configuration, reports and cost per step."""

    params: dict[str, Any]
    reports: list[tuple[int, dict[str, float]]]
    step_s: float
    returned: dict[str, float]


_cache: dict[Path, tuple[Recorded, ...]] = {}
_lock = threading.Lock()


def recorded(run_dir: str | Path) -> tuple[Recorded, ...]:
    """The trials of ``run_dir`` that reported, read once per process."""
    path = Path(run_dir).resolve()
    with _lock:
        if path not in _cache:
            try:
                result = StudyResult.load(path)
            except (UsageError, FileNotFoundError, KeyError) as exc:
                raise UsageError(f"replay: {path}: not a run directory hpo can read ({exc}).\n"
                                 '  fix: set the fixed key "replay" to an earlier study\'s run '
                                 "directory (runs/NAME)") from None
            _cache[path] = tuple(
                Recorded(dict(t.params), result.curves.get(t.number, []),
                         (t.duration_s or 0.0) / max(len(result.curves.get(t.number, [])), 1),
                         dict(t.metrics))
                for t in result.trials
                if result.curves.get(t.number) and t.state is not TrialStatus.FAILED)
        return _cache[path]


def curves(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Replay the recorded curve of ``config`` (see the module's help)."""
    config = dict(config)
    run_dir = config.pop("replay", None)
    nearest = bool(config.pop("replay_nearest", False))
    if not run_dir:
        raise UsageError('hpo.replay:curves needs the fixed key "replay": an earlier study\'s run '
                         'directory.\n  fix: add "fixed": {"replay": "runs/NAME"} to the space')
    found = _match(recorded(run_dir), config, nearest, run_dir)
    last: dict[str, float] = {}
    for step, metrics in found.reports:
        if step < trial.next_step:
            continue
        trial.elapse(found.step_s)
        trial.report(step, **metrics)
        last = metrics
        if trial.should_stop():
            break
    return last or found.returned


def _match(trials: tuple[Recorded, ...], config: dict[str, Any], nearest: bool,
           run_dir: str | Path) -> Recorded:
    wanted = {k: v for k, v in config.items() if any(k in t.params for t in trials)}
    for candidate in trials:
        if candidate.params == wanted:
            return candidate
    if not nearest or not trials:
        raise ValueError(f"replay: {run_dir} has no curve for {wanted}; set \"replay_nearest\": true "
                         "to replay the nearest recorded configuration, or search the recorded "
                         "grid (\"algorithm\": \"grid\" over the same space)")
    ranges = _ranges(trials)
    return min(trials, key=lambda t: _distance(t.params, wanted, ranges))


def _ranges(trials: tuple[Recorded, ...]) -> dict[str, tuple[float, float]]:
    numeric: dict[str, list[float]] = {}
    for t in trials:
        for name, value in t.params.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                numeric.setdefault(name, []).append(float(value))
    return {name: (min(values), max(values)) for name, values in numeric.items()}


def _distance(params: dict[str, Any], wanted: dict[str, Any], ranges: dict[str, tuple[float, float]]) -> float:
    total = 0.0
    for name, value in wanted.items():
        have = params.get(name)
        if name in ranges and isinstance(value, (int, float)) and isinstance(have, (int, float)):
            low, high = ranges[name]
            total += ((float(value) - float(have)) / ((high - low) or 1.0)) ** 2
        else:
            total += 0.0 if have == value else 1.0
    return math.sqrt(total)
