"""``hpo dashboard``: the Dash app. Wiring only; the views are built elsewhere.

Every ``refresh_s`` seconds the page asks the server whether the store
changed (a stat of the journal); only then is the snapshot re-read, and only
the visible tab is redrawn. The leaderboard is sorted, filtered and paged on
the server, so the browser receives one page of rows.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import dash
from dash import Input, Output, State, dash_table, dcc, html

from hpo.dashboards import leaderboard
from hpo.dashboards.data import StoreReader
from hpo.dashboards.views import VIEWS, summary

__all__ = ["make_app", "PAGE_SIZE"]

PAGE_SIZE = 50
_GRAPH_CONFIG = {"displaylogo": False, "responsive": True}


def make_app(reader: StoreReader, refresh_s: float = 5.0) -> dash.Dash:
    """The dashboard of the study ``reader`` reads."""
    snap = reader.snapshot()
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
        style_data_conditional=[
            {"if": {"filter_query": f'{{state}} = "{state}"', "column_id": "state"},
             "color": colour} for state, colour in (("FAILED", "#d62728"), ("TIMEOUT", "#9467bd"),
                                                    ("PRUNED", "#ff7f0e"))],
    )
    # The tabs only choose; the active view is built into "view" on the server
    # and arrives with its figure (no hidden graphs waiting for an update).
    tabs = [dcc.Tab(label="Leaderboard", value="leaderboard")]
    tabs += [dcc.Tab(label=v.label, value=v.key) for v in VIEWS]
    board = html.Div(id="board", children=[
        html.P("Every trial, best first. Click a header to sort (shift-click for several), "
               "type in the row under it to filter (e.g. > 0.9, adam, FAILED).", className="what"),
        table])
    app.layout = html.Div(style={"fontFamily": "system-ui, sans-serif", "margin": "0 1em"}, children=[
        html.H2(f"hpo: {snap.name}", style={"marginBottom": "0.2em"}),
        html.Div(id="summary", style={"color": "#555", "marginBottom": "0.6em"}),
        dcc.Interval(id="tick", interval=int(refresh_s * 1000)),
        dcc.Store(id="version"),
        dcc.Tabs(id="tabs", value="leaderboard", children=tabs),
        board,
        dcc.Loading(html.Div(id="view"), delay_show=300),
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
                  Input("tabs", "value"), Input("version", "data"))
    def _show(tab: str, _: Any):
        view = next((v for v in VIEWS if v.key == tab), None)
        if view is None:
            return [], {"display": "block"}
        figure = view.figure(reader.snapshot())  # memoised per snapshot: tab switches are cheap
        return [html.P(view.what, className="what"),
                dcc.Graph(id=f"graph-{view.key}", figure=figure, config=_GRAPH_CONFIG)], \
            {"display": "none"}

    @app.callback(Output("leaderboard", "data"), Output("leaderboard", "page_count"),
                  Output("leaderboard", "columns"),
                  Input("leaderboard", "page_current"), Input("leaderboard", "page_size"),
                  Input("leaderboard", "sort_by"), Input("leaderboard", "filter_query"),
                  Input("version", "data"))
    def _page(page: int | None, size: int | None, sort_by: list | None, filter_query: str | None,
              _: Any):
        snap = reader.snapshot()
        size = size or PAGE_SIZE
        try:
            selected = leaderboard.query(leaderboard.rows(snap), sort_by, filter_query)
        except ValueError:
            selected = []  # a filter the table cannot apply shows nothing, as native filtering does
        page = page or 0
        pages = max(1, -(-len(selected) // size))
        return (selected[page * size:(page + 1) * size], pages, list(leaderboard.columns(snap)))


def warm_up() -> None:
    """Import now what drawing imports lazily: Plotly's pandas check and
    optuna.importance (which pulls scikit-learn in). The server answers
    callbacks on several threads, and two threads importing one module at the
    same moment can see it half-initialised."""
    import optuna.importance  # noqa: F401
    from _plotly_utils.optional_imports import get_module

    get_module("pandas")


def serve(app: dash.Dash, host: str, port: int) -> None:
    """Serve until interrupted; one line per request would drown the terminal."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    warm_up()
    # The store just read (millions of objects for 100,000 trials) lives as long
    # as the server: keep the cyclic collector from rescanning it, which took
    # seconds at a time in the middle of drawing a view.
    gc.freeze()
    app.run(host=host, port=port, debug=False)
