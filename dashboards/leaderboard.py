"""The leaderboard: one row per trial, best first; sorted, filtered and paged
server-side so that a 100,000-trial study sends one page to the browser.

``query`` understands the filter expressions Dash's DataTable writes
(``{col} > 3 && {state} contains COMPLETE``), so the table's own header
filters work unchanged with ``filter_action="custom"``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import html
import io
import math
import re
from numbers import Real
from typing import Any

from hpo.dashboards.data import Snapshot, TrialView
from hpo.results import StudyResult, TrialRecord
from hpo.units import format_value

__all__ = ["columns", "rows", "page_rows", "ranks", "tooltips", "query", "parse_filter", "html_table",
           "state_counts", "restrict", "to_csv", "export_csv"]

ERROR_CHARS = 160


@functools.lru_cache(maxsize=4)
def columns(snap: Snapshot) -> tuple[dict[str, str], ...]:
    """DataTable columns; parameters get ids ``param_<i>`` (names may hold anything)."""
    fixed = [("rank", "rank", "numeric"), ("trial", "trial", "numeric"), ("state", "state", "text"),
             ("value", snap.metric, "numeric")]
    fixed += [(f"value_{i}", name, "numeric") for i, (name, _) in enumerate(snap.objectives) if i]
    params = [(f"param_{i}", name, _kind(snap, name)) for i, name in enumerate(snap.param_names)]
    tail = [("duration_s", "duration (s)", "numeric"), ("attempts", "attempts", "numeric"),
            ("steps", "steps", "numeric"), ("host", "host", "text"), ("error", "error", "text")]
    return tuple({"id": i, "name": n, "type": k, **(_FORMATS.get(i.split("_")[0], {}) if k == "numeric"
                                                    else {})} for i, n, k in fixed + params + tail)


# Six significant digits in the table; sorting and filtering use the full value.
_FORMAT = {"format": {"specifier": ".6~g"}}
# An inactive parameter reads "-", as in hpo status; its data stays None, so it
# sorts last, "is blank" finds it and the CSV leaves it empty. (DataTable formats
# number columns only: an inactive categorical parameter's cell stays blank.)
_FORMATS: dict[str, dict[str, Any]] = {"value": _FORMAT, "param": {"format": {**_FORMAT["format"], "nully": "-"}}}


def _kind(snap: Snapshot, name: str) -> str:
    if _declared_numeric((snap.spec.get("space") or {}).get(name)):
        return "numeric"  # no need to look at every trial (100,000 at start-up)
    values = [t.params[name] for t in snap.trials if name in t.params]
    # No value yet (the page's frame, before the store is read): as declared.
    return "numeric" if values and all(_is_number(v) for v in values) else "text"


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _declared_numeric(declared: Any) -> bool:
    """Whether the space declares only numbers: a numeric range, or numeric choices."""
    choices = declared if isinstance(declared, list) else \
        declared.get("choices") if isinstance(declared, dict) else None
    if isinstance(choices, list):
        return bool(choices) and all(map(_is_number, choices))
    return isinstance(declared, dict) and _is_number(declared.get("low")) and _is_number(declared.get("high"))


@functools.lru_cache(maxsize=4)
def rows(snap: Snapshot) -> tuple[dict[str, Any], ...]:
    """Every trial as a table row, in rank order."""
    row = _row_maker(snap)
    return tuple(row(t) for t in snap.ranked)


def page_rows(snap: Snapshot, start: int, stop: int) -> list[dict[str, Any]]:
    """Rows ``start`` to ``stop`` in rank order, built alone: the first page of
    an unsorted, unfiltered table needs no other row."""
    shown = snap.ranked[start:stop]
    if snap.objectives:  # Pareto ranks: the whole front decides them
        rank_of = ranks(snap)
    else:  # a rank is a place in the ranking: no need to number 100,000 trials
        rank_of = {t.number: r for i, t in enumerate(shown, start)
                   if (r := snap.result.rank_of(i, t)) is not None}
    row = _row_maker(snap, rank_of)
    return [row(t) for t in shown]


def _row_maker(snap: Snapshot, rank_of: dict[int, int] | None = None):
    names = snap.param_names
    params_at = 4 + max(0, len(snap.objectives) - 1)  # after the objectives' columns
    numeric = {n: c["type"] == "numeric" for n, c in zip(names, columns(snap)[params_at:])}
    rank_of = ranks(snap) if rank_of is None else rank_of

    def row(t: TrialView) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": t.number, "rank": rank_of.get(t.number), "trial": t.number, "state": t.state.value,
            "value": _number(t.value),
            "duration_s": None if t.duration_s is None else round(t.duration_s, 1),
            "attempts": t.attempt, "steps": t.steps, "host": t.host or "",
            "error": (t.error or "")[:ERROR_CHARS],
        }
        for i, value in enumerate((t.values or [])[1:], start=1):
            out[f"value_{i}"] = _number(value)
        for i, name in enumerate(names):
            param = t.params.get(name)
            out[f"param_{i}"] = param if numeric[name] or param is None else str(param)
        return out
    return row


def tooltips(snap: Snapshot, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DataTable ``tooltip_data`` for ``shown`` rows: the whole error, which the cell cuts."""
    by_number = snap.by_number
    out = []
    for row in shown:
        error = by_number[row["trial"]].error if row["trial"] in by_number else None
        out.append({"error": {"value": error + "\n\n(click the row for the traceback)",
                              "type": "text"}} if error else {})
    return out


@functools.lru_cache(maxsize=4)
def ranks(snap: Snapshot) -> dict[int, int]:
    """Trial number -> rank, as ``hpo status`` shows it: only completed trials
    have one (a failed trial is not 12th of anything)."""
    return snap.result.ranks()  # multi-objective: the Pareto rank


def _number(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


# ------------------------------------------------------------------ querying

_TERM = re.compile(
    r"""\s*\{(?P<col>[^}]+)\}\s*
        (?P<op>s<=|s>=|s!=|s=|s<|s>|<=|>=|!=|=|<|>|eq|ne|lt|le|gt|ge
            |icontains|scontains|contains|idatestartswith|datestartswith|is\ blank|is\ nil)
        \s*(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`|[^&|]*?)?\s*$""",
    re.VERBOSE)
_ALIASES = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
            "s=": "=", "s!=": "!=", "s<": "<", "s>": ">", "s<=": "<=", "s>=": ">="}


def parse_filter(expression: str | None) -> list[tuple[str, str, str]]:
    """``{col} op value && ...`` as ``(column, op, value)`` terms.

    Raises
    ------
    ValueError
        For a term it does not understand (the table shows no rows then).
    """
    terms = []
    for part in (expression or "").split(" && "):
        if not part.strip():
            continue
        match = _TERM.match(part)
        if not match:
            raise ValueError(f"filter {part.strip()!r} not understood (write e.g. > 0.9, "
                             "= adam, contains FAILED)")
        value = (match["value"] or "").strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        terms.append((match["col"], _ALIASES.get(match["op"], match["op"]), value))
    return terms


def _matches(cell: Any, op: str, value: str) -> bool:
    if op in ("is blank", "is nil"):
        return cell is None or cell == ""
    if cell is None:
        return False
    if op in ("contains", "scontains"):
        return value in str(cell)
    if op == "icontains":
        return value.lower() in str(cell).lower()
    if op in ("datestartswith", "idatestartswith"):
        return str(cell).startswith(value)
    number = _as_float(value)
    left: Any  # numbers, or text
    right: Any
    if isinstance(cell, Real) and not isinstance(cell, bool) and number is not None:
        left, right = float(cell), number
    else:
        left, right = str(cell), value
        if op == "=" and isinstance(cell, str):
            left, right = left.lower(), right.lower()
    return {"=": left == right, "!=": left != right, "<": left < right, "<=": left <= right,
            ">": left > right, ">=": left >= right}[op]


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def query(table: tuple[dict[str, Any], ...] | list[dict[str, Any]], sort_by: list[dict] | None = None,
          filter_query: str | None = None,
          cols: tuple[dict[str, str], ...] | None = None) -> list[dict[str, Any]]:
    """The rows that pass ``filter_query``, ordered by ``sort_by`` (DataTable's
    ``[{"column_id": ..., "direction": "asc"|"desc"}]``); blanks sort last.

    With ``cols`` (:func:`columns`), a comparison of a numeric column with
    text is refused (ValueError) rather than matching nothing."""
    selected = list(table)
    terms = parse_filter(filter_query)
    if cols is not None:
        _check_terms(terms, cols)
    for column, op, value in terms:
        selected = [r for r in selected if _matches(r.get(column), op, value)]
    for key in reversed(sort_by or []):
        column, descending = key["column_id"], key.get("direction") == "desc"
        present = [r for r in selected if r.get(column) is not None and r.get(column) != ""]
        blank = [r for r in selected if r.get(column) is None or r.get(column) == ""]
        present.sort(key=lambda r: _sort_key(r[column]), reverse=descending)
        selected = present + blank
    return selected


def _check_terms(terms: list[tuple[str, str, str]], cols: tuple[dict[str, str], ...]) -> None:
    by_id = {c["id"]: c for c in cols}
    for column, op, value in terms:
        col = by_id.get(column)
        if col is None:
            raise ValueError(f"no column {column!r} to filter on")
        if col["type"] == "numeric" and op in ("=", "!=", "<", "<=", ">", ">=") \
                and _as_float(value) is None:
            raise ValueError(f"{col['name']}: {value!r} is not a number (write e.g. > 0.9, <= 10, "
                             "= 3)")


def _sort_key(cell: Any) -> tuple:
    # Numbers before text, so a mixed column still sorts.
    if isinstance(cell, Real) and not isinstance(cell, bool):
        return (0, float(cell), "")
    return (1, 0.0, str(cell))


# ------------------------------------------------------------------ static HTML

def html_table(snap: Snapshot, limit: int = 500) -> str:
    """The best ``limit`` trials as an HTML table, every cell escaped."""
    cols = columns(snap)
    table = rows(snap)
    head = "".join(f"<th>{html.escape(str(c['name']))}</th>" for c in cols)
    body = "\n".join(
        "<tr>" + "".join(f"<td class=\"{c['type']}\">{html.escape(_cell(row.get(c['id'])))}</td>"
                         for c in cols) + "</tr>"
        for row in table[:limit])
    more = (f"<p class=\"note\">The best {limit} of {len(table)} trials; "
            f"<code>hpo export {html.escape(snap.run_dir)}</code> lists them all.</p>"
            if len(table) > limit else "")
    return f"<table class=\"leaderboard\"><thead><tr>{head}</tr></thead>\n<tbody>{body}</tbody></table>{more}"


def _cell(value: Any) -> str:
    return format_value(value, 6)


# ------------------------------------------------------------------ state filter, selection, CSV

@functools.lru_cache(maxsize=4)
def state_counts(snap: Snapshot) -> tuple[tuple[str, int], ...]:
    """``(state, trials)`` for each state some trial is in, in the states' order
    (memoised: every page of the table asks)."""
    return tuple((state, n) for state, n in snap.result.counts.items() if n)


def restrict(table: tuple[dict[str, Any], ...] | list[dict[str, Any]], hidden: set[str],
             selected: frozenset[int] | None) -> list[dict[str, Any]]:
    """The rows not in a ``hidden`` state and, with ``selected``, among those trials."""
    return [r for r in table if r["state"] not in hidden
            and (selected is None or r["trial"] in selected)]


def to_csv(table: list[dict[str, Any]], cols: tuple[dict[str, str], ...]) -> str:
    """Rows as CSV under the table's headers, values in full (not as shown rounded)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([c["name"] for c in cols])
    writer.writerows([["" if row.get(c["id"]) is None else row[c["id"]] for c in cols] for row in table])
    return out.getvalue()


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord))


@functools.lru_cache(maxsize=2)
def export_csv(snap: Snapshot) -> str:
    """Every trial as ``hpo export --format csv`` writes it; from plain
    records, as the export reads them: the CSV copies each trial whole first,
    and a view's reports, allocations and distributions doubled the time."""
    records = [TrialRecord(**{name: getattr(t, name) for name in _RECORD_FIELDS}) for t in snap.trials]
    return StudyResult(snap.name, snap.metric, snap.direction, records, snap.stop,
                       objectives=list(snap.objectives)).to_csv()
