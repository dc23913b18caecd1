"""``hpo dashboard``: the Dash app. Wiring only; the views are built elsewhere.

Every ``refresh_s`` seconds the page asks the server whether the store
changed (a stat of the journal); only then is the snapshot re-read, and only
the visible tab is redrawn. The leaderboard is sorted, filtered and paged on
the server, so the browser receives one page of rows.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dash
from dash import Input, Output, State, dash_table, dcc, html

from hpo.dashboards import leaderboard, trial_page
from hpo.dashboards.analysis import import_importance
from hpo.dashboards.data import StoreReader
from hpo.dashboards.views import ALLOCATION, PARETO, VIEWS, summary, views_of

__all__ = ["make_app", "PAGE_SIZE"]

PAGE_SIZE = 50
_GRAPH_CONFIG = {"displaylogo": False, "responsive": True}
# A live refresh re-draws the open view; Dash's default hides it until the new
# one arrives, so a slow refresh blanked the page under the reader's eyes.
_STILL_SHOWN = {"visibility": "visible", "opacity": 0.6}


def make_app(reader: StoreReader, refresh_s: float = 5.0) -> dash.Dash:
    """The dashboard of the study ``reader`` reads. The page's frame comes from
    the study's settings, so it is served while the store is still being read;
    the callbacks that fill it wait for the read."""
    snap = reader.outline()
    app = dash.Dash(__name__, title=f"hpo: {snap.name}", update_title=None,
                    serve_locally=True)  # no CDN: compute clusters have no internet
    table = dash_table.DataTable(
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
    # The tabs only choose; the active view is built into "view" on the server
    # and arrives with its figure (no hidden graphs waiting for an update).
    tabs = [dcc.Tab(label="Leaderboard", value="leaderboard")]
    tabs += [dcc.Tab(label=v.label, value=v.key) for v in views_of(snap)]
    tabs.append(dcc.Tab(label="Trial", value="trial"))
    board = html.Div(id="board", children=[
        html.P("Every trial, best first. Click a header to sort (shift-click for several), "
               "type in the row under it to filter (e.g. > 0.9, adam, FAILED); click a row to "
               "open its trial.", className="what"),
        html.Div(id="filter-message", role="alert", style={"color": "#d62728", "minHeight": "1.2em"}),
        table])
    picker = html.Div(id="trial-picker", style={"display": "none", "margin": "0.6em 0"}, children=[
        html.Label(["Trial number ", dcc.Input(id="trial-number", type="number", min=0, step=1,
                                               debounce=True, style={"width": "7em"})])])
    app.layout = html.Div(style={"fontFamily": "system-ui, sans-serif", "margin": "0 1em"}, children=[
        html.H2(f"hpo: {snap.name}", style={"marginBottom": "0.2em"}),
        html.Div(id="summary", style={"color": "#555", "marginBottom": "0.6em"}),
        dcc.Interval(id="tick", interval=int(refresh_s * 1000)),
        dcc.Store(id="version"),
        dcc.Tabs(id="tabs", value="leaderboard", children=tabs),
        board,
        picker,
        dcc.Loading(html.Div(id="view"), delay_show=300, overlay_style=_STILL_SHOWN),
    ])
    _wire(app, reader)
    return app


def _wire(app: dash.Dash, reader: StoreReader) -> None:
    @app.callback(Output("version", "data"), Output("summary", "children"),
                  Input("tick", "n_intervals"), State("version", "data"))
    def _poll(_: Any, known: str | None):
        snap = reader.snapshot()  # re-reads only when the store's files changed
        text = summary(snap)
        return (dash.no_update if snap.version == known else snap.version), text

    @app.callback(Output("view", "children"), Output("board", "style"),
                  Output("trial-picker", "style"),
                  Input("tabs", "value"), Input("version", "data"), Input("trial-number", "value"))
    def _show(tab: str, _: Any, number: int | None):
        hidden, shown = {"display": "none"}, {"display": "block", "margin": "0.6em 0"}
        if tab == "trial":
            return trial_page.page(reader.snapshot(), number), hidden, shown
        view = next((v for v in (PARETO, *VIEWS, ALLOCATION) if v.key == tab), None)
        if view is None:
            return [], {"display": "block"}, hidden
        figure = view.figure(reader.snapshot())  # memoised per snapshot: tab switches are cheap
        return [html.P(view.what, className="what"),
                dcc.Graph(id=f"graph-{view.key}", figure=figure, config=_GRAPH_CONFIG)], \
            hidden, hidden

    @app.callback(Output("tabs", "value"), Output("trial-number", "value"),
                  Input("leaderboard", "active_cell"), prevent_initial_call=True)
    def _open_trial(cell: dict | None):
        if not cell or cell.get("row_id") is None:
            return dash.no_update, dash.no_update
        return "trial", int(cell["row_id"])

    @app.callback(Output("leaderboard", "data"), Output("leaderboard", "page_count"),
                  Output("leaderboard", "columns"), Output("leaderboard", "tooltip_data"),
                  Output("filter-message", "children"),
                  Input("leaderboard", "page_current"), Input("leaderboard", "page_size"),
                  Input("leaderboard", "sort_by"), Input("leaderboard", "filter_query"),
                  Input("version", "data"))
    def _page(page: int | None, size: int | None, sort_by: list | None, filter_query: str | None,
              _: Any):
        snap = reader.snapshot()
        size = size or PAGE_SIZE
        page = page or 0
        if not sort_by and not (filter_query or "").strip():  # rank order: build one page only
            shown = leaderboard.page_rows(snap, page * size, (page + 1) * size)
            return (shown, max(1, -(-len(snap.trials) // size)), list(leaderboard.columns(snap)),
                    leaderboard.tooltips(snap, shown), "")
        message = ""
        try:
            selected = leaderboard.query(leaderboard.rows(snap), sort_by, filter_query,
                                         leaderboard.columns(snap))
            if not selected and filter_query:
                message = "No trial matches the filter."
        except ValueError as exc:
            # Say why rather than show an empty table; the rows stay unfiltered.
            selected = leaderboard.query(leaderboard.rows(snap), sort_by, "")
            message = f"Filter not applied: {exc}; showing every trial."
        pages = max(1, -(-len(selected) // size))
        shown = selected[page * size:(page + 1) * size]
        return (shown, pages, list(leaderboard.columns(snap)), leaderboard.tooltips(snap, shown),
                message)


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
