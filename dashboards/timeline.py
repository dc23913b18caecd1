"""Where the time went: the timeline of trials on workers, utilisation and cost.

A trial occupies a worker slot in one or more intervals: one per segment when
it ran in resumable segments, else one from its start to its end (now, while
it runs), plus one per earlier attempt lost and retried. The timeline draws
them as bars (the task trace of a COMPSs run) up to ``MAX_BARS``; beyond that
each worker row is binned in time and coloured by the state that filled the
bin most, so 100,000 trials still draw as a few thousand cells.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpo.dashboards.data import Snapshot, worker_label
from hpo.dashboards.style import RETRIED, STATE_COLOURS, base_layout, message_figure, plain
from hpo.store.records import TrialStatus, study_cost
from hpo.units import format_resource_time

__all__ = ["Intervals", "intervals", "timeline", "utilisation", "cost"]

MAX_BARS = 2500
MIN_BAR_FRACTION = 0.004  # of the time span: the narrowest bar drawn
TIME_BINS = 240
UTILISATION_BINS = 600
# Segment outcomes are state values; a few other words map onto them.
_OUTCOMES = {**{s.value: s.value for s in TrialStatus}, "COMPLETED": "COMPLETE",
             "INTERRUPTED": "CANCELLED"}
_LIVE = (TrialStatus.RUNNING, TrialStatus.SUSPENDED)


class Intervals(NamedTuple):
    """Every interval a worker slot was busy, as parallel arrays."""

    start: np.ndarray  # epoch seconds
    end: np.ndarray
    row: list[str]  # the worker: host:pid, or the worker's name
    kind: list[str]  # a TrialStatus value, or RETRIED
    trial: np.ndarray  # trial number
    cpus: np.ndarray
    gpus: np.ndarray


@functools.lru_cache(maxsize=4)
def intervals(snap: Snapshot) -> Intervals:
    """The busy intervals of every trial, retried attempts and segments included."""
    start, end, row, kind, trial, cpus, gpus = [], [], [], [], [], [], []

    def add(s: Any, e: Any, where: str, what: str, t) -> None:
        if isinstance(s, (int, float)) and isinstance(e, (int, float)) and e >= s:
            start.append(s)
            end.append(e)
            row.append(where)
            kind.append(what)
            trial.append(t.number)
            cpus.append(t.cpus)
            gpus.append(t.gpus)

    now = snap.taken_at
    for t in snap.trials:
        for p in t.previous:
            add(p.get("started_at"), p.get("ended_at"), worker_label(p.get("host"), p.get("pid")),
                RETRIED, t)
        if t.segments:
            for seg in t.segments:
                outcome = _OUTCOMES.get(str(seg.get("outcome") or "").upper(), t.state.value)
                stop = seg.get("ended_at")
                if stop is None and t.state in _LIVE:
                    stop, outcome = now, TrialStatus.RUNNING.value
                add(seg.get("started_at"), stop,
                    worker_label(seg.get("host"), seg.get("pid"), seg.get("worker")), outcome, t)
        else:
            stop = t.ended_at if t.ended_at is not None else (now if t.state in _LIVE else None)
            add(t.started_at, stop, t.worker, t.state.value, t)
    return Intervals(np.asarray(start, float), np.asarray(end, float), row, kind,
                     np.asarray(trial, int), np.asarray(cpus, float), np.asarray(gpus, float))


def _local(seconds: np.ndarray | list[float]) -> list[str]:
    # Local time of the machine serving the view: what the user's clock says.
    return [datetime.fromtimestamp(s).isoformat(sep=" ", timespec="milliseconds") for s in seconds]


def _rows(row: list[str]) -> list[str]:
    """Worker rows sorted by host, then numerically by process."""
    def key(label: str) -> tuple:
        host, _, pid = label.rpartition(":")
        return (host, int(pid)) if pid.isdigit() else (label, -1)
    return sorted(set(row), key=key)


@functools.lru_cache(maxsize=4)
def timeline(snap: Snapshot) -> go.Figure:
    """One row per worker, a bar per trial (segment, attempt) coloured by state."""
    iv = intervals(snap)
    title = "Timeline: trials on workers"
    if not len(iv.start):
        return message_figure(title, "No trial has started yet.")
    rows = _rows(iv.row)
    height = min(1400, max(320, 120 + 18 * len(rows)))
    layout = base_layout(title, height=height, barmode="overlay", xaxis={"type": "date",
                         "title": "time (local)"}, yaxis={"categoryorder": "array",
                         "categoryarray": [plain(r) for r in rows[::-1]], "title": "worker"})
    if len(iv.start) > MAX_BARS:
        return _binned_timeline(iv, rows, layout)
    fig = go.Figure(layout=layout)
    kinds = np.asarray(iv.kind)
    # A trial that failed at once lasts 0 s: draw it at least this wide, so it shows.
    least = max(float(iv.end.max() - iv.start.min()) * MIN_BAR_FRACTION, 1e-3)
    about = _trial_text(snap)
    for kind in dict.fromkeys(iv.kind):
        pick = np.flatnonzero(kinds == kind)
        duration = iv.end[pick] - iv.start[pick]
        fig.add_trace(go.Bar(
            orientation="h", y=[plain(iv.row[i]) for i in pick], base=_local(iv.start[pick]),
            x=np.maximum(duration, least) * 1000.0, name=kind.lower(), marker={
                "color": STATE_COLOURS.get(kind, "#999"), "line": {"width": 0.5, "color": "#fff"},
                "pattern": {"shape": "/" if kind == RETRIED else ""}},
            customdata=[[int(iv.trial[i]), float(d), about.get(int(iv.trial[i]), "")]
                        for i, d in zip(pick, duration)],
            hovertemplate="trial %{customdata[0]}: %{customdata[1]:.1f} s<br>%{y}<br>"
                          "%{customdata[2]}<extra>" + plain(kind.lower()) + "</extra>"))
    return fig


def _trial_text(snap: Snapshot) -> dict[int, str]:
    """Each trial's value and parameters, for the hover (plain, short)."""
    out = {}
    for t in snap.trials:
        value = "no value" if t.value is None else f"{snap.metric}={t.value:.6g}"
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in t.params.items())
        out[t.number] = plain(value) + (f"<br>{plain(params, 300)}" if params else "")
    return out


def _binned_timeline(iv: Intervals, rows: list[str], layout: dict[str, Any]) -> go.Figure:
    """Each worker row cut in TIME_BINS cells, coloured by the state busiest in it."""
    edges = np.linspace(iv.start.min(), iv.end.max(), TIME_BINS + 1)
    kinds = list(dict.fromkeys(iv.kind))
    row_index = {r: i for i, r in enumerate(rows)}
    rows_of = np.fromiter((row_index[r] for r in iv.row), int, len(iv.row))
    kind_of = np.fromiter((kinds.index(k) for k in iv.kind), int, len(iv.kind))
    busy = np.zeros((len(kinds), len(rows), TIME_BINS))
    for k in range(len(kinds)):
        for r in np.unique(rows_of[kind_of == k]):
            pick = (kind_of == k) & (rows_of == r)
            busy[k, r] = _busy_per_bin(iv.start[pick], iv.end[pick], edges)
    total = busy.sum(axis=0)
    width = edges[1] - edges[0]
    dominant = np.where(total > 0, busy.argmax(axis=0), np.nan)
    names = [plain(k.lower()) for k in kinds]
    text = np.where(total > 0, [[f"busy {100 * min(c / width, 1):.0f}%, mostly {names[int(d)]}"
                                 if c > 0 else "idle" for c, d in zip(tr, np.nan_to_num(dr))]
                                for tr, dr in zip(total, dominant)], "idle")
    # A discrete colour scale: value k (a state) maps to that state's colour.
    n = max(len(kinds), 1)
    scale = []
    for k, kind in enumerate(kinds):
        colour = STATE_COLOURS.get(kind, "#999")
        scale += [[k / n, colour], [(k + 1) / n, colour]]
    layout["title"]["text"] += (f" (binned: {len(iv.start)} bars in {TIME_BINS} time bins of "
                                f"{width:.0f} s per worker; colour = state busiest in the bin)")
    fig = go.Figure(go.Heatmap(
        z=dominant[::-1], x=_local((edges[:-1] + edges[1:]) / 2), y=[plain(r) for r in rows[::-1]],
        zmin=-0.5, zmax=n - 0.5, colorscale=scale, text=text[::-1], xgap=0, ygap=1,
        hovertemplate="%{y}<br>%{x}<br>%{text}<extra></extra>",
        colorbar={"tickvals": list(range(n)), "ticktext": names, "title": {"text": "state"}}),
        layout=layout)
    return fig


def _busy_per_bin(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy slot-seconds in each bin: the integral of the busy count at the edges."""
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones_like(start), -np.ones_like(end)])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(delta[order])
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    return np.diff(np.interp(edges, times, integral))


@functools.lru_cache(maxsize=4)
def utilisation(snap: Snapshot) -> go.Figure:
    """Busy slots over time against the slots available, and what the hours went to."""
    iv = intervals(snap)
    spent = cost(snap)
    title = (f"Utilisation and cost: {format_resource_time(spent['core_hours'])}, "
             f"{format_resource_time(spent['gpu_hours'], 'GPU')} in all; on pruned trials "
             f"{format_resource_time(spent['pruned_core_hours'])}, failed "
             f"{format_resource_time(spent['failed_core_hours'])}, retried attempts "
             f"{format_resource_time(spent['retried_core_hours'])}")
    if not len(iv.start):
        return message_figure(title, "No trial has started yet.")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.68, 0.32], horizontal_spacing=0.09,
                        subplot_titles=("busy slots over time", "time by outcome"))
    t0, t1 = iv.start.min(), max(iv.end.max(), iv.start.min() + 1e-3)
    if 2 * len(iv.start) <= 4 * UTILISATION_BINS:
        times = np.concatenate([iv.start, iv.end])
        delta = np.concatenate([np.ones_like(iv.start), -np.ones_like(iv.end)])
        order = np.argsort(times, kind="stable")
        x, y, shape, label = times[order], np.cumsum(delta[order]), "hv", "busy slots"
    else:
        edges = np.linspace(t0, t1, UTILISATION_BINS + 1)
        x = (edges[:-1] + edges[1:]) / 2
        y = _busy_per_bin(iv.start, iv.end, edges) / np.diff(edges)
        shape, label = "linear", f"busy slots (mean per {edges[1] - edges[0]:.0f} s)"
    fig.add_trace(go.Scatter(x=_local(x), y=y, mode="lines", line={"shape": shape, "color": "#1f77b4"},
                             fill="tozeroy", name=label,
                             hovertemplate="%{x}<br>%{y:.2f} busy<extra></extra>"), row=1, col=1)
    slots, source = (snap.slots, "search.parallel") if snap.slots else \
        (len(set(iv.row)), "workers seen")
    fig.add_trace(go.Scatter(x=_local([t0, t1]), y=[slots, slots], mode="lines",
                             line={"dash": "dash", "color": "#d62728"},
                             name=f"available slots ({source}: {slots})"), row=1, col=1)
    kinds = [k for k in spent["core_hours_by"] if spent["core_hours_by"][k] or spent["gpu_hours_by"][k]]
    unit, per_hour = _unit(max([spent["core_hours"], spent["gpu_hours"]]))
    for key, name, colour in (("core_hours_by", f"core-{unit}", "#1f77b4"),
                              ("gpu_hours_by", f"GPU-{unit}", "#ff7f0e")):
        fig.add_trace(go.Bar(x=[plain(k.lower()) for k in kinds],
                             y=[spent[key][k] * per_hour for k in kinds],
                             name=name, marker_color=colour,
                             hovertemplate="%{x}: %{y:.3g} " + name + "<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(base_layout(title, barmode="group", height=500,
                                  margin={"l": 60, "r": 20, "t": 90, "b": 60}))
    fig.update_layout(title_font_size=14)
    fig.update_xaxes(type="date", title_text="time (local)", row=1, col=1)
    fig.update_yaxes(title_text="slots", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=unit, row=1, col=2)
    return fig


def _unit(hours: float) -> tuple[str, float]:
    """The unit format_resource_time would use for ``hours``, and its count per hour."""
    if hours * 3600 < 60:
        return "seconds", 3600.0
    if hours < 1:
        return "minutes", 60.0
    return "hours", 1.0


@functools.lru_cache(maxsize=4)
def cost(snap: Snapshot) -> dict[str, Any]:
    """Core- and GPU-hours in all and by outcome; running trials count so far."""
    spent = study_cost(((t.state, t.cost) for t in snap.trials), now=snap.taken_at)
    core_by, gpu_by = spent.core_hours_by, spent.gpu_hours_by
    failed = ("FAILED", "TIMEOUT")
    return {"core_hours": spent.core_hours, "gpu_hours": spent.gpu_hours,
            "pruned_core_hours": core_by["PRUNED"],
            "failed_core_hours": sum(core_by[k] for k in failed),
            "retried_core_hours": core_by[RETRIED],
            "pruned_gpu_hours": gpu_by["PRUNED"], "failed_gpu_hours": sum(gpu_by[k] for k in failed),
            "core_hours_by": core_by, "gpu_hours_by": gpu_by}
