"""The search views: history, parallel coordinates, importance, learning curves.

Each view is a pure function from a :class:`~hpo.dashboards.data.Snapshot` to
a Plotly figure, memoised per snapshot (a snapshot is hashed by identity and
never changes). Large studies are sampled here, server-side: every completed
trial is in the history (WebGL), at most a few thousand lines are drawn
elsewhere, always including the best trials.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.style import STATE_COLOURS, base_layout, message_figure, plain, short
from hpo.store.records import TrialStatus

__all__ = ["history", "parallel", "importance", "curves", "MIN_IMPORTANCE_TRIALS"]

MAX_PARALLEL_LINES = 1000
MAX_CURVES = 300
MAX_IMPORTANCE_TRIALS = 2000
# PED-ANOVA compares the top 10% with the rest: below this it is noise.
MIN_IMPORTANCE_TRIALS = 20


def completed(snap: Snapshot) -> list[TrialView]:
    """Completed trials with a value, best first."""
    return [t for t in snap.ranked if t.state is TrialStatus.COMPLETE and t.value is not None]


def spread(items: Sequence[Any], limit: int, keep: Sequence[Any] = ()) -> list[Any]:
    """At most ``limit`` items: ``keep`` first, then evenly spaced others.

    Deterministic, so a refresh that adds a trial does not reshuffle the plot.
    """
    kept = list(keep)[:limit]
    seen = {id(k) for k in kept}
    rest = [item for item in items if id(item) not in seen]
    room = limit - len(kept)
    if len(rest) > room:
        rest = [rest[i] for i in np.linspace(0, len(rest) - 1, max(room, 0)).astype(int)]
    return kept + rest


@functools.lru_cache(maxsize=4)
def history(snap: Snapshot) -> go.Figure:
    """Each finished trial's metric by trial number, and the best so far."""
    title = f"Optimisation history: {plain(snap.metric)} ({snap.direction})"
    done = sorted(completed(snap), key=lambda t: t.number)
    if not done:
        return message_figure(title, "No completed trial yet: the history appears with the first result.")
    numbers = np.fromiter((t.number for t in done), float, len(done))
    values = np.fromiter((t.value for t in done), float, len(done))
    best = (np.maximum if snap.maximize else np.minimum).accumulate(values)
    changed = np.flatnonzero(np.r_[True, best[1:] != best[:-1]])
    fig = go.Figure(layout=base_layout(title, xaxis_title="trial", yaxis_title=plain(snap.metric)))
    fig.add_trace(go.Scattergl(
        x=numbers, y=values, mode="markers", name="completed trial",
        marker={"size": 5, "color": STATE_COLOURS["COMPLETE"], "opacity": 0.6},
        hovertemplate="trial %{x}<br>%{y:.6g}<extra></extra>"))
    for state in (TrialStatus.PRUNED, TrialStatus.STOPPED):
        early = [t for t in snap.trials if t.state is state and t.value is not None]
        if early:
            word = state.value.lower()
            fig.add_trace(go.Scattergl(
                x=np.fromiter((t.number for t in early), float, len(early)),
                y=np.fromiter((t.value for t in early), float, len(early)), mode="markers",
                name=f"{word} (value when ended)", visible="legendonly",
                marker={"size": 4, "color": STATE_COLOURS[state.value], "symbol": "x"},
                hovertemplate=f"trial %{{x}} ({word})<br>%{{y:.6g}}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=np.r_[numbers[changed], numbers[-1]], y=np.r_[best[changed], best[-1]], mode="lines",
        line={"shape": "hv", "color": "#111", "width": 2}, name="best so far",
        hovertemplate="best after trial %{x}: %{y:.6g}<extra></extra>"))
    return fig


@functools.lru_cache(maxsize=4)
def parallel(snap: Snapshot) -> go.Figure:
    """Parameters against the metric, one line per completed trial (sampled)."""
    title = "Parallel coordinates: parameters against the metric"
    done = completed(snap)
    if len(done) < 2 or not snap.param_names:
        return message_figure(title, "Needs two completed trials with parameters.")
    lines = spread(sorted(done, key=lambda t: t.number), MAX_PARALLEL_LINES,
                   keep=done[: MAX_PARALLEL_LINES // 10])
    space = snap.spec.get("space") or {}
    dimensions = [_dimension(name, [t.params.get(name) for t in lines], space.get(name))
                  for name in snap.param_names]
    values = np.fromiter((t.value for t in lines), float, len(lines))
    dimensions.append({"label": plain(snap.metric), "values": values})
    note = f" ({len(lines)} of {len(done)} trials, best included)" if len(lines) < len(done) else ""
    fig = go.Figure(go.Parcoords(
        dimensions=dimensions, line={"color": values, "colorscale": "Viridis",
                                     "reversescale": not snap.maximize, "showscale": True,
                                     "colorbar": {"title": {"text": plain(snap.metric)}}}),
        layout=base_layout(title + note, margin={"l": 80, "r": 80, "t": 100, "b": 40}))
    return fig


def _dimension(name: str, values: list[Any], declared: Any) -> dict[str, Any]:
    numeric = all(isinstance(v, Real) and not isinstance(v, bool) for v in values)
    if numeric:
        array = np.asarray(values, float)
        if isinstance(declared, dict) and declared.get("log") and (array > 0).all():
            return {"label": plain(f"log10({name})"), "values": np.log10(array)}
        return {"label": plain(name), "values": array}
    # Categories in their declared order, then any others by their text.
    order = list(declared.get("choices", [])) if isinstance(declared, dict) else []
    labels = list(dict.fromkeys([str(c) for c in order] + sorted({str(v) for v in values})))
    index = {label: i for i, label in enumerate(labels)}
    return {"label": plain(name), "values": np.array([index[str(v)] for v in values], float),
            # Parcoords draws tick text literally (unlike labels): no entities here.
            "tickvals": list(range(len(labels))), "ticktext": [short(x, 24) for x in labels]}


@functools.lru_cache(maxsize=4)
def importance(snap: Snapshot) -> go.Figure:
    """Optuna's PED-ANOVA importance of each parameter for reaching the top 10%."""
    title = "Parameter importance (Optuna PED-ANOVA: what it takes to reach the top 10%)"
    done = [t for t in completed(snap) if t.params]
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return message_figure(title, f"Parameter importance needs at least {MIN_IMPORTANCE_TRIALS} "
                              f"completed trials; {len(done)} so far.")
    sample = spread(sorted(done, key=lambda t: t.number), MAX_IMPORTANCE_TRIALS)
    try:
        scores = _importances(sample, snap.direction)
    except (ValueError, RuntimeError, TypeError) as exc:
        return message_figure(title, f"Importance cannot be computed for this study: {exc}")
    if not scores:
        return message_figure(title, "No parameter varies among the completed trials.")
    names = list(scores)[::-1]  # most important at the top
    note = f"{len(sample)} of {len(done)} completed trials" if len(sample) < len(done) \
        else f"{len(done)} completed trials"
    fig = go.Figure(go.Bar(
        x=[scores[n] for n in names], y=[plain(n) for n in names], orientation="h",
        marker_color="#1f77b4", hovertemplate="%{y}: %{x:.3f}<extra></extra>"),
        layout=base_layout(f"{title}<br><sup>{note}</sup>", xaxis_title="importance",
                           height=max(300, 60 + 40 * len(names))))
    return fig


def _importances(trials: list[TrialView], direction: str) -> dict[str, float]:
    import optuna  # importing optuna.importance pulls scikit-learn in: only when drawn

    frozen = [optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                        value=t.value) for t in trials]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line
    try:
        study = optuna.create_study(direction=direction)  # in memory: the store stays untouched
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials(frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        scores = optuna.importance.get_param_importances(study, evaluator=evaluator)
    return {name: float(score) for name, score in scores.items() if math.isfinite(score)}


@functools.lru_cache(maxsize=4)
def curves(snap: Snapshot) -> go.Figure:
    """Reported steps of each trial (sampled, best first), pruned and stopped marked."""
    metric = _curve_metric(snap)
    title = f"Learning curves: {plain(metric or snap.metric)} by reported step"
    reporting = [t for t in snap.trials if t.reports]
    if metric is None or not reporting:
        return message_figure(title, "No trial has reported a step yet (trial.report(step, ...)).")
    best = [t for t in completed(snap) if t.reports][:10]
    chosen = spread(reporting, MAX_CURVES, keep=best)
    fig = go.Figure(layout=base_layout(
        title + (f" ({len(chosen)} of {len(reporting)} trials, best included)"
                 if len(chosen) < len(reporting) else ""),
        xaxis_title="step", yaxis_title=plain(metric)))
    by_state: dict[str, list[TrialView]] = {}
    for trial in chosen:
        by_state.setdefault(trial.state.value, []).append(trial)
    for state, trials in by_state.items():
        xs, ys, ids = _polylines(trials, metric)
        fig.add_trace(go.Scattergl(
            x=xs, y=ys, customdata=ids, mode="lines", name=state.lower(), opacity=0.45,
            line={"color": STATE_COLOURS.get(state, "#999"), "width": 1},
            hovertemplate="trial %{customdata}<br>step %{x}: %{y:.6g}<extra></extra>"))
    for rank, trial in enumerate(best[:5]):
        xs, ys, ids = _polylines([trial], metric)
        fig.add_trace(go.Scattergl(
            x=xs, y=ys, customdata=ids, mode="lines", name=f"best #{rank + 1}: trial {trial.number}",
            line={"width": 3}, hovertemplate="trial %{customdata}<br>step %{x}: %{y:.6g}<extra></extra>"))
    for kind, symbol in (("pruned", "x"), ("stopped", "square")):
        xs, ys, ids = _marks(chosen, metric, kind)
        if xs:
            fig.add_trace(go.Scattergl(
                x=xs, y=ys, customdata=ids, mode="markers", name=f"{kind} here",
                marker={"symbol": symbol, "size": 9, "color": STATE_COLOURS["PRUNED"] if kind == "pruned"
                        else "#333"},
                hovertemplate=f"trial %{{customdata}} {kind} at step %{{x}}<extra></extra>"))
    return fig


def _curve_metric(snap: Snapshot) -> str | None:
    """The study's metric when trials report it, else the first metric reported."""
    first = None
    for trial in snap.trials:
        for _, metrics in trial.reports:
            if snap.metric in metrics:
                return snap.metric
            first = first or next(iter(metrics), None)
    return first


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
