"""A study's results as read from its store: records, ranking, tables, export."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna

from hpo.store import RunDir, StudyStore
from hpo.store.records import (
    ENDED_BY_ATTR,
    Cost,
    EventRecord,
    SegmentRecord,
    TrialStatus,
    attr_of,
    cost_of,
    grouped_attrs,
    run_of,
    status_of,
    study_cost,
)
from hpo.units import format_seconds, format_value

__all__ = ["TrialRecord", "StudyResult", "record_fields"]


@dataclass(frozen=True)
class TrialRecord:
    """One trial as stored: configuration, outcome, where it ran and what it cost."""

    number: int
    state: TrialStatus
    value: float | None
    params: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    host: str | None = None
    attempt: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    core_seconds: float = 0.0  # every attempt; see cost for the parts
    gpu_seconds: float = 0.0
    steps: int = 0
    error: str | None = None  # one line: the type and message
    traceback: str | None = None  # the whole traceback, where the objective raised
    # Decisions (pruned, suspended, resumed, stopped...) and resumable segments,
    # in time order; see EVENT_ATTR and SEGMENT_ATTR.
    events: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost, compare=False, repr=False)
    #: One value per objective in a multi-objective study (``value`` is the
    #: first); None otherwise.
    values: list[float] | None = None

    @classmethod
    def from_frozen(cls, trial: optuna.trial.FrozenTrial) -> TrialRecord:
        reports, events, segments = grouped_attrs(trial)
        return cls(**record_fields(trial, len(reports), events, segments))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        del data["cost"]  # core_seconds and gpu_seconds say it
        if self.values is None:
            del data["values"]  # single objective: "value" says it
        return data


def record_fields(trial: optuna.trial.FrozenTrial, steps: int, events: list[EventRecord],
                  segments: list[SegmentRecord]) -> dict[str, Any]:
    """The :class:`TrialRecord` fields of a stored trial."""
    run = run_of(trial)
    cost = cost_of(trial)
    return dict(
        number=trial.number, state=status_of(trial),
        value=trial.values[0] if trial.values else None, params=dict(trial.params),
        values=list(trial.values) if trial.values and len(trial.values) > 1 else None,
        metrics=run.get("metrics") or {}, host=run.get("host"), attempt=run.get("attempt", 0),
        started_at=run.get("started_at"), ended_at=run.get("ended_at"),
        duration_s=run.get("duration_s"), core_seconds=cost.core_seconds,
        gpu_seconds=cost.gpu_seconds, steps=steps,
        error=_error_text(run, attr_of(trial, ENDED_BY_ATTR)),
        traceback=(run.get("error") or {}).get("traceback"), events=events, segments=segments,
        cost=cost,
    )


def _error_text(run: Mapping[str, Any], ended_by: dict[str, Any] | None) -> str | None:
    if ended_by:
        return f"{ended_by['reason']}: {ended_by['message']}"
    error = run.get("error")
    return f"{error['type']}: {error['message']}" if error else None


@dataclass
class StudyResult:
    """The results of a study, best first; what ``hpo.run`` returns.

    >>> result = StudyResult.load("runs/digits-quick")     # doctest: +SKIP
    >>> result.best.params, result.best.value               # doctest: +SKIP
    """

    name: str
    metric: str
    direction: str
    trials: list[TrialRecord]
    stop: dict[str, Any] | None = None
    #: Every trial's reports, ``(step, {metric: value})`` in step order, by trial number.
    curves: dict[int, list[tuple[int, dict[str, float]]]] = field(default_factory=dict, repr=False)
    #: Every objective as ``(metric, direction)`` in a multi-objective study; else empty.
    objectives: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def from_store(cls, store: StudyStore, metric: str) -> StudyResult:
        """``metric`` names the first objective; the others' names are the study's."""
        trials, curves = [], {}
        for frozen in store.trials():
            reports, events, segments = grouped_attrs(frozen)
            trials.append(TrialRecord(**record_fields(frozen, len(reports), events, segments)))
            curves[frozen.number] = reports
        direction = "maximize" if store.maximize else "minimize"
        return cls(store.name, metric, direction, trials, store.stop(), curves, _objectives_of(store))

    @classmethod
    def load(cls, run_dir: str | Path) -> StudyResult:
        """Read the results of the study in ``run_dir``, changing nothing there
        (a missing journal is an error, never created empty)."""
        run = RunDir(Path(run_dir))
        metric = run.read()["spec"]["metric"]
        first = metric[0] if isinstance(metric, list) else metric
        return cls.from_store(run.open_store(read_only=True), first["name"])

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def pareto_ranks(self) -> dict[int, int]:
        """Each completed trial's Pareto rank by trial number: 1 for the front
        (no other trial is as good in every objective and better in one), 2 for
        the front once those are set aside, and so on. Empty for one objective."""
        if not self.multi_objective:
            return {}
        signs = [-1.0 if direction == "maximize" else 1.0 for _, direction in self.objectives]
        losses = {t.number: [s * v for s, v in zip(signs, t.values)]
                  for t in self.trials if t.state is TrialStatus.COMPLETE and t.values}
        return _non_dominated_ranks(losses)

    @property
    def pareto_front(self) -> list[TrialRecord]:
        """The completed trials no other dominates, by number (Optuna's
        ``study.best_trials``)."""
        ranks = self.pareto_ranks()
        return [t for t in self.trials if ranks.get(t.number) == 1]

    @property
    def best(self) -> TrialRecord | None:
        """The first of :meth:`ranked`, found without sorting them all."""
        complete = [t for t in self.trials if t.state is TrialStatus.COMPLETE]
        sign = -1.0 if self.direction == "maximize" else 1.0
        return min(complete, key=lambda t: (sign * _value_of(t), t.number), default=None)

    def ranked(self) -> list[TrialRecord]:
        """Completed trials best first; then trials that ended early with a
        value (stopped, pruned), best first; then those still under way; then
        those without a result (failed, timed out, cancelled), each by number.

        Only completed trials have a rank (:meth:`rank_of`).
        """
        sign = -1.0 if self.direction == "maximize" else 1.0
        pareto = self.pareto_ranks()  # multi-objective: by Pareto rank, then the first objective

        def key(t: TrialRecord) -> tuple:
            group = _RANK_GROUPS.get(t.state, 3)
            if group == 1 and t.value is None:
                group = 3
            value = t.value if group <= 1 else None
            return group, pareto.get(t.number, 0), sign * value if value is not None else 0.0, t.number

        return sorted(self.trials, key=key)

    def rank_of(self, position: int, trial: TrialRecord) -> int | None:
        """The rank shown for the trial at ``position`` (0-based) of :meth:`ranked`:
        completed trials only, since only their values answer the question asked;
        in a multi-objective study, the trial's Pareto rank."""
        if trial.state is not TrialStatus.COMPLETE:
            return None
        return self.pareto_ranks().get(trial.number) if self.multi_objective else position + 1

    @property
    def counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in TrialStatus}
        for trial in self.trials:
            counts[trial.state.value] += 1
        return counts

    @property
    def cost(self) -> dict[str, float]:
        spent = study_cost((t.state, t.cost) for t in self.trials)
        return {"core_hours": spent.core_hours, "gpu_hours": spent.gpu_hours}

    def summary(self) -> dict[str, Any]:
        """What ``hpo status --json`` prints."""
        best = self.best
        return {
            "study": self.name, "metric": self.metric, "direction": self.direction,
            "trials": len(self.trials), "counts": self.counts, "stopped": self.stop,
            "best": None if best is None else {"number": best.number, "value": best.value,
                                               "params": best.params},
            **self.cost,
            **(self._pareto_summary() if self.multi_objective else {}),
        }

    def ranks(self) -> dict[int, int]:
        """The rank shown for each completed trial, by number (see :meth:`rank_of`)."""
        if self.multi_objective:
            return self.pareto_ranks()
        return {t.number: r for i, t in enumerate(self.ranked()) if (r := self.rank_of(i, t)) is not None}

    def _pareto_summary(self) -> dict[str, Any]:
        return {
            "objectives": [{"metric": m, "direction": d} for m, d in self.objectives],
            "pareto_front": [{"number": t.number, "values": t.values, "params": t.params}
                             for t in self.pareto_front],
        }

    def pareto_table(self) -> str:
        """The Pareto front as plain text, by first objective (multi-objective only)."""
        sign = -1.0 if self.objectives[0][1] == "maximize" else 1.0
        front = sorted(self.pareto_front, key=lambda t: (sign * _values_of(t)[0], t.number))
        names = sorted({k for t in front for k in t.params})
        header = ["trial", *(f"{m} ({d[:3]})" for m, d in self.objectives), *names]
        rows = [[str(t.number), *(format_value(v) for v in _values_of(t)),
                 *(_param_cell(t, n) for n in names)] for t in front]
        return f"Pareto front ({len(front)} trials)\n" + _text_table(header, rows)

    def table(self, limit: int | None = None) -> str:
        """A plain-text leaderboard, best configuration first; with ``limit``,
        its first rows and a last line saying how many were left out. An
        ``error`` column, cut to its first words, when a row shown has one."""
        names = sorted({k for t in self.trials for k in t.params})
        metrics = [m for m, _ in self.objectives] or [self.metric]
        shown = self.ranked()[:limit]
        errors = any(t.error for t in shown)
        header = ["rank", "trial", "state", *metrics, "time_s", *names, *(["error"] if errors else [])]
        ranks = self.ranks()
        rows = [[format_value(ranks.get(t.number)), str(t.number), t.state.value,
                 *(format_value(v) for v in (t.values if t.values else [t.value] * len(metrics))),
                 format_seconds(t.duration_s), *(_param_cell(t, n) for n in names),
                 *([_error_cell(t.error)] if errors else [])]
                for t in shown]
        text = _text_table(header, rows)
        if len(rows) < len(self.trials):
            text += f"\n... {len(self.trials) - len(rows)} more trials not shown"
        return text

    def to_json(self) -> str:
        """Every trial, best first, with its reports (learning curves) as
        ``"reports": [{"step": s, "metrics": {...}}]``."""
        ranks = self.pareto_ranks()
        trials = [{**t.to_dict(), **self._pareto_fields(t, ranks),
                   "reports": [{"step": step, "metrics": metrics}
                               for step, metrics in self.curves.get(t.number, [])]}
                  for t in self.ranked()]
        return json.dumps({**self.summary(), "trials": trials}, indent=2)

    def curves_csv(self) -> str:
        """Learning curves in long format: one row per trial, step and metric."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["number", "state", "step", "metric", "value"])
        for t in self.ranked():
            for step, metrics in self.curves.get(t.number, []):
                for name, value in metrics.items():
                    writer.writerow([t.number, t.state.value, step, name, value])
        return out.getvalue()

    def to_csv(self) -> str:
        """One row per trial; parameters and metrics in ``params.*`` and
        ``metrics.*`` columns, so their names never clash with the fixed ones."""
        fixed = ["number", "state", "value", "host", "attempt", "started_at", "started_iso",
                 "ended_at", "ended_iso", "duration_s", "core_seconds", "gpu_seconds", "steps", "error",
                 "traceback"]
        params = sorted({f"params.{k}" for t in self.trials for k in t.params})
        metrics = sorted({f"metrics.{k}" for t in self.trials for k in t.metrics})
        pareto = ([f"values.{m}" for m, _ in self.objectives] + ["pareto_rank", "pareto"]
                  if self.multi_objective else [])
        out = io.StringIO()
        writer = csv.DictWriter(out, fixed + pareto + params + metrics, extrasaction="ignore")
        writer.writeheader()
        ranks = self.pareto_ranks()
        for t in self.ranked():
            row = {**t.to_dict(), **self._pareto_fields(t, ranks),
                   "started_iso": _iso(t.started_at), "ended_iso": _iso(t.ended_at)}
            row.update({f"values.{m}": v for (m, _), v in zip(self.objectives, t.values or [])})
            row.update({f"params.{k}": v for k, v in t.params.items()})
            row.update({f"metrics.{k}": v for k, v in t.metrics.items()})
            writer.writerow(row)
        return out.getvalue()

    def _pareto_fields(self, trial: TrialRecord, ranks: dict[int, int]) -> dict[str, Any]:
        """A trial's Pareto rank and whether it is on the front (multi-objective only)."""
        if not self.multi_objective:
            return {}
        rank = ranks.get(trial.number)
        return {"pareto_rank": rank, "pareto": rank == 1}


def _value_of(trial: TrialRecord) -> float:
    """The value of a completed trial (which has one)."""
    if trial.value is None:
        raise RuntimeError("hpo internal error: trial.value is not None")
    return trial.value


def _values_of(trial: TrialRecord) -> list[float]:
    """The values of a trial on the Pareto front (which has them)."""
    if trial.values is None:
        raise RuntimeError("hpo internal error: trial.values is not None")
    return trial.values


def _param_cell(trial: TrialRecord, name: str) -> str:
    """A parameter's table cell: ``-`` where the trial does not have it (a
    conditional parameter left inactive by the others' values), as for any
    value a trial lacks; the CSV export leaves such cells empty."""
    return format_value(trial.params.get(name))


#: Characters of an error shown in a table row (``hpo status --trial N`` shows it all).
ERROR_CELL_CHARS = 60


def _error_cell(error: str | None) -> str:
    """A table's error cell: its first line, cut to ``ERROR_CELL_CHARS``."""
    if not error:
        return "-"
    line = error.splitlines()[0]
    return line if len(line) <= ERROR_CELL_CHARS else line[:ERROR_CELL_CHARS - 3] + "..."


def _iso(epoch: float | None) -> str | None:
    """A time as ISO 8601 in UTC, to the millisecond (``2026-11-26T17:23:28.042+00:00``).

    >>> _iso(0.5), _iso(None)
    ('1970-01-01T00:00:00.500+00:00', None)
    """
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _objectives_of(store: StudyStore) -> list[tuple[str, str]]:
    """``(metric, direction)`` of each objective of a multi-objective study; else []."""
    directions = store.storage.get_study_directions(store.study_id)
    if len(directions) < 2:
        return []
    names = store.study().metric_names or [f"objective_{i}" for i in range(len(directions))]
    return [(name, "maximize" if d == optuna.study.StudyDirection.MAXIMIZE else "minimize")
            for name, d in zip(names, directions)]


def _dominates(a: list[float], b: list[float]) -> bool:
    """Whether losses ``a`` are as low as ``b`` in every objective and lower in one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def _non_dominated_ranks(losses: dict[int, list[float]]) -> dict[int, int]:
    """Non-dominated sorting: peel off the front of what is left, rank by rank."""
    ranks: dict[int, int] = {}
    left = dict(losses)
    rank = 1
    while left:
        front = [n for n, a in left.items() if not any(_dominates(b, a) for b in left.values())]
        ranks.update(dict.fromkeys(front, rank))
        for n in front:
            del left[n]
        rank += 1
    return ranks


# Where a state sorts in the leaderboard (see StudyResult.ranked).
_RANK_GROUPS = {
    TrialStatus.COMPLETE: 0, TrialStatus.STOPPED: 1, TrialStatus.PRUNED: 1,
    TrialStatus.RUNNING: 2, TrialStatus.SUSPENDED: 2, TrialStatus.PENDING: 2,
}

