"""One trial in full: the page a user opens to see what happened to it.

Parameters, what the objective returned apart from what it reported last,
the user attributes its own code set, the curve of every metric it
reported, its events with their reasons (pruned because..., suspended,
resumed), its attempts and segments with host and PID, the whole traceback
of each failure, its checkpoint directory and the tail of any log kept
there. :func:`details` gathers the facts (pure data, tested without Dash);
:func:`page` lays them out as Dash components, which escape every text they
show.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import plotly.graph_objects as go
from dash import dcc, html
from plotly.subplots import make_subplots

from hpo.dashboards import leaderboard
from hpo.dashboards.data import Snapshot, TrialView, worker_label
from hpo.dashboards.style import STATE_COLOURS, base_layout, plain
from hpo.store import RunDir
from hpo.trial import LOG_NAME
from hpo.trial_details import last_report, returned
from hpo.units import format_resource_time, format_seconds, format_value

__all__ = ["TrialDetails", "details", "page", "metrics_figure", "attributes_table", "LOG_TAIL_BYTES"]

LOG_TAIL_BYTES = 32_000
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
MAX_FILES = 50
MAX_METRIC_PANELS = 8


class TrialDetails(NamedTuple):
    trial: TrialView
    rank: int | None  # among the trials with a value; None without one
    checkpoint_dir: Path
    files: list[tuple[str, int]]  # (name relative to the checkpoint dir, bytes), up to MAX_FILES
    logs: list[tuple[str, str]]  # (name, its last LOG_TAIL_BYTES)
    attempts: list[dict[str, Any]]  # earlier attempts then the current one, each with its error


def details(snap: Snapshot, number: int) -> TrialDetails | None:
    """Everything the page shows about trial ``number`` (None: no such trial)."""
    trial = snap.by_number.get(number)
    if trial is None:
        return None
    folder = RunDir(Path(snap.run_dir)).checkpoint_dir(number)
    files, logs = _folder(folder)
    return TrialDetails(trial, leaderboard.ranks(snap).get(number), folder, files, logs, _attempts(trial))


def _folder(folder: Path) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """The checkpoint directory's files and the tails of its log files (read only)."""
    files: list[tuple[str, int]] = []
    logs: list[tuple[str, str]] = []
    if not folder.is_dir():
        return files, logs
    # The trial's own log (what the objective printed, hpo.trial) first.
    paths = sorted((p for p in folder.rglob("*") if p.is_file()),
                   key=lambda p: (p.name != LOG_NAME, str(p)))
    for path in paths[:MAX_FILES]:
        name = str(path.relative_to(folder))
        size = path.stat().st_size
        files.append((name, size))
        if path.suffix in LOG_SUFFIXES:
            with open(path, "rb") as f:
                f.seek(max(size - LOG_TAIL_BYTES, 0))
                logs.append((name, f.read().decode("utf-8", "replace")))
    return files, logs


def _attempts(trial: TrialView) -> list[dict[str, Any]]:
    rows = []
    for p in trial.previous:
        error = p.get("error") or {}
        rows.append({"attempt": p.get("attempt"), "where": worker_label(p.get("host"), p.get("pid")),
                     "started": p.get("started_at"), "ended": p.get("ended_at"),
                     "outcome": "lost" if not error else "failed, retried",
                     "error": _one_line(error), "traceback": error.get("traceback")})
    if trial.attempt or trial.started_at is not None:
        rows.append({"attempt": trial.attempt or len(rows) + 1, "where": trial.worker,
                     "started": trial.attempt_started_at or trial.started_at, "ended": trial.ended_at,
                     "outcome": trial.state.value.lower(), "error": trial.error,
                     "traceback": trial.traceback})
    return rows


def _one_line(error: dict[str, Any]) -> str | None:
    return f"{error.get('type', 'Error')}: {error.get('message', '')}" if error else None


# ------------------------------------------------------------------ figure

def metrics_figure(trial: TrialView) -> go.Figure:
    """Every metric the trial reported, one panel each, sharing the step axis;
    where it was pruned or stopped is marked."""
    names = list(dict.fromkeys(n for _, metrics in trial.reports for n in metrics))[:MAX_METRIC_PANELS]
    fig = make_subplots(rows=max(len(names), 1), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[plain(n) for n in names])
    colour = STATE_COLOURS.get(trial.state.value, "#1f77b4")
    for row, name in enumerate(names, start=1):
        points = [(step, m[name]) for step, m in trial.reports if name in m]
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points],
                                 mode="lines+markers", name=plain(name), showlegend=False,
                                 line={"color": colour}, hovertemplate="step %{x}: %{y:.6g}<extra></extra>"),
                      row=row, col=1)
    for event in trial.events:
        if event.get("kind") in ("pruned", "stopped", "suspended") and event.get("step") is not None:
            fig.add_vline(x=event["step"], line={"dash": "dot", "color": "#555", "width": 1},
                          annotation_text=event["kind"], annotation_position="top")
    fig.update_xaxes(title_text="step", row=max(len(names), 1), col=1)
    fig.update_layout(base_layout(f"Trial {trial.number}: every reported metric",
                                  height=max(300, 60 + 170 * len(names)), showlegend=False,
                                  margin={"l": 60, "r": 20, "t": 60, "b": 40}))
    return fig


# ------------------------------------------------------------------ layout

def page(snap: Snapshot, number: int | None) -> list[Any]:
    """The trial page as Dash components."""
    if number is None:
        return [html.P("Type a trial number above, or click a row of the leaderboard.", className="what")]
    found = details(snap, int(number))
    if found is None:
        numbers = [t.number for t in snap.trials]
        span = f"trials {min(numbers)} to {max(numbers)}" if numbers else "no trial yet"
        return [html.P(f"Trial {number}: not in this study ({span}).", id="trial-missing",
                       style={"color": "#d62728"})]
    t = found.trial
    about: list[Any] = [
        _facts(snap, found),
        html.H4("Parameters"), _table(["parameter", "value"], [[k, _text(v)] for k, v in t.params.items()],
                                      "trial-params"),
    ]
    about += _metrics("Returned", returned(t, t.reports, _objective_names(snap)), "trial-returned")
    step, last = last_report(t.reports)
    about += _metrics(f"Last report (step {step})", last, "trial-last-report")
    if t.user_attrs:
        about += [html.H4("User attributes"), attributes_table(t.user_attrs, "trial-user-attrs")]
    side = [dcc.Graph(id="trial-curves", figure=metrics_figure(t), config={"displaylogo": False})] \
        if t.reports else [html.P("No step reported.", className="what")]
    parts: list[Any] = [
        html.H3([f"Trial {t.number} ", html.Span(t.state.value, style={
            "color": STATE_COLOURS.get(t.state.value, "#333")})], id="trial-title"),
        # Facts beside the curves: one screen shows what the trial was and did.
        html.Div(style={"display": "flex", "gap": "2em", "flexWrap": "wrap"}, children=[
            html.Div(about, style={"flex": "0 0 auto", "maxWidth": "28em"}),
            html.Div(side, style={"flex": "1 1 30em", "minWidth": "20em"})]),
    ]
    parts += _failures(found)
    if t.events:
        parts += [html.H4("Events"), _table(
            ["time", "event", "step", "reason", "host"],
            [[_when(e.get("time")), e.get("kind"), _text(e.get("step")), e.get("reason") or "",
              e.get("host") or ""] for e in t.events], "trial-events")]
    parts += [html.H4("Attempts"), _table(
        ["attempt", "where (host:pid)", "started", "ended", "outcome", "error"],
        [[_text(a["attempt"]), a["where"], _when(a["started"]), _when(a["ended"]), a["outcome"],
          a["error"] or ""] for a in found.attempts], "trial-attempts")]
    if t.segments:
        parts += [html.H4("Segments"), _table(
            ["segment", "where (host:pid)", "started", "ended", "steps", "outcome"],
            [[_text(s.get("index")), worker_label(s.get("host"), s.get("pid"), s.get("worker")),
              _when(s.get("started_at")), _when(s.get("ended_at")),
              f"{_text(s.get('first_step'))}-{_text(s.get('last_step'))}", s.get("outcome") or ""]
             for s in t.segments], "trial-segments")]
    parts += _checkpoint(found)
    return parts


def _objective_names(snap: Snapshot) -> list[str]:
    return [name for name, _ in snap.objectives] or [snap.metric]


def _metrics(title: str, metrics: dict[str, float], id_: str) -> list[Any]:
    if not metrics:
        return []
    return [html.H4(title), _table(["metric", "value"], [[k, _text(v)] for k, v in metrics.items()], id_)]


def attributes_table(attrs: dict[str, Any], id_: str) -> html.Table:
    """User attributes (what the user's own code set), values as JSON but for text."""
    rows = [[k, v if isinstance(v, str) else json.dumps(v, default=str)] for k, v in sorted(attrs.items())]
    return _table(["attribute", "value"], rows, id_)


def _facts(snap: Snapshot, found: TrialDetails) -> html.Ul:
    t = found.trial
    items = [f"{snap.metric}: {_text(t.value)}" + (f" (rank {found.rank})" if found.rank else ""),
             f"steps reported: {t.steps}", f"attempts: {t.attempt}",
             f"busy: {format_seconds(t.duration_s)} s, {format_resource_time(t.core_seconds / 3600)}, "
             f"{format_resource_time(t.gpu_seconds / 3600, 'GPU')}", f"ran on: {t.worker}"]
    if t.stop_reason:
        items.append(f"ended by: {t.stop_reason}")
    return html.Ul([html.Li(i) for i in items], id="trial-facts")


def _failures(found: TrialDetails) -> list[Any]:
    out = []
    for a in found.attempts:
        if a["error"]:
            out += [html.H4(f"Error (attempt {a['attempt']}, {a['outcome']})"),
                    html.P(a["error"], style={"color": "#d62728"}),
                    html.Pre(a["traceback"] or "(no traceback was recorded)", className="traceback",
                             style=_PRE)]
    return out


def _checkpoint(found: TrialDetails) -> list[Any]:
    out = [html.H4("Checkpoint directory"), html.Code(str(found.checkpoint_dir), id="trial-checkpoint")]
    if not found.files:
        out.append(html.P("(empty or not created: the trial saved no checkpoint)", className="what"))
        return out
    out.append(html.Ul([html.Li(f"{name} ({size:,} bytes)") for name, size in found.files]))
    for name, tail in found.logs:
        out += [html.H4(f"Log: {name} (last {LOG_TAIL_BYTES // 1000} kB)"),
                html.Pre(tail, className="trial-log", style=_PRE)]
    return out


_PRE = {"whiteSpace": "pre-wrap", "background": "#f6f6f6", "padding": "0.6em", "fontSize": 12,
        "maxHeight": "30em", "overflow": "auto", "border": "1px solid #ddd"}


def _table(header: list[str], rows: list[list[Any]], id_: str) -> html.Table:
    cell = {"border": "1px solid #ddd", "padding": "2px 8px", "textAlign": "left", "verticalAlign": "top"}
    return html.Table(id=id_, style={"borderCollapse": "collapse", "fontSize": 13}, children=[
        html.Thead(html.Tr([html.Th(h, style={**cell, "background": "#f3f3f3"}) for h in header])),
        html.Tbody([html.Tr([html.Td(_text(c), style=cell) for c in row]) for row in rows])])


def _text(value: Any) -> str:
    return format_value(value, 6)


def _when(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    return datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="seconds")
