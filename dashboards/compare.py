"""Several studies side by side (``hpo dashboard runs/a runs/b``): the best
value so far by trial number, and the distribution of the values (EDF), one
colour per study.

Studies with different metrics or directions are drawn all the same, and the
title says so: comparing them is the reader's call.
"""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpo.dashboards.data import Snapshot
from hpo.dashboards.edf import edf_points
from hpo.dashboards.figures import best_so_far
from hpo.dashboards.sampling import completed
from hpo.dashboards.style import base_layout, message_figure, plain

__all__ = ["compare", "PALETTE"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22")


@functools.lru_cache(maxsize=4)
def compare(snaps: tuple[Snapshot, ...], labels: tuple[str, ...]) -> go.Figure:
    """Each study's best so far (left) and EDF (right), labelled ``labels``."""
    title = "Studies compared: the best value so far, and the distribution of values"
    done = [completed(snap) for snap in snaps]
    if not any(done):
        return message_figure(title, "No study has a completed trial yet.")
    metrics = sorted({(snap.metric, snap.direction) for snap in snaps})
    note = (f"{len(snaps)} studies of {plain(metrics[0][0])} ({metrics[0][1]})" if len(metrics) == 1
            else "the studies have different metrics or directions: "
            + ", ".join(f"{plain(m)} ({d})" for m, d in metrics))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("best so far, by trial", "share of completed trials at or below"))
    fig.update_layout(base_layout(f"{title}<br><sup>{note}</sup>", height=520,
                                  margin={"l": 60, "r": 20, "t": 100, "b": 50}))
    for i, (snap, trials, label) in enumerate(zip(snaps, done, labels)):
        if not trials:
            continue
        colour = PALETTE[i % len(PALETTE)]
        numbers, best, _ = best_so_far(trials, snap.maximize)
        fig.add_trace(go.Scatter(
            x=numbers, y=best, mode="lines", name=plain(label), legendgroup=str(i),
            line={"shape": "hv", "width": 2, "color": colour},
            hovertemplate=f"{plain(label)}<br>best after trial %{{x}}: %{{y:.6g}}<extra></extra>"),
            row=1, col=1)
        x, y = edf_points(np.fromiter((t.value for t in trials), float, len(trials)))
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", name=plain(label), legendgroup=str(i), showlegend=False,
            line={"shape": "hv", "width": 2, "color": colour},
            hovertemplate=f"{plain(label)}<br>%{{y:.1%}} at or below %{{x:.6g}}<extra></extra>"),
            row=1, col=2)
    fig.update_xaxes(title_text="trial", row=1, col=1)
    fig.update_xaxes(title_text="value", row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1, col=2)
    return fig
