"""The allocation view: each trial's shape and place, predicted against actual
time, and how busy each GPU was.

Drawn from the allocations the master records on each trial
(``hpo:alloc:NNN``: GPUs, nodes, hosts, GPU ids and speed, the cost model's
predicted time, the reason); a trial grown onto more GPUs has several.
"""

from __future__ import annotations

import functools
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.style import STATE_COLOURS, base_layout, message_figure, plain

__all__ = ["allocation", "gpu_busy", "has_allocations"]


def has_allocations(snap: Snapshot) -> bool:
    """Whether the master places this study's trials (the view is worth a
    tab): its settings say so (known before the store is read), or trials show it."""
    settings = snap.spec.get("allocation") or {}
    resources = snap.spec.get("resources") or {}
    planned = settings.get("policy", "fifo") != "fifo" or settings.get("placement", "any") != "any"
    shaped = any(isinstance(v, str) for v in resources.values()) or (resources.get("gpus") or 0) > 0 \
        or (resources.get("nodes") or 1) > 1
    return planned or shaped or any(t.allocations for t in snap.trials)


def allocation(snap: Snapshot) -> go.Figure:
    """Predicted against actual trial time (left) and GPU busy time per GPU (right)."""
    title = "Allocation: each trial's shape and place, predicted against actual time, GPU busy time"
    placed = [t for t in snap.trials if t.allocations]
    if not placed:
        return message_figure(title, "No trial was placed by hpo's allocator yet (under COMPSs "
                              "the runtime places trials itself).")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.1,
                        subplot_titles=("actual against predicted time (s)", "GPU busy time per GPU (s)"))
    _predicted_against_actual(fig, placed)
    busy = gpu_busy(snap)
    labels = sorted(busy, key=lambda k: (k[0], _id_key(k[1])))
    fig.add_trace(go.Bar(x=[plain(f"{host} gpu {gpu}") for host, gpu in labels],
                         y=[busy[k] for k in labels], marker_color="#ff7f0e", name="GPU busy",
                         hovertemplate="%{x}: %{y:.1f} s busy<extra></extra>"), row=1, col=2)
    fig.update_layout(base_layout(title, height=520, margin={"l": 60, "r": 20, "t": 90, "b": 110}))
    fig.update_layout(title_font_size=14)
    fig.update_xaxes(title_text="predicted by the cost model (s)", row=1, col=1)
    fig.update_yaxes(title_text="actual (s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="busy seconds (share-weighted)", rangemode="tozero", row=1, col=2)
    return fig


def _predicted_against_actual(fig: go.Figure, trials: list[TrialView]) -> None:
    points = [(t, t.allocations[-1]["predicted_s"], t.duration_s) for t in trials
              if t.allocations[-1].get("predicted_s") and t.duration_s and t.state.is_finished]
    by_state: dict[str, list] = {}
    for point in points:
        by_state.setdefault(point[0].state.value, []).append(point)
    for state, group in by_state.items():
        fig.add_trace(go.Scatter(
            x=[p for _, p, _ in group], y=[a for _, _, a in group], mode="markers", name=state.lower(),
            marker={"color": STATE_COLOURS.get(state, "#7f7f7f"), "size": 8},
            text=[plain(_describe(t)) for t, _, _ in group],
            hovertemplate="%{text}<br>predicted %{x:.1f} s, actual %{y:.1f} s<extra></extra>"),
            row=1, col=1)
    if points:
        top = max(max(p, a) for _, p, a in points)
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="as predicted",
                                 line={"dash": "dash", "color": "#7f7f7f"}), row=1, col=1)


def _describe(trial: TrialView) -> str:
    """The trial's allocations, one line each: shape, place, reason."""
    lines = [f"trial {trial.number}"]
    for a in trial.allocations:
        shape = f"{a.get('gpus', 0):g} GPU(s)" + (f" x {a['nodes']} nodes" if a.get("nodes", 1) > 1 else "")
        where = ", ".join(a.get("hosts") or [])
        gpus = ",".join(a.get("devices") or [])
        lines.append(f"{shape} on {where} gpu {gpus} (speed {a.get('speed', 1):g}): {a.get('reason', '')}")
    return "<br>".join(lines)


@functools.lru_cache(maxsize=4)
def gpu_busy(snap: Snapshot) -> dict[tuple[str, str], float]:
    """Busy seconds per (host, GPU id): each allocation's time (until the
    next one, or the trial's end) times its share of the GPU."""
    busy: dict[tuple[str, str], float] = {}
    now = snap.taken_at
    for trial in snap.trials:
        allocations = trial.allocations
        end = trial.ended_at or now
        for a, following in zip(allocations, (*allocations[1:], None)):
            until = following["at"] if following else end
            seconds = max(until - a["at"], 0.0)
            share = a["gpus"] if 0 < a.get("gpus", 0) < 1 else 1.0
            for host in a.get("hosts") or []:
                for gpu in a.get("devices") or []:
                    key = (host, gpu)
                    busy[key] = busy.get(key, 0.0) + seconds * share
    return busy


def _id_key(gpu: str) -> tuple[int, Any]:
    return (0, int(gpu)) if gpu.isdigit() else (1, gpu)
