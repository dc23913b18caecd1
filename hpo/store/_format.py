"""Optuna's journal format, in one place: its op codes by name, the fields
each kind of record carries, the records hpo writes, and readers of their
fields.

Every other module of the store speaks of records through this one; it is
also the only one that imports Optuna's private journal modules (Optuna
does not re-export :class:`JournalOperation` or the snapshot base class).
Tested against Optuna's own replay in ``tests/test_journal_format.py``.
"""

from __future__ import annotations

import enum
import json
import re
from datetime import UTC, datetime
from typing import Any

import optuna
from optuna.distributions import distribution_to_json

__all__ = ["Op", "FIELDS", "JournalSnapshot", "op_of", "encode_records", "record_starts",
           "creation_ops", "trial_system_attr", "intermediate_value", "trial_state",
           "trial_creation", "study_attrs", "trial_attrs", "reported", "last_trial_system_attrs"]


class Op(enum.IntEnum):
    """Optuna's op codes (``optuna.storages.journal._storage.JournalOperation``)."""

    CREATE_STUDY = 0
    DELETE_STUDY = 1
    SET_STUDY_USER_ATTR = 2
    SET_STUDY_SYSTEM_ATTR = 3
    CREATE_TRIAL = 4
    SET_TRIAL_PARAM = 5
    SET_TRIAL_STATE_VALUES = 6
    SET_TRIAL_INTERMEDIATE_VALUE = 7
    SET_TRIAL_USER_ATTR = 8
    SET_TRIAL_SYSTEM_ATTR = 9
    DISCARD_TRIALS = 10


def _optuna_ops() -> dict[str, int] | None:
    """Optuna's own op codes, where its private module still holds them."""
    try:
        from optuna.storages.journal._storage import JournalOperation
    except ImportError:
        return None
    return {op.name: int(op.value) for op in JournalOperation}


def _check_ops() -> None:
    """Refuse to run with an Optuna that numbers its records otherwise, or
    knows records hpo does not: every record read or written would mean
    something else. (An older Optuna may know fewer.)"""
    theirs = _optuna_ops()
    ours = {op.name: int(op.value) for op in Op}
    if theirs is not None and any(ours.get(name) != code for name, code in theirs.items()):
        raise ImportError(f"Optuna {optuna.__version__} numbers its journal records otherwise than "
                          f"hpo knows ({theirs} against {ours}).\n  fix: install the Optuna this hpo "
                          "supports (see its pyproject.toml)")


_check_ops()

# Optuna does not re-export the base class of a journal snapshot.
from optuna.storages.journal._base import BaseJournalSnapshot as JournalSnapshot  # noqa: E402

# The fields Optuna's replay reads from each kind of record, besides "worker_id".
FIELDS: dict[Op, tuple[str, ...]] = {
    Op.CREATE_STUDY: ("study_name", "directions"), Op.DELETE_STUDY: ("study_id",),
    Op.SET_STUDY_USER_ATTR: ("study_id", "user_attr"), Op.SET_STUDY_SYSTEM_ATTR: ("study_id", "system_attr"),
    Op.CREATE_TRIAL: ("study_id", "datetime_start"),
    Op.SET_TRIAL_PARAM: ("trial_id", "param_name", "param_value_internal", "distribution"),
    Op.SET_TRIAL_STATE_VALUES: ("trial_id", "state", "values"),
    Op.SET_TRIAL_INTERMEDIATE_VALUE: ("trial_id", "step", "intermediate_value"),
    Op.SET_TRIAL_USER_ATTR: ("trial_id", "user_attr"), Op.SET_TRIAL_SYSTEM_ATTR: ("trial_id", "system_attr"),
    Op.DISCARD_TRIALS: (),
}
# The records that number studies and trials: replay gives ids by their order.
creation_ops = frozenset({Op.CREATE_STUDY, Op.CREATE_TRIAL})
_OP_CODE = re.compile(rb'\{"op_code":(\d+),')
_JSON = json.JSONEncoder(separators=(",", ":")).encode
_OP_BY_CODE = {int(op): op for op in Op}


# -- reading ------------------------------------------------------------------------


def op_of(record: dict[str, Any]) -> Op | None:
    """The op code of a record, or None when it has none this Optuna knows."""
    code = record.get("op_code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return _OP_BY_CODE.get(code)  # not Op(code): the relay asks this of every record


def record_starts(data: bytes, start: int, stop: int) -> list[int]:
    """The op codes of the record starts still recognisable in ``data[start:stop]``."""
    return [int(code) for code in _OP_CODE.findall(data, start, stop)]


def study_attrs(record: dict[str, Any]) -> dict[str, Any]:
    """The study attributes a SET_STUDY_*_ATTR record sets ({} when none)."""
    attrs = record.get("user_attr" if op_of(record) == Op.SET_STUDY_USER_ATTR else "system_attr")
    return attrs if isinstance(attrs, dict) else {}


def trial_attrs(record: dict[str, Any]) -> dict[str, Any]:
    """The trial attributes a SET_TRIAL_*_ATTR record sets ({} when none)."""
    attrs = record.get("user_attr" if op_of(record) == Op.SET_TRIAL_USER_ATTR else "system_attr")
    return attrs if isinstance(attrs, dict) else {}


def reported(record: dict[str, Any]) -> tuple[int, int] | None:
    """The trial id and step of an intermediate value's record, else None."""
    if op_of(record) != Op.SET_TRIAL_INTERMEDIATE_VALUE:
        return None
    return record["trial_id"], int(record["step"])


def last_trial_system_attrs(data: bytes, trial_id: int, keys: tuple[str, ...]) -> dict[str, Any]:
    """The last value set in the journal's ``data`` of each of trial
    ``trial_id``'s system attributes ``keys`` (those never set: absent).
    Only the lines naming a key are decoded, in hpo's compact form or in
    Optuna's own (``json.dumps``'s spaces); a torn line is skipped."""
    ids = (b'"trial_id":%d,' % trial_id, b'"trial_id": %d,' % trial_id)
    found: dict[str, Any] = {}
    for key in keys:
        mark = _JSON(key).encode()
        at = data.rfind(mark)
        while at >= 0:
            start, stop = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
            line = data[start:stop if stop >= 0 else len(data)]
            if any(i in line for i in ids):
                try:
                    record = json.loads(line)
                except ValueError:  # a torn line: Optuna's replay skips it too
                    record = {}
                attrs = trial_attrs(record) if op_of(record) == Op.SET_TRIAL_SYSTEM_ATTR else {}
                if record.get("trial_id") == trial_id and key in attrs:
                    found[key] = attrs[key]
                    break
            at = data.rfind(mark, 0, start)
    return found


# -- writing ------------------------------------------------------------------------


def trial_system_attr(worker_id: str, trial_id: int, key: str, value: Any) -> dict[str, Any]:
    """The record of one trial system attribute."""
    return {"op_code": Op.SET_TRIAL_SYSTEM_ATTR, "worker_id": worker_id, "trial_id": trial_id,
            "system_attr": {key: value}}


def intermediate_value(worker_id: str, trial_id: int, step: int, value: float) -> dict[str, Any]:
    """The record of one intermediate value."""
    return {"op_code": Op.SET_TRIAL_INTERMEDIATE_VALUE, "worker_id": worker_id, "trial_id": trial_id,
            "step": step, "intermediate_value": value}


def trial_state(worker_id: str, trial_id: int, state: optuna.trial.TrialState,
                values: list[float] | None) -> dict[str, Any]:
    """The record of a trial's state, with the time Optuna stamps on it
    (its start for RUNNING, its end for a final state)."""
    when = {"datetime_start": _now()} if state == optuna.trial.TrialState.RUNNING else (
        {"datetime_complete": _now()} if state.is_finished() else {})
    return {"op_code": Op.SET_TRIAL_STATE_VALUES, "worker_id": worker_id, "trial_id": trial_id,
            "state": state.value, "values": values, **when}


def trial_creation(worker_id: str, study_id: int, template: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The record creating a trial, as Optuna's JournalStorage writes it for
    a template with parameters (WAITING: not started)."""
    return {"op_code": Op.CREATE_TRIAL, "worker_id": worker_id, "study_id": study_id,
            "datetime_start": None,  # set when an attempt starts
            "state": template.state, "value": None, "values": None,
            "distributions": {k: distribution_to_json(d) for k, d in template.distributions.items()},
            "params": {k: template.distributions[k].to_internal_repr(v) for k, v in template.params.items()},
            "user_attrs": {}, "system_attrs": {}, "intermediate_values": {}}


def encode_records(records: list[dict[str, Any]]) -> bytes:
    """Journal lines for ``records``, as Optuna writes them (the two kinds a
    report is made of are formatted directly: the relay writes thousands a
    second)."""
    return "".join(map(_line, records)).encode()


def _line(record: dict[str, Any]) -> str:
    op = record["op_code"]
    if op == Op.SET_TRIAL_INTERMEDIATE_VALUE and len(record) == 5:
        return ('{"op_code":%d,"worker_id":%s,"trial_id":%d,"step":%d,"intermediate_value":%s}\n'
                % (op, _JSON(record["worker_id"]), record["trial_id"], record["step"],
                   _value(record["intermediate_value"])))
    if op == Op.SET_TRIAL_SYSTEM_ATTR and len(record) == 4 and len(record["system_attr"]) == 1:
        ((key, value),) = record["system_attr"].items()
        return ('{"op_code":%d,"worker_id":%s,"trial_id":%d,"system_attr":{%s:%s}}\n'
                % (op, _JSON(record["worker_id"]), record["trial_id"], _JSON(key), _value(value)))
    return _JSON(record) + "\n"


def _value(value: Any) -> str:
    """``_JSON(value)``, written directly for what a report holds: a finite
    number, or a flat object of them (JSON writes a finite float as its repr)."""
    kind = type(value)
    if kind is float and value - value == 0.0:
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    if kind is dict and all(type(k) is str and (type(v) is float and v - v == 0.0 or type(v) is int)
                            for k, v in value.items()):
        return "{%s}" % ",".join([_JSON(k) + ":" + repr(v) for k, v in value.items()])
    return _JSON(value)


def _now() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="microseconds")
