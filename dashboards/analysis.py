"""Parameter analysis: slice plots and a two-parameter contour (importance is
in :mod:`hpo.dashboards.importance`, re-exported here).

Pure functions from a snapshot to a figure, memoised per snapshot, like the
views in :mod:`hpo.dashboards.figures`. Each uses the completed trials with a
value, at most a few thousand of them (best included), so a 100,000-trial
study draws as fast as a small one. Parameter axes keep the parameter's kind:
log parameters on log axes, categories as categories in their declared order.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.importance import MIN_IMPORTANCE_TRIALS, import_importance, importance
from hpo.dashboards.parallel import decade_ticks
from hpo.dashboards.sampling import completed, sample, sampled_note
from hpo.dashboards.style import base_layout, menu, message_figure, plain, short

__all__ = ["importance", "import_importance", "slices", "contour", "Axis", "axis_of", "axis_layout",
           "pair", "usable", "MIN_IMPORTANCE_TRIALS"]

MAX_SLICE_POINTS = 800  # per panel, SVG
MAX_CONTOUR_POINTS = 300  # drawn over the contour, which bins every trial
MAX_SLICES = 12
MAX_CONTOUR_PARAMS = 5  # their pairs are in the contour's menu
GRID = 40


class Axis(NamedTuple):
    """How one parameter is drawn: its values as numbers on a linear, log or category axis."""

    name: str
    kind: str  # "linear", "log" or "category"
    values: np.ndarray  # per trial; category index for a category
    labels: list[str]  # the categories, in order (empty otherwise)


def axis_of(snap: Snapshot, name: str, trials: list[TrialView]) -> Axis:
    """``name``'s values over ``trials`` and the kind of axis that shows them."""
    declared = (snap.spec.get("space") or {}).get(name)
    raw = [t.params.get(name) for t in trials]
    choices = declared if isinstance(declared, list) else \
        declared.get("choices") if isinstance(declared, dict) else None
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw if v is not None)
    if numeric and not isinstance(choices, list):
        values = np.asarray([np.nan if v is None else v for v in raw], float)
        log = isinstance(declared, dict) and declared.get("log") and (values[~np.isnan(values)] > 0).all()
        return Axis(name, "log" if log else "linear", values, [])
    labels = list(dict.fromkeys([str(c) for c in choices or ()] + sorted({str(v) for v in raw})))
    index = {label: i for i, label in enumerate(labels)}
    return Axis(name, "category", np.array([index[str(v)] for v in raw], float), labels)


def axis_layout(axis: Axis) -> dict[str, Any]:
    if axis.kind == "category":
        return {"type": "linear", "tickmode": "array", "tickvals": list(range(len(axis.labels))),
                "ticktext": [plain(x, 16) for x in axis.labels],
                "range": [-0.5, len(axis.labels) - 0.5]}
    ticks = decade_ticks(axis.values) if axis.kind == "log" else []
    if ticks:
        # Plotly labels a log axis "2 3 4 ... 100 2 3": 2 cannot be told from 20.
        # Whole numbers at 1-2-5 steps instead, as the parallel coordinates do.
        return {"type": "log", "tickmode": "array", "tickvals": ticks,
                "ticktext": [f"{t:g}" for t in ticks], "autorange": True}
    return {"type": axis.kind, "tickmode": "auto", "tickvals": None, "ticktext": None,
            "autorange": True}


def usable(snap: Snapshot) -> list[TrialView]:
    """Completed trials with parameters and a finite value, best first."""
    return [t for t in completed(snap) if t.params and t.value is not None and math.isfinite(t.value)]


# ------------------------------------------------------------------ slices

@functools.lru_cache(maxsize=4)
def slices(snap: Snapshot) -> go.Figure:
    """The metric against each parameter, one panel each, coloured by trial number."""
    title = f"Slices: {plain(snap.metric)} against each parameter"
    done = usable(snap)
    trials = sample(done, MAX_SLICE_POINTS)
    names = snap.param_names[:MAX_SLICES]
    if not trials or not names:
        return message_figure(title, "Needs a completed trial with parameters.")
    cols = min(len(names), 4)
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, horizontal_spacing=0.03,
                        vertical_spacing=0.18 if rows > 1 else 0.1,
                        subplot_titles=[plain(short(n, 30)) for n in names])
    values = np.fromiter((t.value for t in trials), float, len(trials))
    numbers = np.fromiter((t.number for t in trials), float, len(trials))
    for i, name in enumerate(names):
        axis = axis_of(snap, name, trials)
        row, col = i // cols + 1, i % cols + 1
        shown = axis.values if axis.kind != "category" else \
            axis.values + np.random.default_rng(i).uniform(-0.15, 0.15, len(trials))  # jitter
        text = [plain(axis.labels[int(v)], 40) for v in axis.values] if axis.kind == "category" \
            else [f"{v:.6g}" for v in axis.values]
        fig.add_trace(go.Scatter(
            x=shown, y=values, mode="markers", showlegend=False, text=text, customdata=numbers,
            marker={"size": 6, "color": numbers, "colorscale": "Blues", "opacity": 0.8,
                    "line": {"width": 0.5, "color": "#555"},
                    "showscale": i == 0, "colorbar": {"title": {"text": "trial"}}},
            hovertemplate=f"trial %{{customdata}}<br>{plain(name)}=%{{text}}<br>%{{y:.6g}}<extra></extra>"),
            row=row, col=col)
        fig.update_xaxes(row=row, col=col, **{k: v for k, v in axis_layout(axis).items() if v is not None})
    fig.update_yaxes(title_text=plain(snap.metric), row=1, col=1)
    note = sampled_note(len(trials), len(done))
    fig.update_layout(base_layout(title + (f"<br><sup>{note}</sup>" if note else ""), height=max(360, 80 + 300 * rows),
                                  updatemenus=[_y_menu(rows, cols)]))
    return fig


def _y_menu(rows: int, cols: int) -> dict[str, Any]:
    names = ["yaxis"] + [f"yaxis{i}" for i in range(2, rows * cols + 1)]
    return menu([{"label": label, "method": "relayout",
                  "args": [{f"{n}.type": kind for n in names}]}
                 for label, kind in (("linear y", "linear"), ("log y", "log"))])


# ------------------------------------------------------------------ contour

@functools.lru_cache(maxsize=8)
def contour(snap: Snapshot, x: str | None = None, y: str | None = None) -> go.Figure:
    """The metric over two parameters: the mean of every completed trial in
    each cell of a grid, with a sample of the trials (best included) as points
    over it. ``x`` and ``y`` name the pair (the dashboard's axis pickers);
    without them a menu in the figure picks among the pairs of the first
    parameters (the static report)."""
    title = f"Contour: {plain(snap.metric)} over two parameters"
    done = usable(snap)
    chosen = pair(snap.param_names, x, y)
    if chosen is None or len(done) < 3:
        return message_figure(title, "Needs two parameters and three completed trials.")
    names = snap.param_names[:MAX_CONTOUR_PARAMS]
    pairs = [chosen] if x is not None and y is not None else \
        [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    values = np.fromiter((t.value for t in done), float, len(done))
    axes = {n: axis_of(snap, n, done) for n in dict.fromkeys(n for p in pairs for n in p)}
    fig = go.Figure(layout=base_layout(title, height=560))
    buttons = []
    for k, (a, b) in enumerate(pairs):
        # Only the trials that set both parameters are drawn (conditional spaces).
        drawn = np.flatnonzero(np.isfinite(axes[a].values) & np.isfinite(axes[b].values))
        shown = drawn[_sample_index(len(drawn), MAX_CONTOUR_POINTS)]
        for trace in _pair_traces(axes[a], axes[b], values, shown, snap, visible=k == 0):
            fig.add_trace(trace)
        visible = [j // 2 == k for j in range(2 * len(pairs))]
        layout = {"title.text": f"{title}<br><sup>{_contour_note(len(drawn), len(shown), len(done))}</sup>",
                  "xaxis.title.text": plain(a), "yaxis.title.text": plain(b),
                  **{f"xaxis.{key}": v for key, v in axis_layout(axes[a]).items()},
                  **{f"yaxis.{key}": v for key, v in axis_layout(axes[b]).items()}}
        buttons.append({"label": plain(f"{short(a, 20)} × {short(b, 20)}"), "method": "update",
                        "args": [{"visible": visible}, layout]})
        if k == 0:
            fig.update_layout(title_text=layout["title.text"],
                              xaxis={"title": {"text": plain(a)}, **axis_layout(axes[a])},
                              yaxis={"title": {"text": plain(b)}, **axis_layout(axes[b])})
    if len(pairs) > 1:
        fig.update_layout(updatemenus=[menu(buttons, direction="down")])
    return fig


def _contour_note(drawn: int, shown: int, completed: int) -> str:
    """What the colour and the points stand for, counting the trials drawn: a
    conditional parameter is set in only some of the completed trials."""
    which = f"{drawn} completed trials" if drawn == completed else \
        f"{drawn} of the {completed} completed trials that set both parameters"
    note = f"colour: mean of the {which} in each cell"
    if shown < drawn:
        note += f"; points: {sampled_note(shown, drawn)}"
    return note


def pair(names: list[str], x: str | None, y: str | None) -> tuple[str, str] | None:
    """The pair of ``names`` to draw: ``x`` and ``y`` when both are among them
    and differ, else the first two (keeping a valid ``x`` or ``y``); None
    when there are fewer than two."""
    if len(names) < 2:
        return None
    if x in names and y in names and x != y:
        return x, y
    if x in names:
        return x, next(n for n in names if n != x)
    if y in names:
        return next(n for n in names if n != y), y
    return names[0], names[1]


def _sample_index(count: int, limit: int) -> np.ndarray:
    """Indices into a best-first list of ``count``: the best tenth of ``limit``,
    then evenly spaced others (all when they fit)."""
    if count <= limit:
        return np.arange(count)
    best = max(limit // 10, 1)
    return np.r_[np.arange(best), np.linspace(best, count - 1, limit - best).astype(int)]


def _pair_traces(x: Axis, y: Axis, values: np.ndarray, shown: np.ndarray, snap: Snapshot,
                 visible: bool) -> list:
    colours = {"colorscale": "Viridis", "reversescale": not snap.maximize}
    traces = []
    grid = _grid(x, y, values)
    if grid is not None:
        gx, gy, gz = grid
        traces.append(go.Contour(x=gx, y=gy, z=gz, visible=visible, showscale=True, opacity=0.85,
                                 colorbar={"title": {"text": plain(snap.metric)}}, connectgaps=True,
                                 contours={"coloring": "heatmap"}, line={"width": 0.5},
                                 hoverinfo="skip", **colours))
    else:  # too few distinct points to bin: the points alone
        traces.append(go.Scatter(x=[], y=[], visible=visible, showlegend=False))
    traces.append(go.Scatter(
        x=x.values[shown], y=y.values[shown], mode="markers", visible=visible, showlegend=False,
        customdata=values[shown], marker={"size": 7, "color": values[shown],
                                          "line": {"width": 1, "color": "#fff"}, **colours},
        hovertemplate="%{x}, %{y}<br>%{customdata:.6g}<extra></extra>"))
    return traces


def _edges(axis: Axis, drawn: np.ndarray) -> np.ndarray | None:
    """Cell edges in drawn units: one cell per category, else GRID cells."""
    if axis.kind == "category":
        return np.arange(len(axis.labels) + 1) - 0.5
    low, high = drawn.min(), drawn.max()
    return None if high <= low else np.linspace(low, high, GRID + 1)


def _grid(x: Axis, y: Axis, values: np.ndarray) -> tuple | None:
    """The mean value in each cell, in each axis's drawn units (log10 for a
    log axis); empty cells are NaN (the contour joins over them)."""
    def drawn(axis: Axis) -> np.ndarray:
        return np.log10(axis.values) if axis.kind == "log" else axis.values

    px, py = drawn(x), drawn(y)
    ok = np.isfinite(px) & np.isfinite(py) & np.isfinite(values)
    if ok.sum() < 3:
        return None
    ex, ey = _edges(x, px[ok]), _edges(y, py[ok])
    if ex is None or ey is None:
        return None
    total, _, _ = np.histogram2d(px[ok], py[ok], bins=(ex, ey), weights=values[ok])
    count, _, _ = np.histogram2d(px[ok], py[ok], bins=(ex, ey))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (total / count).T  # rows follow y
    if (count > 0).sum() < 3:
        return None
    cx, cy = (ex[:-1] + ex[1:]) / 2, (ey[:-1] + ey[1:]) / 2

    def back(v):
        return 10 ** v

    return (back(cx) if x.kind == "log" else cx, back(cy) if y.kind == "log" else cy, z)
