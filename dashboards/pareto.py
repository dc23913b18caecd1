"""The Pareto view of a multi-objective study: two of its objectives (the
first two unless picked), the front highlighted, the other completed trials
behind it."""

from __future__ import annotations

import functools

import plotly.graph_objects as go

from hpo.dashboards.analysis import pair
from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.style import STATE_COLOURS, base_layout, message_figure, plain
from hpo.store.records import TrialStatus

__all__ = ["pareto"]

FRONT_COLOUR = "#d62728"


@functools.lru_cache(maxsize=8)
def pareto(snap: Snapshot, x: str | None = None, y: str | None = None) -> go.Figure:
    """Completed trials by objectives ``x`` and ``y``; the Pareto front over
    every objective in red, joined in order when there are only these two."""
    if len(snap.objectives) < 2:
        return message_figure("Pareto front", "A single-objective study has no Pareto front.")
    names = [name for name, _ in snap.objectives]
    chosen = pair(names, x, y)
    if chosen is None:
        raise RuntimeError("hpo internal error: two objectives at least")
    i, j = (names.index(n) for n in chosen)
    (x_name, x_dir), (y_name, y_dir) = snap.objectives[i], snap.objectives[j]
    title = f"Pareto front: {plain(x_name)} ({x_dir}) against {plain(y_name)} ({y_dir})"
    if len(names) > 2:
        title += f"<br><sup>red: the front over all {len(names)} objectives</sup>"
    ranks = snap.result.pareto_ranks()
    done = [t for t in snap.trials if t.state is TrialStatus.COMPLETE and t.values]
    if not done:
        return message_figure(title, "No completed trial yet: the front appears with the first results.")
    front = sorted((t for t in done if ranks.get(t.number) == 1), key=lambda t: (_values(t)[i], _values(t)[j]))
    others = [t for t in done if ranks.get(t.number) != 1]
    fig = go.Figure(layout=base_layout(title, xaxis_title=plain(x_name), yaxis_title=plain(y_name)))
    fig.add_trace(_points(others, ranks, (i, j), "dominated trial",
                          {"size": 6, "color": STATE_COLOURS["COMPLETE"], "opacity": 0.45}, "markers"))
    fig.add_trace(_points(front, ranks, (i, j), "Pareto front", {"size": 9, "color": FRONT_COLOUR},
                          "lines+markers" if len(names) == 2 else "markers"))
    return fig


def _values(trial: TrialView) -> list[float]:
    if trial.values is None:
        raise RuntimeError("hpo internal error: a completed trial of a multi-objective study has them")
    return trial.values


def _points(trials: list[TrialView], ranks: dict[int, int], axes: tuple[int, int], name: str,
            marker: dict, mode: str) -> go.Scatter:
    i, j = axes
    hover = [f"trial {t.number} (rank {ranks.get(t.number)})<br>"
             + "<br>".join(plain(f"{k}={v}") for k, v in t.params.items()) for t in trials]
    return go.Scatter(x=[_values(t)[i] for t in trials], y=[_values(t)[j] for t in trials], mode=mode,
                      name=name, marker=marker, line={"shape": "hv", "color": FRONT_COLOUR, "width": 1},
                      text=hover, hovertemplate="%{text}<br>%{x:.6g}, %{y:.6g}<extra></extra>")
