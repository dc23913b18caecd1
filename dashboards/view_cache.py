"""The dashboard's snapshot beside the journal (``journal.log.views``): the
views of the trials finished at a journal record, and Optuna's replay state
there with those trials left out.

A finished trial never changes, so a cold reader takes its view from here
and lets Optuna replay only the records after the snapshot
(:func:`hpo.store.read_snapshot` checks that the journal still starts with what
the snapshot covers). Loading 100,000 views this way takes about a second;
replaying the journal and building the views again took ten.

The views are kept as tuples of plain values (a tuple loads many times
faster than a dataclass instance), their distributions as indices into one
table (a study has a handful of distinct ones).
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import optuna

from hpo.dashboards.data import TrialView
from hpo.store import Mark, StudyStore, read_snapshot, replay_dump, write_snapshot
from hpo.store.records import Cost, TrialStatus

__all__ = ["VIEWS_SNAPSHOT", "load", "save"]

VIEWS_SNAPSHOT = "views"
_FIELDS = tuple(f.name for f in dataclasses.fields(TrialView))
_COST_FIELDS = tuple(f.name for f in dataclasses.fields(Cost))
_STATUS = {s.value: s for s in TrialStatus}


def load(journal: str) -> tuple[tuple[Mark, bytes], dict[int, TrialView]] | None:
    """The snapshot's Optuna replay state (as :class:`~hpo.store.SnapshotJournal`
    takes it) and its finished trials' views by number; None when there is
    no snapshot that matches the journal and this code."""
    found = read_snapshot(journal, VIEWS_SNAPSHOT)
    if found is None:
        return None
    mark, payload = found
    try:
        data = pickle.loads(payload)
        if data["fields"] != (_FIELDS, _COST_FIELDS):  # TrialView changed since it was written
            return None
        views = [_view(row, data["distributions"]) for row in data["views"]]
        replay = data["replay"]
    except Exception:  # whatever is wrong with it, the journal is still there
        return None
    return (mark, replay), {v.number: v for v in views}


def save(journal: str, store: StudyStore, views: list[TrialView]) -> bool:
    """Write the snapshot of ``store`` as it stands, with the views of the
    trials finished in ``views`` (built from that state or an earlier one: a
    trial that finished since is kept in Optuna's state); False when it could
    not be written."""
    finished = [v for v in views if v.state.is_finished]
    if not isinstance(store.storage, optuna.storages.JournalStorage):
        raise RuntimeError("hpo internal error: a journal's store: the only one saved")
    dump = replay_dump(store.storage, store.study_id, {v.number for v in finished})
    if dump is None:
        return False
    mark, replay = dump
    table: dict[tuple, int] = {}
    rows = [_row(v, table) for v in finished]
    distributions = [dict(key) for key in table]
    payload = pickle.dumps({"fields": (_FIELDS, _COST_FIELDS), "replay": replay, "views": rows,
                            "distributions": distributions}, protocol=pickle.HIGHEST_PROTOCOL)
    return write_snapshot(journal, VIEWS_SNAPSHOT, mark, payload)


def _row(view: TrialView, table: dict[tuple, int]) -> tuple:
    fields = dict(view.__dict__)
    fields["state"] = view.state.value
    fields["cost"] = tuple(getattr(view.cost, name) for name in _COST_FIELDS)
    key = tuple(view.distributions.items())
    fields["distributions"] = table.setdefault(key, len(table))
    return tuple(fields[name] for name in _FIELDS)


def _view(row: tuple, distributions: list[dict[str, Any]]) -> TrialView:
    # Built without __init__: the row holds every field already checked once.
    fields = dict(zip(_FIELDS, row))
    fields["state"] = _STATUS[fields["state"]]
    cost = object.__new__(Cost)
    cost.__dict__.update(zip(_COST_FIELDS, fields["cost"]))
    fields["cost"] = cost
    fields["distributions"] = distributions[fields["distributions"]]
    view = object.__new__(TrialView)
    view.__dict__.update(fields)
    return view
