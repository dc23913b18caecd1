"""``hpo report``: every view in one self-contained HTML file.

Plotly's JavaScript is embedded once, in the first figure; nothing is fetched
when the file is opened, so it can be copied off a cluster without network
access and opened anywhere. Everything placed in the HTML is escaped.
"""

from __future__ import annotations

import html
import itertools
from pathlib import Path

import plotly.graph_objects as go

from hpo.dashboards import leaderboard
from hpo.dashboards.data import Snapshot, load_snapshot
from hpo.dashboards.views import PARETO, View, summary, views_of
from hpo.store import gc_paused

__all__ = ["build_report", "write_report"]

LEADERBOARD_ROWS = 500
FAILURES = 50

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
p.summary, p.what, p.note { color: #555; }
nav a { margin-right: 1em; }
table.leaderboard { border-collapse: collapse; font-size: 0.85em; }
table.leaderboard th, table.leaderboard td { border: 1px solid #ddd; padding: 2px 6px; }
table.leaderboard th { background: #f3f3f3; position: sticky; top: 0; }
td.numeric { text-align: right; font-variant-numeric: tabular-nums; }
div.scroll { max-height: 40em; overflow: auto; }
pre.traceback { background: #f6f6f6; border: 1px solid #ddd; padding: 0.5em; font-size: 0.8em;
                white-space: pre-wrap; max-height: 30em; overflow: auto; }
details { margin: 0.3em 0; }
"""


def build_report(snap: Snapshot) -> str:
    """The report as one HTML document."""
    esc = html.escape
    nav = " ".join(f'<a href="#{key}">{esc(label)}</a>'
                   for key, label in [("leaderboard", "Leaderboard")] +
                   [(v.key, v.label) for v in views_of(snap)] + [("failures", "Failures")])
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>hpo report: {esc(snap.name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Study {esc(snap.name)}</h1>",
        f"<p class=\"summary\">{esc(summary(snap))}</p>",
        f"<p class=\"summary\">Run directory {esc(snap.run_dir)}; {esc(_metrics_text(snap))}."
        f"</p><nav>{nav}</nav>",
        "<section id=\"leaderboard\"><h2>Leaderboard</h2>",
        f"<div class=\"scroll\">{leaderboard.html_table(snap, LEADERBOARD_ROWS)}</div></section>",
    ]
    first = True
    for view in views_of(snap):
        divs = []
        for n, figure in enumerate(_figures(snap, view)):
            # Plotly's JavaScript inline once, in the first figure; the others reuse it.
            divs.append(figure.to_html(full_html=False, include_plotlyjs=first,
                                       div_id=f"plot-{view.key}" + (f"-{n}" if n else ""),
                                       config={"displaylogo": False, "responsive": True}))
            first = False
        front = (f"<pre>{esc(snap.result.pareto_table())}</pre>" if view is PARETO else "")
        parts.append(f"<section id=\"{view.key}\" class=\"view\"><h2>{esc(view.label)}</h2>"
                     f"<p class=\"what\">{esc(view.what)}</p>{''.join(divs)}{front}</section>")
    parts.append(_failures(snap))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _figures(snap: Snapshot, view: View) -> list[go.Figure]:
    """What the report draws of a view. A file has no axis menus: the Pareto
    front of three or more objectives is drawn on every pair of them."""
    if view is PARETO and len(snap.objectives) > 2:
        if view.axes is None:
            raise RuntimeError("hpo internal error: PARETO's")
        return [view.figure(snap, x, y) for x, y in itertools.combinations(view.axes(snap), 2)]
    return [view.figure(snap)]


def _metrics_text(snap: Snapshot) -> str:
    if not snap.objectives:
        return f"metric {snap.metric} ({snap.direction})"
    return "objectives " + ", ".join(f"{m} ({d})" for m, d in snap.objectives)


def _failures(snap: Snapshot) -> str:
    """Each failed attempt's error and whole traceback (the leaderboard has one line)."""
    esc = html.escape
    failed = [t for t in snap.trials if t.error or any(p.get("error") for p in t.previous)]
    items = []
    for t in failed[:FAILURES]:
        attempts = [(p.get("attempt"), p.get("error") or {}) for p in t.previous if p.get("error")]
        if t.error:
            attempts.append((t.attempt, {"message": t.error, "traceback": t.traceback}))
        for attempt, error in attempts:
            line = error.get("message") if "type" not in error else f"{error['type']}: {error.get('message')}"
            items.append(f"<details><summary>trial {t.number} ({esc(t.state.value.lower())}), attempt "
                         f"{esc(str(attempt))}: {esc(str(line))}</summary><pre class=\"traceback\">"
                         f"{esc(error.get('traceback') or '(no traceback was recorded)')}</pre></details>")
    more = (f"<p class=\"note\">The first {FAILURES} of {len(failed)} trials with errors; "
            f"<code>hpo status {esc(snap.run_dir)} --trial N</code> shows any of them.</p>"
            if len(failed) > FAILURES else "")
    body = "\n".join(items) or "<p class=\"what\">No trial failed.</p>"
    return (f"<section id=\"failures\"><h2>Failures</h2><p class=\"what\">Each error in full, "
            f"with its traceback (click a line to open it).</p>{body}{more}</section>")


def write_report(run_dir: str | Path, output: str | Path) -> Path:
    """Read ``run_dir`` once and write its report to ``output``."""
    output = Path(output)
    with gc_paused():  # one pass that makes no cyclic garbage: skip the collector's rescans
        text = build_report(load_snapshot(run_dir))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    return output
