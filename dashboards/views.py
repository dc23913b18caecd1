"""The list of views the dashboard and the report show, their tabs in groups, and
the summary line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import plotly.graph_objects as go

from hpo.dashboards import allocation, analysis, edf, figures, importance, parallel, pareto, rank, timeline
from hpo.dashboards.data import Snapshot
from hpo.units import format_resource_time

__all__ = ["View", "VIEWS", "PARETO", "ALLOCATION", "GROUPS", "views_of", "view_of", "picked", "draw",
           "tab_rows", "summary", "LEADERBOARD", "TRIAL", "COMPARE"]


RESULTS, ANALYSIS, RESOURCES = "Results", "Analysis", "Resources"
GROUPS = (RESULTS, ANALYSIS, RESOURCES)


class View(NamedTuple):
    key: str
    label: str
    what: str  # one line under the tab / section heading
    figure: Callable[..., go.Figure]  # figure(snap) draws it as the report shows it
    group: str = RESULTS  # the row of tabs it is in
    # What else the dashboard passes: "axes" (two names, picked among axes(snap)),
    # "brush" (the parallel coordinates' ranges) or "selection" (the trials inside them).
    takes: str = ""
    axes: Callable[[Snapshot], list[str]] | None = None


def _params(snap: Snapshot) -> list[str]:
    return snap.param_names


def _objectives(snap: Snapshot) -> list[str]:
    return [name for name, _ in snap.objectives]


VIEWS = (
    View("history", "History",
         "Each trial's metric and the best so far, by trial number or by the time it ended (the "
         "buttons); pruned and stopped trials at the value they ended with, failed trials as red "
         "ticks along the bottom. Trials brushed in the parallel coordinates are shown alone.",
         figures.history, takes="selection"),
    View("edf", "EDF",
         "The empirical distribution of the completed trials' values: the share of trials at or "
         "below each value.", edf.edf),
    View("parallel", "Parallel coordinates",
         "Each completed trial as a line through its parameters to its metric; drag along an axis "
         "to keep only the trials in that range (drag again elsewhere to add a range, click the "
         "axis to clear): the leaderboard and the history then show only those trials.",
         parallel.parallel, ANALYSIS, takes="brush"),
    View("importance", "Importance",
         "How much of the metric's variation each parameter explains (Optuna fANOVA), with its "
         "uncertainty; a parameter set in only some trials is scored on those (light bars).",
         importance.importance, ANALYSIS),
    View("slices", "Slices", "The metric against each parameter; darker points are later trials.",
         analysis.slices, ANALYSIS),
    View("contour", "Contour",
         "The metric over two parameters, interpolated between the trials (the points); pick the "
         "pair with the axis menus.", analysis.contour, ANALYSIS, takes="axes", axes=_params),
    View("rank", "Rank",
         "Completed trials over two parameters, coloured by rank (best to worst), so outliers "
         "cannot wash the colours out; pick the pair with the axis menus.", rank.rank, ANALYSIS,
         takes="axes", axes=_params),
    View("curves", "Learning curves",
         "Every reported metric at each step (pick it in the menu, with a log scale if needed); "
         "x marks where a trial was pruned, a square where it was stopped. The y range fits the "
         "bulk of the curves: the autoscale button shows all.", figures.curves),
    View("timeline", "Timeline",
         "Each worker's trials over time, coloured by state; hatched bars are attempts lost and "
         "retried, suspended segments show in cyan.", timeline.timeline, RESOURCES),
    View("utilisation", "Utilisation and cost",
         "Busy slots against the slots available, and the core- and GPU-hours each outcome took.",
         timeline.utilisation, RESOURCES),
)


PARETO = View("pareto", "Pareto front",
              "Completed trials by two objectives (pick them with the axis menus); red: the Pareto "
              "front (no other trial is as good in every objective and better in one).",
              pareto.pareto, takes="axes", axes=_objectives)


ALLOCATION = View("allocation", "Allocation",
                  "Each trial's actual time against the cost model's prediction (hover: its GPUs, "
                  "nodes, place and every change of allocation with its reason), and each GPU's "
                  "busy time.", allocation.allocation, RESOURCES)


def views_of(snap: Snapshot) -> tuple[View, ...]:
    """The views of this study: the Pareto front first in a multi-objective
    one; the allocation view where the master placed trials."""
    views = (PARETO, *VIEWS) if snap.objectives else VIEWS
    return (*views, ALLOCATION) if allocation.has_allocations(snap) else views


def view_of(key: str) -> View | None:
    return next((v for v in (PARETO, *VIEWS, ALLOCATION) if v.key == key), None)


def picked(view: View, snap: Snapshot, x: str | None, y: str | None) -> tuple[str | None, str | None]:
    """The pair an axes view draws: ``x`` and ``y`` where valid, else its defaults."""
    if view.axes is None:
        return None, None
    return analysis.pair(view.axes(snap), x, y) or (None, None)


def draw(view: View, snap: Snapshot, x: str | None = None, y: str | None = None,
         brush: parallel.Brush = ()) -> go.Figure:
    """The view's figure as the dashboard shows it: on the picked axes, with the brush."""
    if view.takes == "axes":
        return view.figure(snap, *picked(view, snap, x, y))
    if view.takes == "brush":
        return view.figure(snap, brush)
    if view.takes == "selection":
        return view.figure(snap, parallel.selected(snap, brush))
    return view.figure(snap)


LEADERBOARD, TRIAL, COMPARE = "leaderboard", "trial", "compare"


def tab_rows(snap: Snapshot, studies: int = 1) -> list[tuple[str, list[tuple[str, str]]]]:
    """The tabs, ``(key, label)``, in a row per group: the results (leaderboard
    first, the trial page, and the studies compared when there are several),
    the analysis of the parameters, the resources used."""
    views = views_of(snap)
    results = [(LEADERBOARD, "Leaderboard")] + [(v.key, v.label) for v in views if v.group == RESULTS]
    results += [(TRIAL, "Trial")] + ([(COMPARE, "Compare studies")] if studies > 1 else [])
    return [(RESULTS, results)] + [(group, [(v.key, v.label) for v in views if v.group == group])
                                   for group in GROUPS[1:]]


def summary(snap: Snapshot) -> str:
    """One line: trials by state, best trial, cost, when it was read (plain text)."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in snap.result.counts.items() if n)
    best = snap.result.best
    spent = timeline.cost(snap)
    parts = [f"study {snap.name}", f"{len(snap.trials)} trials" + (f": {counts}" if counts else "")]
    if snap.objectives:
        parts.append(f"Pareto front {len(snap.result.pareto_front)} trials")
    elif best is not None and best.value is not None:  # a completed trial: it has one
        parts.append(f"best {snap.metric}={best.value + 0.0:.6g} (trial {best.number})")
    parts.append(f"{format_resource_time(spent['core_hours'])}, "
                 f"{format_resource_time(spent['gpu_hours'], 'GPU')}")
    if snap.stop:
        parts.append(f"stopped: {snap.stop.get('reason')}")
    parts.append(f"read {datetime.fromtimestamp(snap.taken_at):%Y-%m-%d %H:%M:%S}")
    return " | ".join(parts)
