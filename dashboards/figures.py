"""The search views: the optimisation history and the learning curves.

Each view is a pure function from a :class:`~hpo.dashboards.data.Snapshot` to
a Plotly figure, memoised per snapshot (a snapshot is hashed by identity and
never changes). Large studies are sampled server-side
(:mod:`hpo.dashboards.sampling`). Plots are SVG: the browser may render WebGL
in software, where each WebGL plot costs most of a second before its first point.
The parallel coordinates live in :mod:`hpo.dashboards.parallel` (re-exported here).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.parallel import INACTIVE, log_ticks, parallel
from hpo.dashboards.sampling import completed, sample, sampled_note, spread
from hpo.dashboards.style import (
    HIGHLIGHTS,
    STATE_COLOURS,
    base_layout,
    menu,
    message_figure,
    plain,
    short,
    y_scale_menu,
)
from hpo.store.records import TrialStatus

__all__ = ["history", "parallel", "curves", "completed", "spread", "sample", "sampled_note",
           "log_ticks", "bulk_range", "reported_metrics", "INACTIVE", "best_so_far"]

MAX_HISTORY_POINTS = 2000  # completed trials drawn; the best-so-far line is always exact
MAX_EARLY_POINTS = 1000  # pruned or stopped trials drawn, each
MAX_CURVES = 300
MAX_METRICS = 8
MAX_FAILED_MARKS = 1000


# The history's x axes, picked in the figure: each trial's number, or when it
# ended (wall-clock time, local to the server, as on the timeline).
_BY_NUMBER = ("trial", "linear")
_BY_TIME = ("time ended (local)", "date")


@functools.lru_cache(maxsize=8)
def history(snap: Snapshot, selected: frozenset[int] | None = None) -> go.Figure:
    """Each finished trial's metric by trial number or by the time it ended
    (a menu picks it), sampled with the best always drawn, and the exact best
    so far; pruned and stopped trials at the value they ended with, failed
    ones along the bottom. With ``selected`` (the trials brushed in the
    parallel coordinates), those trials only."""
    title = f"Optimisation history: {plain(snap.metric)} ({snap.direction})"
    ranked = completed(snap)
    if selected is not None:
        ranked = [t for t in ranked if t.number in selected]
        title += f"<br><sup>the {len(selected)} trials selected in the parallel coordinates</sup>"
    if not ranked:
        return message_figure(title, "No completed trial yet: the history appears with the first result."
                              if selected is None else "No completed trial in the selection.")
    shown = sample(ranked, MAX_HISTORY_POINTS)
    note = sampled_note(len(shown), len(ranked))
    fig = go.Figure(layout=base_layout(title + (f"<br><sup>{note}</sup>" if note else ""),
                                       xaxis_title=_BY_NUMBER[0], yaxis_title=plain(snap.metric)))
    drawn = [_points(fig, shown, "completed trial", {
        "size": 5, "color": STATE_COLOURS["COMPLETE"], "opacity": 0.6}, "")]
    lowest = float(np.nanmin(np.fromiter((t.value for t in ranked), float, len(ranked))))
    for state in (TrialStatus.PRUNED, TrialStatus.STOPPED):
        early = [t for t in snap.trials if t.state is state and t.value is not None
                 and math.isfinite(t.value) and (selected is None or t.number in selected)]
        if early:
            word = state.value.lower()
            lowest = min(lowest, min(t.value for t in early if t.value is not None))
            thinned = spread(early, MAX_EARLY_POINTS)
            of = f", {len(thinned)} of {len(early)}" if len(thinned) < len(early) else ""
            drawn.append(_points(fig, thinned, f"{word} (value when ended{of})", {
                "size": 5, "color": STATE_COLOURS[state.value], "symbol": "x"}, f" ({word})"))
    if selected is None:  # failed trials have no value to be selected by
        drawn += _failed_rug(fig, snap, lowest)
    for kind in (_BY_NUMBER[1], _BY_TIME[1]):
        x, best, owners = best_so_far(ranked, snap.maximize, by_time=kind == "date")
        fig.add_trace(go.Scatter(
            x=_axis_values(x, kind), y=best, customdata=owners, mode="lines", visible=kind == "linear",
            line={"shape": "hv", "color": "#111", "width": 2}, name="best so far",
            hovertemplate="best after trial %{customdata}: %{y:.6g}<extra></extra>"))
    fig.update_layout(updatemenus=[y_scale_menu(), _x_menu(drawn, fig)])
    return fig


def _x_menu(drawn: list[list[TrialView]], fig: go.Figure) -> dict[str, Any]:
    """Buttons that move every marker to its trial's number or end time, and
    show the best-so-far line of that order (the last two traces)."""
    lines = [fig.data[-2].x, fig.data[-1].x]
    buttons = []
    for k, (label, kind) in enumerate((_BY_NUMBER, _BY_TIME)):
        xs = [_axis_values([t.ended_at if kind == "date" else t.number for t in trials], kind)
              for trials in drawn]
        buttons.append({"label": f"by {label.split()[0]}", "method": "update", "args": [
            {"x": [*xs, *lines], "visible": [True] * len(drawn) + [k == 0, k == 1]},
            {"xaxis.title.text": label, "xaxis.type": kind, "xaxis.autorange": True}]})
    # Left of the y scale's buttons, on their row (pad: their width in pixels).
    return {**menu(buttons), "pad": {"r": 125, "t": 2}}


def _axis_values(values: Iterable[Any], kind: str) -> list[Any]:
    """Trial numbers as they are; times as local date strings (None stays None: not drawn)."""
    if kind != "date":
        return list(values)
    return [None if v is None else datetime.fromtimestamp(v).isoformat(sep=" ", timespec="milliseconds")
            for v in values]


def best_so_far(trials: Sequence[TrialView], maximize: bool,
                by_time: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best value after each trial, exact, as the points of a step line:
    where it changed, and the last trial; in trial number order, or in the
    order they ended (``by_time``: x is the end time). Also the number of
    the trial each point belongs to."""
    if by_time:
        trials = [t for t in trials if t.ended_at is not None]
    done = sorted(trials, key=(lambda t: (t.ended_at, t.number)) if by_time else (lambda t: t.number))
    if not done:
        return np.array([]), np.array([]), np.array([])
    numbers = np.fromiter((t.number for t in done), float, len(done))
    at = np.fromiter((t.ended_at for t in done), float, len(done)) if by_time else numbers
    values = np.fromiter((t.value for t in done), float, len(done))
    best = (np.maximum if maximize else np.minimum).accumulate(values)
    changed = np.flatnonzero(np.r_[True, best[1:] != best[:-1]])
    last = len(done) - 1
    return np.r_[at[changed], at[last]], np.r_[best[changed], best[last]], np.r_[numbers[changed], numbers[last]]


def _points(fig: go.Figure, trials: Sequence[TrialView], name: str, marker: dict[str, Any],
            word: str) -> list[TrialView]:
    """Trials as markers at (number, value), in number order (SVG: a few
    thousand at most); returns them in the order drawn."""
    trials = sorted(trials, key=lambda t: t.number)
    numbers = np.fromiter((t.number for t in trials), float, len(trials))
    fig.add_trace(go.Scatter(
        x=numbers, y=np.fromiter((t.value for t in trials), float, len(trials)), customdata=numbers,
        mode="markers", name=name, marker=marker,
        hovertemplate=f"trial %{{customdata}}{word}<br>%{{y:.6g}}<extra></extra>"))
    return trials


def _failed_rug(fig: go.Figure, snap: Snapshot, at: float) -> list[list[TrialView]]:
    """Trials without a value (failed, timed out) as marks at the lowest value
    drawn, so that where failures happen shows next to the results; returns
    the trials of each trace drawn."""
    drawn = []
    for state in (TrialStatus.FAILED, TrialStatus.TIMEOUT):
        every = [t for t in snap.trials if t.state is state]
        lost = spread(every, MAX_FAILED_MARKS)
        if lost:
            word = state.value.lower()
            of = f", {len(lost)} of {len(every)}" if len(lost) < len(every) else ""
            fig.add_trace(go.Scatter(
                x=[t.number for t in lost], y=[at] * len(lost), mode="markers",
                name=f"{word} (no value{of})",
                customdata=[[t.number, plain(t.error or word, 120)] for t in lost],
                marker={"size": 8, "color": STATE_COLOURS[state.value], "symbol": "line-ns-open",
                        "line": {"width": 2, "color": STATE_COLOURS[state.value]}},
                hovertemplate=f"trial %{{customdata[0]}} {word}<br>%{{customdata[1]}}<extra></extra>"))
            drawn.append(lost)
    return drawn


@functools.lru_cache(maxsize=4)
def curves(snap: Snapshot) -> go.Figure:
    """Reported steps of each trial (sampled, best first), pruned and stopped
    marked; a menu picks the metric (every one reported) and a log y axis."""
    title = "Learning curves by reported step"
    reporting = [t for t in snap.trials if t.reports]
    best = [t for t in completed(snap) if t.reports][:len(HIGHLIGHTS)]
    chosen = spread(reporting, MAX_CURVES, keep=best)
    metrics = reported_metrics(snap, chosen)
    if not metrics:
        return message_figure(title, "No trial has reported a step yet (trial.report(step, ...)).")
    note = f" ({len(chosen)} of {len(reporting)} trials, best included)" if len(chosen) < len(reporting) else ""
    fig = go.Figure(layout=base_layout(title + note, xaxis_title="step",
                                       margin={"l": 60, "r": 20, "t": 90, "b": 50}))
    owner: list[int] = []  # which metric each trace draws
    ranges = {}
    for k, metric in enumerate(metrics):
        before = len(fig.data)
        ranges[metric] = _metric_traces(fig, chosen, best, metric, visible=k == 0)
        owner += [k] * (len(fig.data) - before)
    buttons = []
    for k, metric in enumerate(metrics):
        visible = [o == k for o in owner]
        for scale in ("linear", "log"):
            axis = {"yaxis.type": scale, "yaxis.title.text": plain(metric),
                    **_y_range(ranges[metric], scale)}
            buttons.append({"label": plain(short(metric, 30)) + (", log y" if scale == "log" else ""),
                            "method": "update", "args": [{"visible": visible}, axis]})
    fig.update_layout(yaxis={"title": {"text": plain(metrics[0])},
                             **{k[6:]: v for k, v in _y_range(ranges[metrics[0]], "linear").items()}},
                      updatemenus=[menu(buttons, direction="down")])
    return fig


def reported_metrics(snap: Snapshot, trials: Sequence[TrialView]) -> list[str]:
    """The metrics ``trials`` reported at a step: the study's metric first, then
    by first report (at most MAX_METRICS)."""
    seen: dict[str, None] = {}
    for trial in trials:
        for _, metrics in trial.reports:
            seen.update(dict.fromkeys(metrics))
    return sorted(seen, key=lambda n: n != snap.metric)[:MAX_METRICS]


def _metric_traces(fig: go.Figure, chosen: list[TrialView], best: list[TrialView], metric: str,
                   visible: bool) -> tuple[float, float] | None:
    """One metric's curves by state, the best trials over them, pruned/stopped marks;
    returns the y range that shows the bulk of the curves."""
    by_state: dict[str, list[TrialView]] = {}
    for trial in chosen:
        by_state.setdefault(trial.state.value, []).append(trial)
    every: list[float] = []
    core: list[float] = []
    for state, trials in by_state.items():
        xs, ys, ids = _polylines(trials, metric)
        points = [y for y in ys if y is not None]
        every += points
        if state == TrialStatus.COMPLETE.value:
            core += points
        fig.add_trace(go.Scatter(
            x=xs, y=ys, customdata=ids, mode="lines", name=state.lower(), opacity=0.45,
            visible=visible, legendgroup=state,
            line={"color": STATE_COLOURS.get(state, "#999"), "width": 1},
            hovertemplate="trial %{customdata}<br>step %{x}: %{y:.6g}<extra></extra>"))
    tops: list[float] = []
    for rank, trial in enumerate(best):
        xs, ys, ids = _polylines([trial], metric)
        tops += [y for y in ys if y is not None]
        colour, dash = HIGHLIGHTS[rank]
        fig.add_trace(go.Scatter(
            x=xs, y=ys, customdata=ids, mode="lines", name=f"best #{rank + 1}: trial {trial.number}",
            visible=visible, line={"width": 2.5, "color": colour, "dash": dash},
            hovertemplate="trial %{customdata}<br>step %{x}: %{y:.6g}<extra></extra>"))
    for kind, symbol in (("pruned", "x"), ("stopped", "square")):
        xs, ys, ids = _marks(chosen, metric, kind)
        if xs:
            fig.add_trace(go.Scatter(
                x=xs, y=ys, customdata=ids, mode="markers", name=f"{kind} here", visible=visible,
                marker={"symbol": symbol, "size": 9, "color": STATE_COLOURS["PRUNED"] if kind == "pruned"
                        else "#333"},
                hovertemplate=f"trial %{{customdata}} {kind} at step %{{x}}<extra></extra>"))
    return bulk_range(np.asarray(every, float), np.asarray(core, float), np.asarray(tops, float))


def bulk_range(values: np.ndarray, core: np.ndarray, keep: np.ndarray) -> tuple[float, float] | None:
    """A y range for the bulk of the curves, or None when every value fits
    without squeezing the others: a few diverged curves must not flatten the
    rest against one edge. The bulk is the completed trials' points (``core``;
    diverged trials rarely complete), within three interquartile ranges; the
    best curves (``keep``) always fit."""
    values = values[np.isfinite(values)]
    core = core[np.isfinite(core)]
    if len(core) < 10:
        core = values
    if len(core) < 10:
        return None
    q1, q3 = np.percentile(core, [25, 75])
    fence = 3 * max(q3 - q1, 1e-12)
    low, high = max(values.min(), q1 - fence), min(values.max(), q3 + fence)
    keep = keep[np.isfinite(keep)]
    if len(keep):
        low, high = min(low, keep.min()), max(high, keep.max())
    if low <= values.min() and high >= values.max():
        return None
    pad = 0.05 * (high - low or 1.0)
    return float(low - pad), float(high + pad)


def _y_range(bulk: tuple[float, float] | None, scale: str) -> dict[str, Any]:
    if bulk is None:
        return {"yaxis.autorange": True}
    low, high = bulk
    if scale == "log":
        if high <= 0:
            return {"yaxis.autorange": True}
        low = low if low > 0 else high / 1e3
        return {"yaxis.range": [math.log10(low), math.log10(high)]}
    return {"yaxis.range": [low, high]}


def _polylines(trials: list[TrialView], metric: str) -> tuple[list, list, list]:
    """One trace for many trials: their points, a None between trials."""
    xs: list[Any] = []
    ys: list[Any] = []
    ids: list[Any] = []
    for trial in trials:
        for step, metrics in trial.reports:
            if metric in metrics:
                xs.append(step)
                ys.append(metrics[metric])
                ids.append(trial.number)
        xs.append(None)
        ys.append(None)
        ids.append(None)
    return xs, ys, ids


def _marks(trials: list[TrialView], metric: str, kind: str) -> tuple[list, list, list]:
    """Where each trial was pruned (or stopped): its event's step, else its last report."""
    xs, ys, ids = [], [], []
    for trial in trials:
        steps = [e.get("step") for e in trial.events if e.get("kind") == kind]
        if not steps and trial.state.value == kind.upper() and trial.reports:
            steps = [trial.reports[-1][0]]
        for step in steps:
            point = _value_at(trial, metric, step)
            if point is not None:
                xs.append(point[0])
                ys.append(point[1])
                ids.append(trial.number)
    return xs, ys, ids


def _value_at(trial: TrialView, metric: str, step: Any) -> tuple[int, float] | None:
    """The last report at or before ``step`` (the step pruning looked at)."""
    found = None
    for at, metrics in trial.reports:
        if step is not None and at > step:
            break
        if metric in metrics:
            found = (at, metrics[metric])
    return found
