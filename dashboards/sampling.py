"""Which trials a view draws: the completed ones best first, and deterministic
samples of a large study that always keep its best trials.

Large studies are sampled server-side: at most a few thousand points or lines
are sent, and the title says how many of how many
(:func:`sampled_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpo.dashboards.data import Snapshot, TrialView
from hpo.store.records import TrialStatus

__all__ = ["completed", "spread", "sample", "sampled_note", "BEST_SHARE"]

BEST_SHARE = 10  # a sample keeps the best 1/BEST_SHARE of its room for the best trials


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


def sample(best_first: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` of ``best_first`` (ranked): the best tenth of the room,
    then an even sample of the others by trial number; every one when they fit."""
    if len(best_first) <= limit:
        return list(best_first)
    by_number = sorted(best_first, key=lambda t: t.number)
    return spread(by_number, limit, keep=best_first[: max(limit // BEST_SHARE, 1)])


def sampled_note(shown: int, total: int, what: str = "completed trials") -> str:
    """What a sampled figure shows, for its title; empty when nothing was left out."""
    if shown >= total:
        return ""
    best = max(shown // BEST_SHARE, 1)
    return f"showing {shown} of {total} {what}: the best {best} and an even sample of the rest"
