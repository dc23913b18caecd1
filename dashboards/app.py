"""``hpo dashboard``: the Dash app. Wiring only; the views are built elsewhere.

Every ``refresh_s`` seconds the page asks the server whether the store
changed (a stat of the journal); only then is the snapshot re-read, and only
the visible tab is redrawn. The leaderboard is sorted, filtered and paged on
the server, so the browser receives one page of rows. Several studies are
served by one app: a picker chooses the one shown, and a tab compares them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import dash
from dash import Input, Output, State, ctx, dash_table, dcc, html

from hpo.dashboards import compare, leaderboard, parallel, studies, trial_page
from hpo.dashboards.data import Snapshot, StoreReader
from hpo.dashboards.importance import import_importance
from hpo.dashboards.views import (
    COMPARE,
    GROUPS,
    LEADERBOARD,
    RESULTS,
    TRIAL,
    draw,
    picked,
    summary,
    tab_rows,
    view_of,
)
from hpo.store.records import TrialStatus

__all__ = ["make_app", "PAGE_SIZE", "CSV_ALL", "CSV_ALL_BUSY"]

PAGE_SIZE = 50
CSV_ALL, CSV_ALL_BUSY = "CSV: every trial (as hpo export)", "Writing the CSV of every trial…"
_GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "responsive": True}
# A live refresh re-draws the open view; Dash's default hides it until the new
# one arrives, so a slow refresh blanked the page under the reader's eyes.
_STILL_SHOWN = {"visibility": "visible", "opacity": 0.6}
_HIDDEN, _SHOWN = {"display": "none"}, {"display": "block", "margin": "0.6em 0"}
_STATES = [s.value for s in TrialStatus]
# Parallel coordinates: hovering a line makes Plotly emit a hover event without
# the "points" Dash's graph reads (a TypeError in the console at every line
# crossed); parcoords shows nothing on hover, so its picking layer takes no mouse.
_PAGE_CSS = ".js-plotly-plot .gl-canvas-pick { pointer-events: none !important; }"
# Tabs as wide as their labels (Dash shares the row out equally and cuts them).
_TAB = {"flex": "0 0 auto", "padding": "6px 14px", "lineHeight": "20px", "whiteSpace": "nowrap"}
_TAB_SELECTED = {**_TAB, "fontWeight": "bold"}
_GROUP = {"width": "6.5em", "flex": "0 0 auto", "color": "#555", "fontSize": 13,
          "textTransform": "uppercase", "letterSpacing": "0.04em"}


def make_app(readers: StoreReader | Sequence[StoreReader], refresh_s: float = 5.0) -> dash.Dash:
    """The dashboard of the studies ``readers`` read (one, or several with a
    picker). The page's frame comes from the studies' settings, so it is
    served while the stores are still being read; the callbacks that fill it
    wait for the read."""
    readers = [readers] if isinstance(readers, StoreReader) else list(readers)
    outlines = [r.outline() for r in readers]
    names = studies.labels([o.name for o in outlines], [r.run_dir.path for r in readers])
    snap = outlines[0]
    title = f"hpo: {snap.name}" if len(readers) == 1 else f"hpo: {len(readers)} studies"
    # update_title=None keeps the title while callbacks run (Dash's documentation); its annotation says str.
    app = dash.Dash(__name__, title=title, update_title=None,  # type: ignore[arg-type]
                    serve_locally=True,  # no CDN: compute clusters have no internet
                    suppress_callback_exceptions=True)  # the graphs come and go with their tabs
    picker = html.Div(id="study-row", style={"margin": "0.3em 0"} if len(readers) > 1 else _HIDDEN,
                      children=[html.Label(["Study ", dcc.Dropdown(
                          id="study", options=[{"label": n, "value": str(i)} for i, n in enumerate(names)],
                          value="0", clearable=False, style={"width": "32em", "display": "inline-block",
                                                             "verticalAlign": "middle"})])])
    app.layout = html.Div(style={"fontFamily": "system-ui, sans-serif", "margin": "0 1em"}, children=[
        html.H2(f"hpo: {snap.name}", id="title", style={"marginBottom": "0.2em"}),
        picker,
        html.Div(id="summary", style={"color": "#555", "marginBottom": "0.6em"}),
        # What the user's own code set on the study (optuna's study.set_user_attr).
        html.Details(id="study-attrs", style=_HIDDEN),
        dcc.Interval(id="tick", interval=int(refresh_s * 1000)),
        dcc.Store(id="version"), dcc.Store(id="tab", data=LEADERBOARD), dcc.Store(id="brush", data={}),
        # The frame's tabs, so a first read that finds the same ones redraws none.
        dcc.Store(id="tab-keys", data=_keys(tab_rows(snap, len(readers)))),
        html.Nav(id="tab-rows", children=_tab_rows(snap, len(readers))),
        _board(snap),
        html.Div(id="trial-picker", style=_HIDDEN, children=[html.Label([
            "Trial number ", dcc.Input(id="trial-number", type="number", min=0, step=1, debounce=True,
                                       style={"width": "7em"})])]),
        _axis_picker(),
        dcc.Loading(html.Div(id="view"), delay_show=300, overlay_style=_STILL_SHOWN),
    ])
    app.index_string = app.index_string.replace("{%css%}", "{%css%}\n<style>" + _PAGE_CSS + "</style>")
    _wire(app, readers, names)
    return app


def _tab_rows(snap: Snapshot, count: int) -> list[html.Div]:
    """A row of tabs per group, its name on the left: every view one click
    away, and no row long enough to wrap."""
    rows = []
    for group, tabs in tab_rows(snap, count):
        value = LEADERBOARD if group == RESULTS else _none(group)
        rows.append(html.Div(className="tab-row", style={"display": "flex", "alignItems": "center"},
                             children=[html.Span(group, className="tab-group", style=_GROUP),
                                       dcc.Tabs(id=_tabs_id(group), value=value, children=_tabs(tabs),
                                                style={"flex": "1 1 auto"})]))
    return rows


def _keys(rows: list[tuple[str, list[tuple[str, str]]]]) -> list[list[str]]:
    return [[key for key, _ in tabs] for _, tabs in rows]


def _tabs(tabs: list[tuple[str, str]]) -> list[dcc.Tab]:
    return [dcc.Tab(label=label, value=key, style=_TAB, selected_style=_TAB_SELECTED)
            for key, label in tabs]


def _tabs_id(group: str) -> str:
    return f"tabs-{group.lower()}"


def _none(group: str) -> str:
    """The value of a row whose tabs are all unselected (Dash would select its first)."""
    return f"none-{group.lower()}"


def _board(snap: Snapshot) -> html.Div:
    """The leaderboard, its state filter, selection note and CSV downloads."""
    # dash.dash_table's __init__ is marked `# type: ignore`: mypy sees none of its components.
    table = dash_table.DataTable(  # type: ignore[attr-defined]
        id="leaderboard", columns=list(leaderboard.columns(snap)), data=[],
        page_action="custom", page_current=0, page_size=PAGE_SIZE,
        sort_action="custom", sort_mode="multi", sort_by=[],
        filter_action="custom", filter_query="",
        style_table={"overflowX": "auto"}, style_as_list_view=True,
        style_cell={"fontFamily": "system-ui, sans-serif", "fontSize": 13, "padding": "3px 8px",
                    "maxWidth": 360, "overflow": "hidden", "textOverflow": "ellipsis"},
        style_header={"fontWeight": "bold", "backgroundColor": "#f3f3f3"},
        # The full error on hover (the cell is cut); the whole traceback is on the trial page.
        tooltip_data=[], tooltip_duration=None, tooltip_delay=300,
        css=_TABLE_CSS + _right_packed(leaderboard.columns(snap)),
        style_data_conditional=[
            {"if": {"filter_query": f'{{state}} = "{state}"', "column_id": "state"},
             "color": colour} for state, colour in (("FAILED", "#d62728"), ("TIMEOUT", "#9467bd"),
                                                    ("PRUNED", "#ff7f0e"))],
    )
    button = {"marginLeft": "0.6em", "fontSize": 13}
    return html.Div(id="board", children=[
        html.P("Every trial, best first. Click a header to sort (shift-click for several), "
               "type in the row under it to filter (e.g. > 0.9, adam, FAILED); click a row to "
               "open its trial.", className="what"),
        html.Div(style={"display": "flex", "flexWrap": "wrap", "alignItems": "center", "gap": "0.4em"},
                 children=[
                     html.Span("States shown:", style={"color": "#555"}),
                     dcc.Checklist(id="states", options=[], value=_STATES, inline=True,
                                   inputStyle={"marginRight": "0.25em"},
                                   labelStyle={"marginRight": "0.9em"}),
                     html.Span(style={"flex": "1 1 auto"}),
                     # Its label apart: Dash sets only one property of a component while it runs.
                     html.Button(html.Span(CSV_ALL, id="csv-all-label"), id="csv-all", style=button),
                     html.Button("CSV: the rows shown", id="csv-shown", style=button),
                     dcc.Download(id="download")]),
        html.Div(id="brush-note", style=_HIDDEN, children=[
            html.Span(id="brush-text"),
            html.Button("Clear the selection", id="brush-clear", style={"marginLeft": "0.6em"})]),
        html.Div(id="filter-message", role="alert", style={"color": "#d62728", "minHeight": "1.2em"}),
        table])


def _axis_picker() -> html.Div:
    drop = {"width": "16em", "display": "inline-block", "verticalAlign": "middle"}
    return html.Div(id="axis-picker", style=_HIDDEN, children=[
        html.Label(["x axis ", dcc.Dropdown(id="axis-x", clearable=False, style=drop)],
                   style={"marginRight": "1.5em"}),
        html.Label(["y axis ", dcc.Dropdown(id="axis-y", clearable=False, style=drop)])])


def _wire(app: dash.Dash, readers: list[StoreReader], names: list[str]) -> None:
    def reader(study: str | None) -> StoreReader:
        return readers[int(study or 0)]

    @app.callback(Output("version", "data"), Output("summary", "children"),
                  Output("title", "children"), Output("states", "options"),
                  Output("study-attrs", "style"), Output("study-attrs", "children"),
                  Input("tick", "n_intervals"), Input("study", "value"),
                  State("version", "data"), State("tab", "data"))
    def _poll(_: Any, study: str | None, known: str | None, tab: str | None):
        snap = reader(study).snapshot()  # re-reads only when the store's files changed
        version = f"{study}:{snap.version}"
        if tab == COMPARE:  # the other studies' news too
            version += "".join(f"|{r.snapshot().version}" for r in readers)
        options = [{"label": f"{state} {n}", "value": state}
                   for state, n in leaderboard.state_counts(snap)]
        if version == known:
            return dash.no_update, summary(snap), f"hpo: {snap.name}", options, *(dash.no_update,) * 2
        return version, summary(snap), f"hpo: {snap.name}", options, *_study_attrs(snap)

    @app.callback(*[Output(_tabs_id(g), "children") for g in GROUPS], Output("tab-keys", "data"),
                  Input("version", "data"), State("study", "value"), State("tab-keys", "data"),
                  prevent_initial_call=True)
    def _rows(_: Any, study: str | None, known: list | None):
        rows = tab_rows(reader(study).snapshot(), len(readers))
        keys = _keys(rows)
        if keys == known:
            return (*[dash.no_update] * len(rows), dash.no_update)
        return (*[_tabs(tabs) for _, tabs in rows], keys)

    @app.callback(*[Output(_tabs_id(g), "value") for g in GROUPS], Output("tab", "data"),
                  Output("trial-number", "value"),
                  *[Input(_tabs_id(g), "value") for g in GROUPS],
                  Input("leaderboard", "active_cell"), State("tab", "data"),
                  prevent_initial_call=True)
    def _select(*args: Any):
        *values, cell, current = args
        number: Any = dash.no_update  # a trial's number, or no change
        if ctx.triggered_id == "leaderboard":
            if not cell or cell.get("row_id") is None:
                return (*[dash.no_update] * len(GROUPS), dash.no_update, dash.no_update)
            chosen, number = TRIAL, int(cell["row_id"])
        else:
            chosen = values[[_tabs_id(g) for g in GROUPS].index(ctx.triggered_id)]
            if chosen is None or chosen.startswith("none-"):
                chosen = current or LEADERBOARD
        group = _group_of(chosen)
        return (*[chosen if g == group else _none(g) for g in GROUPS], chosen, number)

    @app.callback(Output("view", "children"), Output("board", "style"),
                  Output("trial-picker", "style"), Output("axis-picker", "style"),
                  Output("axis-x", "options"), Output("axis-x", "value"),
                  Output("axis-y", "options"), Output("axis-y", "value"),
                  Input("tab", "data"), Input("version", "data"), Input("trial-number", "value"),
                  Input("axis-x", "value"), Input("axis-y", "value"),
                  State("study", "value"), State("brush", "data"))
    def _show(tab: str | None, _: Any, number: int | None, x: str | None, y: str | None,
              study: str | None, brush: dict | None):
        keep = (dash.no_update,) * 4
        if tab == TRIAL:
            return (trial_page.page(reader(study).snapshot(), number), _HIDDEN, _SHOWN, _HIDDEN, *keep)
        if tab == COMPARE:
            figure = compare.compare(tuple(r.snapshot() for r in readers), tuple(names))
            return ([html.P(_COMPARED, className="what"), _graph(COMPARE, figure)],
                    _HIDDEN, _HIDDEN, _HIDDEN, *keep)
        view = view_of(tab or "")
        if view is None:
            return [], {"display": "block"}, _HIDDEN, _HIDDEN, *keep
        snap = reader(study).snapshot()
        x, y = picked(view, snap, x, y)
        figure = draw(view, snap, x, y, _ranges(brush, study))  # memoised per snapshot
        shown = [html.P(view.what, className="what"), _graph(view.key, figure)]
        if view.axes is None:
            return shown, _HIDDEN, _HIDDEN, _HIDDEN, *keep
        options = [{"label": n, "value": n} for n in view.axes(snap)]
        return shown, _HIDDEN, _HIDDEN, _SHOWN, options, x, options, y

    # Two callbacks: Dash fires none whose inputs are not all on the page, and
    # the parallel coordinates' graph is there only while its tab is open.
    @app.callback(Output("brush", "data"), Input("graph-parallel", "restyleData"),
                  State("brush", "data"), State("study", "value"), prevent_initial_call=True)
    def _brush(restyle: list | None, brush: dict | None, study: str | None):
        ranges = (brush or {}).get("ranges", {}) if (brush or {}).get("study") == study else {}
        changed = parallel.brushed(ranges, restyle, reader(study).snapshot())
        return dash.no_update if changed == ranges else {"study": study, "ranges": changed}

    @app.callback(Output("brush", "data", allow_duplicate=True), Input("brush-clear", "n_clicks"),
                  Input("study", "value"), prevent_initial_call=True)
    def _unbrush(_: Any, __: Any):
        return {}  # cleared, or another study

    @app.callback(Output("leaderboard", "data"), Output("leaderboard", "page_count"),
                  Output("leaderboard", "columns"), Output("leaderboard", "tooltip_data"),
                  Output("filter-message", "children"), Output("brush-note", "style"),
                  Output("brush-text", "children"),
                  Input("leaderboard", "page_current"), Input("leaderboard", "page_size"),
                  Input("leaderboard", "sort_by"), Input("leaderboard", "filter_query"),
                  Input("version", "data"), Input("states", "value"), Input("brush", "data"),
                  State("study", "value"))
    def _page(page: int | None, size: int | None, sort_by: list | None, filter_query: str | None,
              _: Any, shown_states: list | None, brush: dict | None, study: str | None):
        snap = reader(study).snapshot()
        size, page = size or PAGE_SIZE, page or 0
        cols = list(leaderboard.columns(snap))
        frozen = _ranges(brush, study)
        note = (_SHOWN, f"Showing the {len(parallel.selected(snap, frozen) or ())} trials selected in the "
                        f"parallel coordinates ({parallel.described(frozen)}).") if frozen else (_HIDDEN, "")
        if not sort_by and not (filter_query or "").strip() and not _hidden(snap, shown_states) \
                and not frozen:  # rank order: build one page only
            rows = leaderboard.page_rows(snap, page * size, (page + 1) * size)
            return (rows, max(1, -(-len(snap.trials) // size)), cols, leaderboard.tooltips(snap, rows),
                    "", *note)
        selected, message = _table(snap, sort_by, filter_query, shown_states, frozen)
        rows = selected[page * size:(page + 1) * size]
        return (rows, max(1, -(-len(selected) // size)), cols, leaderboard.tooltips(snap, rows),
                message, *note)

    # Every trial takes seconds at 100,000 of them: the button says it is at work.
    @app.callback(Output("download", "data"), Input("csv-all", "n_clicks"), State("study", "value"),
                  running=[(Output("csv-all", "disabled"), True, False),
                           (Output("csv-all-label", "children"), CSV_ALL_BUSY, CSV_ALL)],
                  prevent_initial_call=True)
    def _download_all(_: Any, study: str | None):
        snap = reader(study).snapshot()  # what hpo export --format csv writes
        return dcc.send_string(leaderboard.export_csv(snap), f"{snap.name}.csv", type="text/csv")

    @app.callback(Output("download", "data", allow_duplicate=True), Input("csv-shown", "n_clicks"),
                  State("study", "value"), State("leaderboard", "sort_by"),
                  State("leaderboard", "filter_query"), State("states", "value"), State("brush", "data"),
                  prevent_initial_call=True)
    def _download_shown(_: Any, study: str | None, sort_by: list | None, filter_query: str | None,
                        shown_states: list | None, brush: dict | None):
        snap = reader(study).snapshot()
        selected, _ = _table(snap, sort_by, filter_query, shown_states, _ranges(brush, study))
        return dcc.send_string(leaderboard.to_csv(selected, leaderboard.columns(snap)),
                               f"{snap.name}-shown.csv", type="text/csv")


def _table(snap: Snapshot, sort_by: list | None, filter_query: str | None,
           shown_states: list | None, brush: parallel.Brush) -> tuple[list[dict[str, Any]], str]:
    """Every row the table shows (all pages) and a message about its filter."""
    table = leaderboard.restrict(leaderboard.rows(snap), _hidden(snap, shown_states),
                                 parallel.selected(snap, brush))
    try:
        selected = leaderboard.query(table, sort_by, filter_query, leaderboard.columns(snap))
    except ValueError as exc:
        # Say why rather than show an empty table; the rows stay unfiltered.
        return leaderboard.query(table, sort_by, ""), f"Filter not applied: {exc}; showing every trial."
    return selected, ("No trial matches the filter." if not selected and filter_query else "")


def _ranges(brush: dict | None, study: str | None) -> parallel.Brush:
    """The brushed ranges, when they were brushed on this study (the store
    may still hold another study's for a moment after a switch)."""
    brush = brush or {}
    return parallel.frozen(brush.get("ranges")) if brush.get("study") == study else ()


def _hidden(snap: Snapshot, shown_states: list | None) -> set[str]:
    """The states some trial is in that the state filter leaves out."""
    shown = set(_STATES if shown_states is None else shown_states)
    return {state for state, _ in leaderboard.state_counts(snap) if state not in shown}


def _study_attrs(snap: Snapshot) -> tuple[dict[str, str], list[Any]]:
    """The study attributes panel (folded): shown only where the user's code set some."""
    if not snap.user_attrs:
        return _HIDDEN, []
    return _SHOWN, [html.Summary(f"Study attributes ({len(snap.user_attrs)})"),
                    trial_page.attributes_table(snap.user_attrs, "study-attrs-table")]


def _group_of(key: str) -> str:
    view = view_of(key)
    return view.group if view is not None else RESULTS  # leaderboard, trial, compare


def _graph(key: str, figure: Any) -> dcc.Graph:
    return dcc.Graph(id=f"graph-{key}", figure=figure, config=_GRAPH_CONFIG)


_COMPARED = ("Each study's best value so far by trial number, and the share of its completed "
             "trials at or below each value; click a study in the legend to hide it.")

# Sort arrows after the header's name, on its side of a right-aligned column
# (before it, each arrow seemed to belong to the column on its left).
_TABLE_CSS = [
    {"selector": "th.dash-header > div", "rule": "display: flex; flex-direction: row-reverse; "
                                                 "justify-content: flex-end; gap: 0.3em;"},
    {"selector": "th.dash-header[data-dash-column] .column-header-name", "rule": "flex: 0 1 auto;"},
    {"selector": "td.dash-cell", "rule": "cursor: pointer;"},
]


def _right_packed(columns: tuple[dict[str, str], ...]) -> list[dict[str, str]]:
    """Numeric headers sit at the right, over their right-aligned numbers."""
    return [{"selector": f'th.dash-header[data-dash-column="{c["id"]}"] > div',
             "rule": "justify-content: flex-start;"} for c in columns if c["type"] == "numeric"]


def warm_up() -> None:
    """Import now what drawing imports lazily: Plotly's pandas check and
    optuna.importance (which pulls scikit-learn in). The server answers
    callbacks on several threads, and two threads importing one module at the
    same moment can see it half-initialised."""
    from _plotly_utils.optional_imports import get_module

    get_module("pandas")
    import_importance()


# optuna.importance takes a second to import (holding the interpreter): this
# long after the store is read, once the first page is drawn, not before
# (the importance view imports it itself if asked for sooner).
_WARM_UP_AFTER_S = 3.0


def warm_up_later() -> None:
    """Import what the importance view needs, in the background, a little later."""
    warmer = threading.Timer(_WARM_UP_AFTER_S, import_importance)
    warmer.daemon = True
    warmer.start()


def serve(app: dash.Dash, host: str, port: int) -> None:
    """Serve until interrupted; one line per request would drown the terminal,
    and the banners of Dash and Flask would repeat the URL ``hpo dashboard``
    printed already, with a "development server" warning that does not apply
    to a read-only page on 127.0.0.1."""
    import flask.cli

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("dash.dash").setLevel(logging.WARNING)
    flask.cli.show_server_banner = lambda *args, **kwargs: None
    from _plotly_utils.optional_imports import get_module

    get_module("pandas")  # cheap, and every figure asks
    app.run(host=host, port=port, debug=False)
