"""The list of views the dashboard and the report show, and the summary line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import plotly.graph_objects as go

from hpo.dashboards import figures, timeline
from hpo.dashboards.data import Snapshot

__all__ = ["View", "VIEWS", "summary"]


class View(NamedTuple):
    key: str
    label: str
    what: str  # one line under the tab / section heading
    figure: Callable[[Snapshot], go.Figure]


VIEWS = (
    View("history", "History", "Each completed trial's metric by trial number, and the best so far.",
         figures.history),
    View("parallel", "Parallel coordinates",
         "Each completed trial as a line through its parameters to its metric; drag on an axis to "
         "select a range.", figures.parallel),
    View("importance", "Importance",
         "How much each parameter decides whether a trial reaches the top 10% (Optuna PED-ANOVA).",
         figures.importance),
    View("curves", "Learning curves",
         "The metric at each reported step; x marks where a trial was pruned, a square where it "
         "was stopped.", figures.curves),
    View("timeline", "Timeline",
         "Each worker's trials over time, coloured by state; hatched bars are attempts lost and "
         "retried, suspended segments show in cyan.", timeline.timeline),
    View("utilisation", "Utilisation and cost",
         "Busy slots against the slots available, and the core- and GPU-hours each outcome took.",
         timeline.utilisation),
)


def summary(snap: Snapshot) -> str:
    """One line: trials by state, best trial, cost, when it was read (plain text)."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in snap.result.counts.items() if n)
    best = snap.result.best
    spent = timeline.cost(snap)
    parts = [f"study {snap.name}", f"{len(snap.trials)} trials" + (f": {counts}" if counts else "")]
    if best is not None:
        parts.append(f"best {snap.metric}={best.value + 0.0:.6g} (trial {best.number})")
    parts.append(f"{spent['core_hours']:.2f} core-hours, {spent['gpu_hours']:.2f} GPU-hours")
    if snap.stop:
        parts.append(f"stopped: {snap.stop.get('reason')}")
    parts.append(f"read {datetime.fromtimestamp(snap.taken_at):%Y-%m-%d %H:%M:%S}")
    return " | ".join(parts)
