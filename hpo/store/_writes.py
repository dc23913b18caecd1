"""What a request of the store protocol writes, as journal records or as
calls on an Optuna storage.

A write is one of three small tuples: ``("attr", trial, key, value)`` (a
trial system attribute), ``("step", trial, step, value)`` (an intermediate
value) and ``("state", trial, status, values)`` (the trial's Optuna state: its
final one, RUNNING when an attempt starts, WAITING when it suspends). The
relay turns a round's writes into journal records and appends them in one
write; a trial process that cannot reach the relay appends the same records
itself, or makes the same calls on a database storage.
"""

from __future__ import annotations

from typing import Any

import optuna

from hpo.store._format import intermediate_value, trial_state, trial_system_attr
from hpo.store.records import (
    EVENT_ATTR,
    HEARTBEAT_ATTR,
    PROFILE_ATTR,
    REPORT_ATTR,
    RUN_ATTR,
    SEGMENT_ATTR,
    TrialStatus,
    report_key,
)

__all__ = ["Write", "writes_of", "journal_records", "apply_writes", "WORKER_KEYS"]

Write = tuple[str, int, Any, Any]

# The trial attributes an attempt may write with a ``note`` or ``event``.
WORKER_KEYS = (RUN_ATTR, PROFILE_ATTR, SEGMENT_ATTR, EVENT_ATTR)


def writes_of(request: dict[str, Any]) -> list[Write]:
    """The writes of a request (``start`` excepted: the relay builds its run
    record), which :func:`hpo.store._protocol.check_request` passed."""
    op, trial = request["op"], int(request["trial"])
    if op == "report":
        step = int(request["step"])
        writes: list[Write] = [("attr", trial, report_key(step), dict(request["metrics"]))]
        if request.get("value") is not None:
            writes.insert(0, ("step", trial, step, float(request["value"])))
        return writes
    if op == "beat":
        return [("attr", trial, HEARTBEAT_ATTR, float(request["now"]))]
    if op in ("note", "event"):
        key = str(request["key"])
        if not key.startswith(WORKER_KEYS) or key == REPORT_ATTR:
            raise ValueError(f"{key!r} is not an attribute a trial's attempt writes")
        return [("attr", trial, key, request["value"] if op == "note" else request["record"])]
    if op == "end":
        status = TrialStatus(request["status"])
        writes = [("attr", trial, RUN_ATTR, request["record"])]
        if request.get("segment"):
            key, record = request["segment"]
            writes.append(("attr", trial, str(key), record))
        values = request.get("values")  # floats, as Optuna stores them
        writes.append(("state", trial, status, None if values is None else [float(v) for v in values]))
        return writes
    if op == "give_up":
        key, event = request["event"]
        writes = [("attr", trial, str(key), event),
                  ("attr", trial, HEARTBEAT_ATTR, {"abandoned_at": float(request["now"])})]
        if request.get("record"):  # its final run record, where the attempt knows it
            writes.insert(0, ("attr", trial, RUN_ATTR, request["record"]))
        return writes
    if op == "poll":
        return []
    raise ValueError(f"unknown op {op!r}")


def journal_records(writes: list[Write], worker_id: str) -> list[dict[str, Any]]:
    """The writes as Optuna's JournalStorage would append them, issued by
    ``worker_id`` (not the master replica's own: its replay then drops a
    record on an ended trial quietly, as any other process's)."""
    records = []
    for kind, trial, a, b in writes:
        if kind == "attr":
            records.append(trial_system_attr(worker_id, trial, a, b))
        elif kind == "step":
            records.append(intermediate_value(worker_id, trial, a, b))
        else:
            records.append(trial_state(worker_id, trial, a.stored_as, b))
    return records


def apply_writes(storage: optuna.storages.BaseStorage, writes: list[Write]) -> bool:
    """Make the writes on a storage, in order; False when the trial had
    ended first (a finished trial never changes, and the first end wins).
    RUNNING on a trial that runs already changes nothing (Optuna says so)."""
    try:
        for kind, trial, a, b in writes:
            if kind == "attr":
                storage.set_trial_system_attr(trial, a, b)
            elif kind == "step":
                storage.set_trial_intermediate_value(trial, a, b)
            else:
                storage.set_trial_state_values(trial, a.stored_as, b)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True
