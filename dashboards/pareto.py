"""The Pareto view of a multi-objective study: its first two objectives, the
front highlighted and joined in order, the other completed trials behind it."""

from __future__ import annotations

import functools

import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.style import STATE_COLOURS, base_layout, message_figure, plain
from hpo.store.records import TrialStatus

__all__ = ["pareto"]

FRONT_COLOUR = "#d62728"


@functools.lru_cache(maxsize=4)
def pareto(snap: Snapshot) -> go.Figure:
    """Completed trials by their first two objectives; the Pareto front in red."""
    if len(snap.objectives) < 2:
        return message_figure("Pareto front", "A single-objective study has no Pareto front.")
    (x_name, x_dir), (y_name, y_dir) = snap.objectives[:2]
    title = f"Pareto front: {plain(x_name)} ({x_dir}) against {plain(y_name)} ({y_dir})"
    ranks = snap.result.pareto_ranks()
    done = [t for t in snap.trials if t.state is TrialStatus.COMPLETE and t.values]
    if not done:
        return message_figure(title, "No completed trial yet: the front appears with the first results.")
    front = sorted((t for t in done if ranks.get(t.number) == 1), key=lambda t: (t.values[0], t.values[1]))
    others = [t for t in done if ranks.get(t.number) != 1]
    fig = go.Figure(layout=base_layout(title, xaxis_title=plain(x_name), yaxis_title=plain(y_name)))
    fig.add_trace(_points(others, ranks, "dominated trial",
                          {"size": 6, "color": STATE_COLOURS["COMPLETE"], "opacity": 0.45}, "markers"))
    fig.add_trace(_points(front, ranks, "Pareto front",
                          {"size": 9, "color": FRONT_COLOUR}, "lines+markers"))
    return fig


def _points(trials: list[TrialView], ranks: dict[int, int], name: str, marker: dict,
            mode: str) -> go.Scatter:
    hover = [f"trial {t.number} (rank {ranks.get(t.number)})<br>"
             + "<br>".join(plain(f"{k}={v}") for k, v in t.params.items()) for t in trials]
    return go.Scatter(x=[t.values[0] for t in trials], y=[t.values[1] for t in trials], mode=mode,
                      name=name, marker=marker, line={"shape": "hv", "color": FRONT_COLOUR, "width": 1},
                      text=hover, hovertemplate="%{text}<br>%{x:.6g}, %{y:.6g}<extra></extra>")
