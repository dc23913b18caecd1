"""A study's results as read from its store: records, ranking, tables, export."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from hpo.store import RunDir, StudyStore
from hpo.store.records import (
    ENDED_BY_ATTR, Cost, TrialStatus, cost_of, grouped_attrs, run_of, status_of, study_cost,
)

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
    error: str | None = None
    # Decisions (pruned, suspended, resumed, stopped...) and resumable segments,
    # in time order; see EVENT_ATTR and SEGMENT_ATTR.
    events: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost, compare=False, repr=False)

    @classmethod
    def from_frozen(cls, trial: optuna.trial.FrozenTrial) -> "TrialRecord":
        reports, events, segments = grouped_attrs(trial)
        return cls(**record_fields(trial, len(reports), events, segments))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        del data["cost"]  # core_seconds and gpu_seconds say it
        return data


def record_fields(trial: optuna.trial.FrozenTrial, steps: int, events: list[dict[str, Any]],
                  segments: list[dict[str, Any]]) -> dict[str, Any]:
    """The :class:`TrialRecord` fields of a stored trial."""
    run = run_of(trial)
    cost = cost_of(trial)
    return dict(
        number=trial.number, state=status_of(trial),
        value=trial.value if trial.values else None, params=dict(trial.params),
        metrics=run.get("metrics") or {}, host=run.get("host"), attempt=run.get("attempt", 0),
        started_at=run.get("started_at"), ended_at=run.get("ended_at"),
        duration_s=run.get("duration_s"), core_seconds=cost.core_seconds,
        gpu_seconds=cost.gpu_seconds, steps=steps,
        error=_error_text(run, trial.user_attrs.get(ENDED_BY_ATTR)), events=events, segments=segments,
        cost=cost,
    )


def _error_text(run: dict[str, Any], ended_by: dict[str, Any] | None) -> str | None:
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

    @classmethod
    def from_store(cls, store: StudyStore, metric: str) -> "StudyResult":
        trials = [TrialRecord.from_frozen(t) for t in store.trials()]
        direction = "maximize" if store.maximize else "minimize"
        return cls(store.name, metric, direction, trials, store.stop())

    @classmethod
    def load(cls, run_dir: str | Path) -> "StudyResult":
        """Read the results of the study in ``run_dir``, changing nothing there
        (a missing journal is an error, never created empty)."""
        run = RunDir(Path(run_dir))
        return cls.from_store(run.open_store(read_only=True), run.read()["spec"]["metric"]["name"])

    @property
    def best(self) -> TrialRecord | None:
        ranked = self.ranked()
        return ranked[0] if ranked and ranked[0].state is TrialStatus.COMPLETE else None

    def ranked(self) -> list[TrialRecord]:
        """Completed trials best first, then the others by number."""
        sign = -1.0 if self.direction == "maximize" else 1.0
        complete = [t for t in self.trials if t.state is TrialStatus.COMPLETE]
        others = [t for t in self.trials if t.state is not TrialStatus.COMPLETE]
        return sorted(complete, key=lambda t: (sign * t.value, t.number)) + others

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
        }

    def table(self, limit: int | None = None) -> str:
        """A plain-text leaderboard, best configuration first."""
        names = sorted({k for t in self.trials for k in t.params})
        header = ["rank", "trial", "state", self.metric, "time_s", *names]
        rows = [[str(i + 1), str(t.number), t.state.value, _fmt(t.value), _fmt(t.duration_s, 1),
                 *(_fmt(t.params.get(n)) for n in names)]
                for i, t in enumerate(self.ranked()[:limit])]
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                 for row in [header, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({**self.summary(), "trials": [t.to_dict() for t in self.ranked()]}, indent=2)

    def to_csv(self) -> str:
        """One row per trial; parameters and metrics in ``params.*`` and
        ``metrics.*`` columns, so their names never clash with the fixed ones."""
        fixed = ["number", "state", "value", "host", "attempt", "started_at", "ended_at",
                 "duration_s", "core_seconds", "gpu_seconds", "steps", "error"]
        params = sorted({f"params.{k}" for t in self.trials for k in t.params})
        metrics = sorted({f"metrics.{k}" for t in self.trials for k in t.metrics})
        out = io.StringIO()
        writer = csv.DictWriter(out, fixed + params + metrics, extrasaction="ignore")
        writer.writeheader()
        for t in self.ranked():
            row = t.to_dict()
            row.update({f"params.{k}": v for k, v in t.params.items()})
            row.update({f"metrics.{k}": v for k, v in t.metrics.items()})
            writer.writerow(row)
        return out.getvalue()


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):  # (+ 0.0 turns -0.0 into 0.0)
        return f"{value + 0.0:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)
