"""Colours, safe text and the empty-view figure shared by every view."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from hpo.store.records import RETRIED, TrialStatus

__all__ = ["STATE_COLOURS", "HIGHLIGHTS", "RETRIED", "plain", "short", "message_figure",
           "base_layout", "menu", "y_scale_menu"]

# One colour per status, and one for earlier attempts (failed or lost, retried).
STATE_COLOURS = {
    TrialStatus.COMPLETE.value: "#2ca02c",
    TrialStatus.PRUNED.value: "#ff7f0e",
    TrialStatus.STOPPED.value: "#bcbd22",
    TrialStatus.FAILED.value: "#d62728",
    TrialStatus.TIMEOUT.value: "#9467bd",
    TrialStatus.CANCELLED.value: "#7f7f7f",
    TrialStatus.RUNNING.value: "#1f77b4",
    TrialStatus.SUSPENDED.value: "#17becf",
    TrialStatus.PENDING.value: "#c7c7c7",
    RETRIED: "#8c564b",
}

# The best trials drawn over the others: dark, dashed differently, and none of
# them a state colour (a green "best" line would read as "completed").
HIGHLIGHTS = (("#000000", "solid"), ("#3b2f8f", "dash"), ("#000000", "dot"),
              ("#3b2f8f", "dashdot"), ("#000000", "longdash"))


def menu(buttons: list[dict[str, Any]], x: float = 1.0, y: float = 1.13,
         direction: str = "left", active: int = 0) -> dict[str, Any]:
    """A row of buttons (or a dropdown) in the figure itself: it works in the
    dashboard and in the static report alike, without a server."""
    return {"type": "buttons" if direction == "left" else "dropdown", "direction": direction,
            "buttons": buttons, "x": x, "y": y, "xanchor": "right", "yanchor": "bottom",
            "showactive": True, "active": active, "pad": {"r": 2, "t": 2},
            "bgcolor": "#f3f3f3", "font": {"size": 12}}


def y_scale_menu(**place: Any) -> dict[str, Any]:
    """Linear / log buttons for the y axis."""
    return menu([{"label": "linear y", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                 {"label": "log y", "method": "relayout", "args": [{"yaxis.type": "log"}]}], **place)


def short(value: Any, limit: int) -> str:
    """``value`` as text of at most ``limit`` characters."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain(value: Any, limit: int | None = None) -> str:
    """``value`` as text Plotly shows literally.

    Plotly renders a subset of HTML in labels and hover text (``<b>``, ``<a
    href>``...); a parameter value or an error message is user data, so its
    ``<`` and ``&`` become entities, which Plotly displays as the characters.
    """
    return html.escape(str(value) if limit is None else short(value, limit), quote=False)


def base_layout(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0.01}, "template": "plotly_white",
            "margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "height": 480,
            # Zoom and legend choices survive a live refresh of the figure.
            "uirevision": "keep", **extra}


def message_figure(title: str, message: str) -> go.Figure:
    """A view with nothing to draw yet says why, in the plot area."""
    fig = go.Figure(layout=base_layout(title))
    fig.add_annotation(text=plain(message), showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font={"size": 16, "color": "#555"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig
