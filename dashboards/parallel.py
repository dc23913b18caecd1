"""Parallel coordinates, and the brush that selects trials on them.

Each parameter is an axis fitted to the lines drawn (:class:`Coordinate`): log
parameters on a log axis with ticks in their own units, categorical ones as
their categories in declared order, a trial without a conditional parameter
on a blank tick below its range. A range dragged along axes (the brush) is
kept by the dashboard as ``{axis key: [[low, high], ...]}`` in drawn units;
:func:`selected` turns it into the trials inside, over the whole study (not
only the sampled lines), so the leaderboard and the history can show just those.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from numbers import Real
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.sampling import completed, sample, sampled_note, spread
from hpo.dashboards.style import base_layout, menu, message_figure, plain, short
from hpo.store.records import TrialStatus

__all__ = ["parallel", "Coordinate", "coordinates", "log_ticks", "decade_ticks", "INACTIVE",
           "MAX_PARALLEL_LINES", "Brush", "axis_keys", "brushed", "frozen", "selected", "described"]

MAX_PARALLEL_LINES = 500
# A parameter a trial does not have (conditional spaces): a blank tick, not a value.
INACTIVE = object()
# Trials with a value to draw: completed ones, and those that ended early at a value.
_VALUED = (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.STOPPED)
# A brush made hashable (memoised figures take it): ((axis key, ((low, high), ...)), ...).
Brush = tuple[tuple[str, tuple[tuple[float, float], ...]], ...]
_CONSTRAINT = re.compile(r"dimensions\[(\d+)\]\.constraintrange")


class Coordinate(NamedTuple):
    """One parameter as an axis, fitted to the lines drawn."""

    name: str
    labels: tuple[str, ...] | None  # categories in order ("" first for inactive); None: numbers
    log: bool  # drawn as log10
    inactive_at: float  # where a trial without the parameter is drawn (NaN: none is)
    ticks: dict[str, Any]  # tickvals, ticktext, range (empty: Plotly's own)

    def encode(self, raw: Sequence[Any]) -> np.ndarray:
        """``raw`` values (INACTIVE where a trial lacks the parameter) in drawn
        units; NaN for a value the axis has no place for."""
        if self.labels is not None:
            index = {label: i for i, label in enumerate(self.labels)}
            return np.array([index.get("" if v is INACTIVE else str(v), np.nan) for v in raw], float)
        inactive = np.array([v is INACTIVE for v in raw], bool)
        values = np.array([v if _is_number(v) else np.nan for v in raw], float)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.log10(values)
        return np.where(inactive, self.inactive_at, values)


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _choices(declared: Any) -> list[Any] | None:
    """The declared choices of a categorical parameter (numbers included), else None."""
    if isinstance(declared, list):
        return declared
    if isinstance(declared, dict) and isinstance(declared.get("choices"), list):
        return declared["choices"]
    return None


def coordinate(name: str, raw: list[Any], declared: Any) -> Coordinate:
    """The axis of parameter ``name`` for the values ``raw`` of the lines drawn."""
    choices = _choices(declared)
    if choices is None and all(_is_number(v) for v in raw if v is not None and v is not INACTIVE):
        inactive = np.array([v is INACTIVE for v in raw], bool)
        array = np.asarray([np.nan if v is None or v is INACTIVE else v for v in raw], float)
        log = bool(isinstance(declared, dict) and declared.get("log")
                   and (array[~np.isnan(array)] > 0).all())
        ticks = log_ticks(array) if log else {}
        if not inactive.any():
            return Coordinate(name, None, log, math.nan, ticks)
        with np.errstate(divide="ignore", invalid="ignore"):
            drawn = np.log10(array) if log else array
        at, ticks = _below_range(drawn[~inactive & np.isfinite(drawn)], ticks)
        return Coordinate(name, None, log, at, ticks)
    # Categories in their declared order, then any others by their text; inactive first.
    shown = {"" if v is INACTIVE else str(v) for v in raw}
    labels = tuple(dict.fromkeys([""] * ("" in shown) + [str(c) for c in choices or ()] + sorted(shown)))
    # Parcoords draws tick text literally (unlike labels): no entities here.
    return Coordinate(name, labels, False, math.nan, {
        "tickvals": list(range(len(labels))), "ticktext": [short(x, 24) for x in labels],
        "range": [-0.25, len(labels) - 0.75]})


def _below_range(active: np.ndarray, ticks: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Where trials without the parameter go, on a blank tick just below the
    active values' range (a parcoords line needs a value on every axis)."""
    low, high = (active.min(), active.max()) if len(active) else (0.0, 1.0)
    gap = (high - low) * 0.15 or 0.5
    values = ticks.get("tickvals") or list(np.linspace(low, high, 5) if high > low else [low])
    text = ticks.get("ticktext") or [f"{t:.3g}" for t in values]
    return float(low - gap), {"tickvals": [low - gap, *values], "ticktext": ["", *text],
                              "range": [low - gap, high]}


def log_ticks(values: np.ndarray) -> dict[str, Any]:
    """Ticks in the parameter's own units on an axis drawn in log10 (see
    :func:`decade_ticks`)."""
    finite = values[np.isfinite(values) & (values > 0)]
    if not len(finite):
        return {}
    shown = decade_ticks(finite)
    low, high = math.log10(finite.min()), math.log10(finite.max())
    return {"tickvals": [math.log10(t) for t in shown], "ticktext": [f"{t:g}" for t in shown],
            "range": [low, high] if high > low else [low - 0.5, high + 0.5]}


def decade_ticks(values: np.ndarray) -> list[float]:
    """Where a log axis over positive ``values`` is labelled, in their units:
    every decade, and 2 and 5 times it when the range spans few decades; the
    ends of a range inside one decade."""
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        return []
    low, high = math.log10(values.min()), math.log10(values.max())
    steps = (1,) if high - low > 3 else (1, 2, 5)
    ticks = [m * 10.0 ** e for e in range(math.floor(low), math.ceil(high) + 1) for m in steps]
    shown = [t for t in ticks if low - 1e-9 <= math.log10(t) <= high + 1e-9]
    if len(shown) < 2:  # a range inside one decade: its ends
        shown = sorted({float(f"{values.min():.2g}"), float(f"{values.max():.2g}")})
    return shown


# ------------------------------------------------------------------ the figure

@functools.lru_cache(maxsize=4)
def _lines(snap: Snapshot) -> tuple[list[TrialView], list[TrialView], int]:
    """The completed trials drawn (sampled, best first), the pruned and stopped
    ones the button adds, and how many of those there are in all."""
    early = [t for t in snap.trials if t.state in _VALUED[1:] and t.value is not None
             and math.isfinite(t.value)]
    lines = sample(completed(snap), MAX_PARALLEL_LINES)
    more = spread(sorted(early, key=lambda t: t.number),
                  max(MAX_PARALLEL_LINES - len(lines), MAX_PARALLEL_LINES // 5))
    return lines, more, len(early)


@functools.lru_cache(maxsize=4)
def coordinates(snap: Snapshot) -> tuple[Coordinate, ...]:
    """Every parameter's axis, fitted to all the lines either trace draws (so
    both traces, and the brush, share one scale)."""
    lines, more, _ = _lines(snap)
    drawn = lines + more
    space = snap.spec.get("space") or {}
    return tuple(coordinate(n, [t.params.get(n, INACTIVE) for t in drawn], space.get(n))
                 for n in snap.param_names)


@functools.lru_cache(maxsize=8)
def parallel(snap: Snapshot, brush: Brush = ()) -> go.Figure:
    """Parameters against the metric, one line per completed trial (sampled,
    the best always drawn); a second trace adds the pruned and stopped trials
    at the value they ended with. ``brush`` draws the dashboard's ranges."""
    title = "Parallel coordinates: parameters against the metric"
    lines, more, early = _lines(snap)
    if len(lines) < 2 or not snap.param_names:
        return message_figure(title, "Needs two completed trials with parameters.")
    note = sampled_note(len(lines), len(completed(snap)))
    fig = go.Figure(layout=base_layout(title + (f"<br><sup>{note}</sup>" if note else ""),
                                       margin={"l": 80, "r": 80, "t": 110, "b": 40}))
    ranges = dict(brush)
    fig.add_trace(_parcoords(snap, lines, "completed trials", ranges))
    if more:
        fig.add_trace(_parcoords(snap, lines + more, "completed, pruned and stopped", ranges,
                                 visible=False))
        of = f"{len(more)} of {early}" if len(more) < early else f"{early}"
        fig.update_layout(updatemenus=[menu([
            {"label": "completed", "method": "restyle", "args": [{"visible": [True, False]}]},
            {"label": f"+ {of} pruned/stopped (value when ended)", "method": "restyle",
             "args": [{"visible": [False, True]}]}])])
    return fig


def _parcoords(snap: Snapshot, lines: list[TrialView], name: str,
               ranges: dict[str, tuple[tuple[float, float], ...]], visible: bool = True) -> go.Parcoords:
    values = np.fromiter((t.value for t in lines), float, len(lines))
    dimensions = [{"label": plain(c.name), "values": c.encode([t.params.get(c.name, INACTIVE) for t in lines]),
                   **c.ticks} for c in coordinates(snap)]
    dimensions.append({"label": plain(snap.metric), "values": values})
    for key, dimension in zip(axis_keys(snap), dimensions):
        if key in ranges:  # one range as [low, high], several as a list of them
            chosen = [list(r) for r in ranges[key]]
            dimension["constraintrange"] = chosen[0] if len(chosen) == 1 else chosen
    return go.Parcoords(
        dimensions=dimensions, name=name, visible=visible,
        line={"color": values, "colorscale": "Viridis", "reversescale": not snap.maximize,
              "showscale": True, "colorbar": {"title": {"text": plain(snap.metric)}}})


# ------------------------------------------------------------------ the brush

def axis_keys(snap: Snapshot) -> list[str]:
    """A key per axis, in the figure's order: ``param:<name>`` then ``metric:<name>``
    (a parameter may share the metric's name)."""
    return [f"param:{n}" for n in snap.param_names] + [f"metric:{snap.metric}"]


def brushed(brush: dict[str, list], restyle: list | None, snap: Snapshot) -> dict[str, list]:
    """``brush`` after Plotly's restyle event ``[{"dimensions[i].constraintrange":
    ranges}, [trace]]`` (None ranges: the axis was cleared); other events
    (the pruned-trials button) leave it as it is."""
    if not restyle or not isinstance(restyle[0], dict):
        return brush
    keys = axis_keys(snap)
    out = dict(brush)
    for attr, value in restyle[0].items():
        match = _CONSTRAINT.fullmatch(attr)
        if not match or int(match[1]) >= len(keys):
            continue
        ranges = _ranges(value)
        if ranges:
            out[keys[int(match[1])]] = ranges
        else:
            out.pop(keys[int(match[1])], None)
    return out


def _ranges(value: Any) -> list[list[float]]:
    """Plotly's forms of a constraint range: ``[low, high]``, ``[[low, high], ...]``,
    either wrapped once more per trace; None or ``[]`` when cleared."""
    if not isinstance(value, list) or not value:
        return []
    if all(_is_number(v) for v in value) and len(value) == 2:
        return [sorted(map(float, value))]
    if len(value) == 1 and isinstance(value[0], list) and value[0] and isinstance(value[0][0], list):
        value = value[0]  # wrapped per trace
    return [sorted(map(float, r)) for r in value
            if isinstance(r, list) and len(r) == 2 and all(map(_is_number, r))]


def frozen(brush: dict[str, list] | None) -> Brush:
    """The brush as memoised figures take it."""
    return tuple(sorted((key, tuple((float(lo), float(hi)) for lo, hi in ranges))
                        for key, ranges in (brush or {}).items() if ranges))


@functools.lru_cache(maxsize=8)
def selected(snap: Snapshot, brush: Brush) -> frozenset[int] | None:
    """The numbers of the trials inside every brushed range: those with a value
    (completed, and pruned or stopped at the value they ended with), over the
    whole study; None without a brush."""
    if not brush:
        return None
    trials = [t for t in snap.trials if t.state in _VALUED and t.value is not None
              and math.isfinite(t.value)]
    keep = np.ones(len(trials), bool)
    axes = {f"param:{c.name}": c for c in coordinates(snap)}
    for key, ranges in brush:
        if key == f"metric:{snap.metric}":
            drawn = np.fromiter((t.value for t in trials), float, len(trials))
        elif key in axes:
            name = axes[key].name
            drawn = axes[key].encode([t.params.get(name, INACTIVE) for t in trials])
        else:
            continue  # an axis the study no longer has
        inside = np.zeros(len(trials), bool)
        for low, high in ranges:
            inside |= (drawn >= low) & (drawn <= high)
        keep &= inside
    return frozenset(t.number for t, k in zip(trials, keep) if k)


def described(brush: Brush) -> str:
    """The brushed axes' names, for a note: ``lr, accuracy``."""
    return ", ".join(key.split(":", 1)[1] for key, _ in brush)
