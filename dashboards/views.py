"""The list of views the dashboard and the report show, and the summary line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import plotly.graph_objects as go

from hpo.dashboards import allocation, analysis, figures, pareto, timeline
from hpo.dashboards.data import Snapshot
from hpo.units import format_resource_time

__all__ = ["View", "VIEWS", "PARETO", "ALLOCATION", "views_of", "summary"]


class View(NamedTuple):
    key: str
    label: str
    what: str  # one line under the tab / section heading
    figure: Callable[[Snapshot], go.Figure]


VIEWS = (
    View("history", "History",
         "Each trial's metric by trial number and the best so far; pruned and stopped trials at "
         "the value they ended with, failed trials as red ticks along the bottom.", figures.history),
    View("parallel", "Parallel coordinates",
         "Each completed trial as a line through its parameters to its metric; drag along an axis "
         "to keep only the trials in that range (drag again elsewhere to add a range, click the "
         "axis to clear).", figures.parallel),
    View("importance", "Importance",
         "How much of the metric's variation each parameter explains (Optuna fANOVA), with its "
         "uncertainty.", analysis.importance),
    View("slices", "Slices", "The metric against each parameter; darker points are later trials.",
         analysis.slices),
    View("contour", "Contour",
         "The metric over two parameters, interpolated between the trials (the points); pick the "
         "pair in the menu.", analysis.contour),
    View("curves", "Learning curves",
         "Every reported metric at each step (pick it in the menu, with a log scale if needed); "
         "x marks where a trial was pruned, a square where it was stopped. The y range fits the "
         "bulk of the curves: the autoscale button shows all.", figures.curves),
    View("timeline", "Timeline",
         "Each worker's trials over time, coloured by state; hatched bars are attempts lost and "
         "retried, suspended segments show in cyan.", timeline.timeline),
    View("utilisation", "Utilisation and cost",
         "Busy slots against the slots available, and the core- and GPU-hours each outcome took.",
         timeline.utilisation),
)


PARETO = View("pareto", "Pareto front",
              "Completed trials by the first two objectives; red: the Pareto front (no other trial "
              "is as good in every objective and better in one), joined in order.", pareto.pareto)


ALLOCATION = View("allocation", "Allocation",
                  "Each trial's actual time against the cost model's prediction (hover: its GPUs, "
                  "nodes, place and every change of allocation with its reason), and each GPU's "
                  "busy time.", allocation.allocation)


def views_of(snap: Snapshot) -> tuple[View, ...]:
    """The views of this study: the Pareto front first in a multi-objective
    one; the allocation view where the master placed trials."""
    views = (PARETO, *VIEWS) if snap.objectives else VIEWS
    return (*views, ALLOCATION) if allocation.has_allocations(snap) else views


def summary(snap: Snapshot) -> str:
    """One line: trials by state, best trial, cost, when it was read (plain text)."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in snap.result.counts.items() if n)
    best = snap.result.best
    spent = timeline.cost(snap)
    parts = [f"study {snap.name}", f"{len(snap.trials)} trials" + (f": {counts}" if counts else "")]
    if snap.objectives:
        parts.append(f"Pareto front {len(snap.result.pareto_front)} trials")
    elif best is not None:
        parts.append(f"best {snap.metric}={best.value + 0.0:.6g} (trial {best.number})")
    parts.append(f"{format_resource_time(spent['core_hours'])}, "
                 f"{format_resource_time(spent['gpu_hours'], 'GPU')}")
    if snap.stop:
        parts.append(f"stopped: {snap.stop.get('reason')}")
    parts.append(f"read {datetime.fromtimestamp(snap.taken_at):%Y-%m-%d %H:%M:%S}")
    return " | ".join(parts)
