"""The rank plot: completed trials over two parameters, coloured by their
rank (best to worst) rather than by their value.

A colour scale of values is dominated by a few outliers (a diverged trial);
ranks spread the colours evenly over the trials, so where the good ones lie
shows whatever the values' spread. A sample of a large study is drawn, the
best always among it; the best are drawn on top.
"""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.analysis import Axis, axis_layout, axis_of, pair, usable
from hpo.dashboards.data import Snapshot
from hpo.dashboards.sampling import sample, sampled_note
from hpo.dashboards.style import base_layout, message_figure, plain

__all__ = ["rank", "MAX_RANK_POINTS"]

MAX_RANK_POINTS = 1000


@functools.lru_cache(maxsize=8)
def rank(snap: Snapshot, x: str | None = None, y: str | None = None) -> go.Figure:
    """Completed trials over parameters ``x`` and ``y`` (the first two by
    default), coloured by rank: 0 the best, 1 the worst."""
    title = f"Rank: where the good values of {plain(snap.metric)} lie over two parameters"
    done = usable(snap)
    chosen = pair(snap.param_names, x, y)
    if chosen is None or len(done) < 2:
        return message_figure(title, "Needs two parameters and two completed trials.")
    place = {t.number: i / (len(done) - 1) for i, t in enumerate(done)}  # done is best first
    trials = sorted(sample(done, MAX_RANK_POINTS), key=lambda t: -place[t.number])  # best on top
    share = np.fromiter((place[t.number] for t in trials), float, len(trials))
    ax, ay = (axis_of(snap, name, trials) for name in chosen)
    note = sampled_note(len(trials), len(done))
    fig = go.Figure(layout=base_layout(
        title + (f"<br><sup>{note}</sup>" if note else ""), height=560,
        xaxis={"title": {"text": plain(chosen[0])}, **axis_layout(ax)},
        yaxis={"title": {"text": plain(chosen[1])}, **axis_layout(ay)}))
    fig.add_trace(go.Scatter(
        x=_jittered(ax, 0), y=_jittered(ay, 1), mode="markers", showlegend=False,
        customdata=np.c_[[t.number for t in trials], share * 100, [t.value for t in trials]],
        marker={"size": 8, "color": share, "colorscale": "Viridis", "reversescale": True,
                "cmin": 0, "cmax": 1, "line": {"width": 0.5, "color": "#555"},
                "colorbar": {"title": {"text": "rank"}, "tickvals": [0, 0.5, 1],
                             "ticktext": ["best", "median", "worst"]}},
        hovertemplate="trial %{customdata[0]}, in the top %{customdata[1]:.0f}%<br>"
                      + f"{plain(snap.metric)}=%{{customdata[2]:.6g}}<extra></extra>"))
    return fig


def _jittered(axis: Axis, seed: int) -> np.ndarray:
    """Category indices spread a little, so that trials on one category do not hide each other."""
    if axis.kind != "category":
        return axis.values
    return axis.values + np.random.default_rng(seed).uniform(-0.15, 0.15, len(axis.values))
