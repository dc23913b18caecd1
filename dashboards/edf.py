"""The empirical distribution function (EDF) of a study's objective values:
for each value, the share of completed trials at or below it.

Where the history says when good values came, the EDF says how common they
are: a curve that rises late (maximising) or early (minimising) means the
search often finds good configurations. Exact up to a few thousand trials;
beyond, evenly spaced points of the exact curve.
"""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.sampling import completed
from hpo.dashboards.style import base_layout, menu, message_figure, plain

__all__ = ["edf", "edf_points", "MAX_EDF_POINTS"]

MAX_EDF_POINTS = 2000


def edf_points(values: np.ndarray, limit: int = MAX_EDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The EDF of the finite ``values`` as step-line points ``(value, share)``:
    every point up to ``limit``, else ``limit`` points evenly spaced along it."""
    ordered = np.sort(values[np.isfinite(values)])
    share = np.arange(1, len(ordered) + 1) / max(len(ordered), 1)
    if len(ordered) > limit:
        kept = np.unique(np.linspace(0, len(ordered) - 1, limit).astype(int))
        ordered, share = ordered[kept], share[kept]
    return ordered, share


@functools.lru_cache(maxsize=4)
def edf(snap: Snapshot) -> go.Figure:
    """The EDF of the completed trials' values; one curve per objective of a
    multi-objective study, a menu picking it."""
    objectives = snap.objectives or ((snap.metric, snap.direction),)
    title = "Empirical distribution of the completed trials' values"
    done = completed(snap)
    if not done:
        return message_figure(title, "No completed trial yet: the distribution appears with the "
                              "first result.")
    fig = go.Figure(layout=base_layout(
        f"{title}<br><sup>the share of the {len(done)} completed trials at or below each value</sup>",
        xaxis_title=_axis_title(*objectives[0]), yaxis_title="share of trials",
        yaxis_range=[0, 1.02], yaxis_tickformat=".0%"))
    for k, (name, _) in enumerate(objectives):
        values = np.fromiter((_value(t, k) for t in done), float, len(done))
        x, y = edf_points(values)
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", line={"shape": "hv", "width": 2, "color": "#1f77b4"},
            name=plain(name), visible=k == 0,
            hovertemplate="%{y:.1%} of the trials at or below %{x:.6g}<extra></extra>"))
    if len(objectives) > 1:
        fig.update_layout(updatemenus=[menu([
            {"label": plain(name), "method": "update",
             "args": [{"visible": [j == k for j in range(len(objectives))]},
                      {"xaxis.title.text": _axis_title(name, direction)}]}
            for k, (name, direction) in enumerate(objectives)], direction="down")])
    return fig


def _value(trial: TrialView, objective: int) -> float:
    value = (trial.values if trial.values else [trial.value])[objective]
    if value is None:
        raise RuntimeError("hpo internal error: a completed trial has its values")
    return value


def _axis_title(metric: str, direction: str) -> str:
    better = "right" if direction == "maximize" else "left"
    return f"{plain(metric)} ({direction}: better to the {better})"
