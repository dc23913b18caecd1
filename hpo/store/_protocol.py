"""The store protocol: what a trial's process says to the study's relay, and
what each answer promises (version 1).

A study has one reader and one sequencer: the relay in the master process
(:mod:`hpo.store._relay`). Workers and trial processes hold no Optuna storage;
they speak this protocol over TCP (over a Unix socket on the master's own
host: :func:`local_socket_name`) and get back, with each acknowledgement,
what their trial must do next.

Frames
    A 4-byte big-endian length, then that many bytes of UTF-8 JSON holding one
    object. A request frame is at most ``MAX_REQUEST`` bytes; the relay closes
    a connection that announces more, before reading it.

Handshake
    The client's first frame is ``{"hello": TOKEN, "v": VERSION}`` with the
    study's secret token (it travels in the storage URL the tasks get, see
    :func:`relay_url`). The relay answers ``{"v": VERSION, "epoch": E}``, ``E``
    being the master's lease epoch, or closes the connection: a wrong token,
    another version, or nothing within ``HELLO_TIMEOUT_S``.

Requests
    ``{"id": N, "op": OP, "trial": TRIAL_ID, "run": TOKEN, ...}``: ``id`` is the
    client's, echoed in the answer; ``trial`` is a trial the master handed out
    in a task; ``run`` names the attempt (or segment) the request belongs to,
    a random token the worker chose when it started it. The ops:

    ``start``   ``where`` (host, pid, cpus, GPU ids...), ``now``, ``gpus``,
                ``knows`` ([reports, segments] the task carried): begin an
                attempt or a segment. Answered at once, before its record is
                written: ``{"run": RUN_RECORD, "reports": [...], "segments":
                [...]}`` (the ones the task did not know), or a halt. The record
                is durable before any later answer on that trial.
    ``report``  ``step``, ``metrics``, ``value`` (the study's metric or null):
                one step's metrics.
    ``beat``    ``now``: the attempt is alive.
    ``event``   ``key``, ``record``: one decision the worker took (records.py).
    ``note``    ``key``, ``value``: a trial attribute the worker owns (its
                profile: ``hpo:profile:*``).
    ``end``     ``status``, ``values``, ``record`` (the final run record),
                ``segment`` (optional ``[key, record]``): the attempt's end; a
                SUSPENDED status leaves the trial to be resumed. A client on
                the relay's host (its Unix socket) may send it without
                waiting for the answer, marked ``"posted": true``: the relay
                may hold it some 10 ms to write it with the next request,
                and the master settles it before it reads the trial
                (``StudyRelay.settle``).
    ``give_up`` ``record`` (or null), ``event`` (``[key, record]``), ``now``:
                the attempt ends without a result; the trial is resumed at once.
    ``poll``    nothing is written; the answer carries the decision. Without
                ``run``, it only says whether the trial is still unfinished
                (``ok``) or ended (a halt).

Answers
    ``{"id": N, "ok": true, ...}`` once the request's records are durable
    (fsync'd), ``start`` excepted (above). Every answer but ``start``'s
    carries the trial's :class:`Decision` as of the round that wrote it.
    ``{"id": N, "ok": false, "halt": WHY}``: the request was refused and
    nothing was written, because the trial ended (``"ended"``, with its
    ``status`` and ``value``), another attempt took it over (``"superseded"``),
    or it is not a trial of this run (``"unknown"``); the attempt must stop
    and its result does not count. ``{"id": N, "ok": false, "error":
    "malformed request: FIELD: WHY"}``: the request breaks the rules below
    (``id`` is null where the request's was not an integer); it alone is
    refused, nothing is written, and the relay goes on. A frame that is not
    a JSON object, or is nested too deep to read, closes its connection.
    An ``end`` answered ``"won": true`` is the trial's stored end.

Fields
    What each field may hold is :data:`REQUESTS` (per op) and ``_COMMON``
    (every op), below; :func:`check_request` applies it, at the relay and
    on a trial's process before it writes around the relay. What may be
    stored follows Optuna's rules and hpo's own ``trial.report``: a step is
    an int in [0, 2**31) (Optuna's RDB column), a report's metrics a flat
    object of finite numbers, an intermediate value a finite number, an
    ``end``'s ``values`` one finite number per objective (COMPLETE: needed;
    PRUNED, STOPPED: optional; FAILED, TIMEOUT, CANCELLED, SUSPENDED: none),
    records JSON objects whose typed fields (``_RUN``, ``_EVENT``,
    ``_SEGMENT``, ``_PROFILE``) hold what their readers compute with, nested
    at most ``MAX_DEPTH`` deep. An attribute's key names its record: exactly
    ``hpo:run`` (with the request's own ``run`` token), ``hpo:profile:<GPUs>``,
    ``hpo:segment:<index>``, ``hpo:event:<ns>-<pid>``.

Every request is idempotent (a report, a note, an event or a beat written
twice stores the same thing; a second end loses to the first), so a client
that got no answer sends it again, to the relay or straight to the journal.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any

from hpo.store.records import EVENT_ATTR, PROFILE_ATTR, RUN_ATTR, SEGMENT_ATTR, TrialStatus

__all__ = ["VERSION", "MAX_REQUEST", "MAX_ANSWER", "HELLO_TIMEOUT_S", "RELAY_MARK", "Decision",
           "Halted", "split_relay", "relay_url", "encode", "decode", "read_frame", "Frames",
           "FrameTooLarge", "HEADER", "local_socket_name", "REQUESTS", "MAX_DEPTH", "MAX_STEP",
           "MalformedRequest",
           "check_request"]

VERSION = 1
HEADER = struct.Struct("!I")
MAX_REQUEST = 4 << 20  # a report is small; a final record with a long traceback is not huge
MAX_ANSWER = 256 << 20  # a start's answer may carry a long trial's reports
HELLO_TIMEOUT_S = 10.0
RELAY_MARK = "#hpo-relay="

# -- what a request may hold ----------------------------------------------------------

MAX_STEP = 2 ** 31  # Optuna's RDB storage keeps a step in a 32-bit Integer column
MAX_DEPTH = 32  # a record nested deeper could not be written back (Python's recursion limit)
_MAX_INT = 2 ** 63  # what JSON readers and databases hold as an integer
_MAX_TOKEN = 256

# A check returns why its value is refused, or None.
Check = Callable[[Any], "str | None"]


class MalformedRequest(ValueError):
    """A request that breaks :data:`REQUESTS`: refused alone, nothing written."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")


def _int(low: int, end: int) -> Check:
    bounds = f"[{_power(low)}, {_power(end)})"

    def check(value: Any) -> str | None:
        if type(value) is int and low <= value < end:
            return None
        return f"must be an integer in {bounds}, not {_shown(value)}"
    return check


def _power(bound: int) -> str:
    size = abs(bound)
    text = f"2**{size.bit_length() - 1}" if size > 1024 and size & (size - 1) == 0 else str(size)
    return f"-{text}" if bound < 0 else text


def _finite(value: Any) -> str | None:
    if type(value) is float:
        return None if value - value == 0.0 else f"must be a finite number, not {value}"
    if type(value) is int and -_MAX_INT < value < _MAX_INT:
        return None
    return f"must be a finite number, not {_shown(value)}"


def _amount(value: Any) -> str | None:
    """A count of CPUs or GPUs (a share of one GPU included)."""
    why = _finite(value)
    return why if why is not None or value >= 0 else f"must be >= 0, not {value}"


def _number(value: Any) -> str | None:
    """A number as Python's JSON writes it (NaN and infinities included)."""
    return None if type(value) is float else _finite(value)


def _text(value: Any) -> str | None:
    return None if type(value) is str else f"must be a string, not {_shown(value)}"


def _flag(value: Any) -> str | None:
    return None if type(value) is bool else f"must be true or false, not {_shown(value)}"


def _token(value: Any) -> str | None:
    if type(value) is str and 0 < len(value) <= _MAX_TOKEN:
        return None
    return f"must be a string of 1 to {_MAX_TOKEN} characters, not {_shown(value)}"


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _either(*checks: Check) -> Check:
    def check(value: Any) -> str | None:
        whys = [check(value) for check in checks]
        return None if None in whys else " or ".join(why for why in whys if why is not None)
    return check


def _numbers_by_name(number: Check) -> Check:
    """A flat object of names to numbers."""
    def check(value: Any) -> str | None:
        if type(value) is not dict:
            return f"must be an object of names to numbers, not {_shown(value)}"
        for name, item in value.items():
            why = number(item)
            if why is not None:
                return f"{name!r} {why}"
        return None
    return check


def _list_of(item: Check) -> Check:
    def check(value: Any) -> str | None:
        if type(value) is not list:
            return f"must be a list, not {_shown(value)}"
        for index, element in enumerate(value):
            why = item(element)
            if why is not None:
                return f"[{index}] {why}"
        return None
    return check


def _record(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    """A JSON object holding the ``required`` fields, whose ``fields`` (when
    present) pass their checks; other fields hold any JSON, at most
    ``MAX_DEPTH`` deep."""
    def check(value: Any) -> str | None:
        if type(value) is not dict:
            return f"must be an object, not {_shown(value)}"
        for name in required:
            if name not in value:
                return f"needs {name}"
        for name, field_check in fields.items():
            if name in value:
                why = field_check(value[name])
                if why is not None:
                    return f"{name} {why}"
        return None if _depth_within(value, MAX_DEPTH) else f"is nested over {MAX_DEPTH} deep"
    return check


def _depth_within(value: Any, left: int) -> bool:
    if type(value) is dict:
        return left > 0 and all(_depth_within(item, left - 1) for item in value.values())
    if type(value) is list:
        return left > 0 and all(_depth_within(item, left - 1) for item in value)
    return True


def _shown(value: Any) -> str:
    """A refused value, in a few words (a container is never printed: it
    may be nested too deep to)."""
    if type(value) is list:
        return f"a list of {len(value)}"
    if type(value) is dict:
        return f"an object of {len(value)} fields"
    if type(value) is str and len(value) > 40:
        return repr(value[:37]) + "..."
    return "null" if value is None else repr(value)


_STEP = _int(0, MAX_STEP)
_COUNT = _int(0, _MAX_INT)
_TIME = _finite  # seconds since the epoch
_OPTIONAL_TEXT, _OPTIONAL_COUNT = _optional(_text), _optional(_COUNT)
_OPTIONAL_TIME, _OPTIONAL_NUMBER = _optional(_TIME), _optional(_number)
_METRICS = _numbers_by_name(_finite)  # what trial.report sends (it drops the rest)

# The typed fields of the records (records.py): what the store and its
# readers compute with. A null field is an unknown one.
_ERROR = _record({"type": _OPTIONAL_TEXT, "message": _OPTIONAL_TEXT, "traceback": _OPTIONAL_TEXT,
                  "errno": _optional(_int(-_MAX_INT, _MAX_INT)), "filename": _OPTIONAL_TEXT,
                  "staging": _optional(_record({}))})
_ATTEMPT = _record({"attempt": _OPTIONAL_COUNT, "pid": _OPTIONAL_COUNT, "host": _OPTIONAL_TEXT,
                    "started_at": _OPTIONAL_TIME, "ended_at": _OPTIONAL_TIME,
                    "core_seconds": _OPTIONAL_TIME, "gpu_seconds": _OPTIONAL_TIME,
                    "error": _optional(_ERROR)})
_RUN = _record({
    "token": _token, "host": _OPTIONAL_TEXT, "pid": _OPTIONAL_COUNT, "in_master": _optional(_flag),
    "attempt": _COUNT, "segment": _int(-1, _MAX_INT), "cpus": _optional(_amount),
    "gpus": _optional(_either(_list_of(_either(_text, _COUNT)), _amount)),
    "started_at": _TIME, "attempt_started_at": _TIME, "segment_started_at": _TIME,
    "ended_at": _OPTIONAL_TIME, "duration_s": _TIME, "core_seconds": _TIME, "gpu_seconds": _TIME,
    # the last metrics as the objective returned them: NaN or infinite included
    "metrics": _optional(_numbers_by_name(_number)), "error": _optional(_ERROR),
    "stop_reason": _OPTIONAL_TEXT, "timed_out": _optional(_flag), "suspended": _optional(_flag),
    "previous": _list_of(_ATTEMPT),
})
_EVENT = _record({"time": _TIME, "kind": _text, "step": _optional(_STEP), "reason": _OPTIONAL_TEXT,
                  "host": _OPTIONAL_TEXT})
_SEGMENT = _record({
    "index": _COUNT, "pid": _OPTIONAL_COUNT, "started_at": _TIME, "ended_at": _TIME,
    "first_step": _optional(_STEP), "last_step": _optional(_STEP), "outcome": _OPTIONAL_TEXT,
    "quanta": _OPTIONAL_COUNT, "convergence": _OPTIONAL_NUMBER, "loss": _OPTIONAL_NUMBER,
    "quantum_s": _OPTIONAL_NUMBER, "quantum_steps": _OPTIONAL_NUMBER, "save_s": _number,
    "restore_s": _number, "checkpoint_bytes": _COUNT,
})
_PROFILE = _record({"rate": _amount, "unit": _OPTIONAL_TEXT, **{name: _OPTIONAL_NUMBER for name in (
    "batches", "averaged", "batch_s", "at", "first_batch_at", "gpu_count", "gpu_share")}},
    required=("rate",))
_WHERE = _RUN  # a start's place goes into its run record as it is


def _knows(value: Any) -> str | None:
    if type(value) is list and len(value) == 2:
        return _list_of(_COUNT)(value)
    return f"must be [reports, segments], not {_shown(value)}"


_END_STATUSES = {status.value for status in TrialStatus if status.is_finished} | {"SUSPENDED"}


def _status(value: Any) -> str | None:
    if type(value) is str and value in _END_STATUSES:
        return None
    return f"must be one of {sorted(_END_STATUSES)}, not {_shown(value)}"


def _pair(value: Any) -> str | None:
    ok = type(value) is list and len(value) == 2 and type(value[0]) is str
    return None if ok else f"must be [key, record], not {_shown(value)}"


# op -> field -> what it may hold (a field left out of a request is null).
REQUESTS: dict[str, dict[str, Check]] = {
    "start": {"where": _WHERE, "now": _TIME, "gpus": _amount, "knows": _optional(_knows)},
    "report": {"step": _STEP, "metrics": _METRICS, "value": _optional(_finite)},
    "beat": {"now": _TIME},
    "event": {"key": _text, "record": _record({})},  # the key names the record: _attribute
    "note": {"key": _text, "value": _record({})},
    "end": {"status": _status, "values": _optional(_list_of(_finite)), "record": _RUN,
            "segment": _optional(_pair)},
    "give_up": {"record": _optional(_RUN), "event": _pair, "now": _TIME},
    "poll": {},
}
# Every op's (``run`` may be left out of a poll only).
_COMMON: dict[str, Check] = {"id": _optional(_COUNT), "trial": _COUNT, "run": _token}


def check_request(message: dict[str, Any]) -> None:
    """Raise :class:`MalformedRequest` unless ``message`` holds what
    :data:`REQUESTS` allows (the number of an end's values is the relay's
    to check: it knows the study's objectives)."""
    op = message.get("op")
    if type(op) is not str or op not in REQUESTS:
        raise MalformedRequest("op", f"must be one of {sorted(REQUESTS)}, not {_shown(op)}")
    fields = REQUESTS[op]
    get = message.get
    for name, check in _COMMON.items():
        why = check(get(name))
        if why is not None and not (name == "run" and op == "poll" and get(name) is None):
            raise MalformedRequest(name, why)
    for name, check in fields.items():
        why = check(get(name))
        if why is not None:
            raise MalformedRequest(name, why)
    together = _TOGETHER.get(op)
    if together is not None:
        together(message)


def _attribute(field: str, key: str, record: Any, run: str, prefixes: tuple[str, ...]) -> None:
    """An attribute a trial's attempt writes: its key names its record."""
    check = _attribute_check(key, prefixes)
    if check is None:
        raise MalformedRequest(field, f"{_shown(key)} is not an attribute a trial's attempt writes")
    why = check(record)
    if why is not None:
        raise MalformedRequest(field, f"{key} {why}")
    if check is _RUN:
        _carries(field, record, run)


def _carries(field: str, run_record: dict[str, Any], run: str) -> None:
    """A run record names the attempt that wrote it: the relay fences by it."""
    if run_record.get("token") != run:
        raise MalformedRequest(field, "a run record must carry its attempt's token")


def _attribute_check(key: str, prefixes: tuple[str, ...]) -> Check | None:
    prefix = next((p for p in prefixes if key.startswith(p)), None)
    rest = key[len(prefix):] if prefix is not None else ""
    if prefix == RUN_ATTR:
        return _RUN if not rest else None
    if prefix == SEGMENT_ATTR:
        return _SEGMENT if rest.isascii() and rest.isdigit() else None
    if prefix == EVENT_ATTR:
        pid = rest.partition("-")[2]
        return _EVENT if rest.partition("-")[0].isdigit() and pid.isdigit() and rest.isascii() else None
    if prefix == PROFILE_ATTR:
        return _PROFILE if _gpu_count(rest) else None
    return None


def _gpu_count(text: str) -> bool:
    try:
        count = float(text)
    except ValueError:
        return False
    return math.isfinite(count) and count >= 0 and text.isascii()


_ATTRIBUTES = (RUN_ATTR, PROFILE_ATTR, SEGMENT_ATTR, EVENT_ATTR)


def _note(message: dict[str, Any]) -> None:
    field = "value" if message["op"] == "note" else "record"
    _attribute(field, message["key"], message[field], message["run"], _ATTRIBUTES)


def _end(message: dict[str, Any]) -> None:
    status, values = message["status"], message.get("values")
    if status == TrialStatus.COMPLETE.value and not values:
        raise MalformedRequest("values", "a COMPLETE trial needs its values")
    if values is not None and status not in _VALUED:
        raise MalformedRequest("values", f"a {status} trial has none")
    if values == []:
        raise MalformedRequest("values", "must hold one finite number per objective")
    _carries("record", message["record"], message["run"])
    if message.get("segment") is not None:
        key, record = message["segment"]
        _attribute("segment", key, record, message["run"], (SEGMENT_ATTR,))


_VALUED = {TrialStatus.COMPLETE.value, TrialStatus.PRUNED.value, TrialStatus.STOPPED.value}


def _give_up(message: dict[str, Any]) -> None:
    if message.get("record") is not None:
        _carries("record", message["record"], message["run"])
    key, record = message["event"]
    _attribute("event", key, record, message["run"], (EVENT_ATTR,))


_TOGETHER: dict[str, Callable[[dict[str, Any]], None]] = {
    "note": _note, "event": _note, "end": _end, "give_up": _give_up}


def split_relay(url: str) -> tuple[str, str | None]:
    """The storage URL and the relay address (``host:port:token``) of a URL
    the master gave its tasks.

    >>> split_relay("runs/s/journal.log#hpo-relay=127.0.0.1:5000:ab12")
    ('runs/s/journal.log', '127.0.0.1:5000:ab12')
    >>> split_relay("runs/s/journal.log")
    ('runs/s/journal.log', None)
    """
    path, mark, relay = url.rpartition(RELAY_MARK)
    return (path, relay) if mark else (url, None)


def local_socket_name(address: str) -> str | None:
    """The abstract Unix socket the relay at ``address`` also listens on, for
    writers on its own host (Linux; None elsewhere). A writer elsewhere, or
    in another network namespace, finds none there and uses TCP. Named by a
    hash of the address: every user of the host can list the name, and it
    must not show the token."""
    if not sys.platform.startswith("linux"):
        return None
    return "\0hpo-relay-" + hashlib.sha256(address.encode()).hexdigest()[:32]


def relay_url(storage: str, address: str) -> str:
    """The URL tasks get: the storage, and the relay that writes it."""
    return f"{storage}{RELAY_MARK}{address}"


@dataclass(frozen=True)
class Decision:
    """What a trial must do next, as the master sees it.

    ``stop``: why the study stops (its ``hpo:stop`` record), or None;
    ``prune``: why the pruner finds the trial hopeless, or None; ``resize``:
    the GPU count the rate allocation grows it to, or None; ``contender``:
    the convergence a time-shared trial must reach to keep its slot (None:
    nobody waits).
    """

    stop: dict[str, Any] | None = None
    prune: str | None = None
    resize: int | None = None
    contender: float | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        if self.stop is not None:
            wire["stop"] = self.stop
        if self.prune is not None:
            wire["prune"] = self.prune
        if self.resize is not None:
            wire["resize"] = self.resize
        if self.contender is not None:  # inf travels as a string: JSON has no infinity
            wire["contender"] = "inf" if self.contender == float("inf") else self.contender
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Decision:
        contender = wire.get("contender")
        return cls(stop=wire.get("stop"), prune=wire.get("prune"), resize=wire.get("resize"),
                   contender=None if contender is None else float(contender))


class Halted(Exception):
    """The relay refused a request: the trial ended, another attempt took it
    over, or it is not a trial of this run. The attempt stops; its result
    does not count."""

    def __init__(self, why: str, status: str | None = None, value: float | None = None) -> None:
        super().__init__(why)
        self.why, self.status, self.value = why, status, value


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``."""
    payload = _ENCODER.encode(message).encode()
    return HEADER.pack(len(payload)) + payload


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def decode(payload: bytes) -> dict[str, Any]:
    """The object in a frame's payload; ValueError when it is not one."""
    try:
        text = payload.decode()
        try:  # hpo's own frames: one compact object, read by json's scanner alone
            message, end = _SCAN(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):  # white space around it, or not JSON: the decoder says why
            message = _DECODER(text)
    except RecursionError:  # nested too deep to read: as malformed as any other
        raise ValueError("a frame nested too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message


_DECODER = json.JSONDecoder().decode
_SCAN = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed names it as its own type


class FrameTooLarge(ValueError):
    """A frame announced more bytes than its reader takes (refused before they are read)."""


class Frames:
    """The bytes a connection received, cut into frames' payloads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()

    def add(self, data: bytes) -> None:
        self._data += data

    def next(self) -> bytes | None:
        """The next whole frame's payload, or None until more bytes come.

        Raises
        ------
        FrameTooLarge
            The next frame announces more than ``limit`` bytes.
        """
        data = self._data
        if len(data) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(data)
        if size > self.limit:
            raise FrameTooLarge(f"a frame of {size} bytes is over the limit of {self.limit}")
        end = HEADER.size + size
        if len(data) < end:
            return None
        payload = bytes(data[HEADER.size:end])
        del data[:end]
        return payload


def read_frame(sock: socket.socket, frames: Frames | None = None) -> dict[str, Any]:
    """Read one frame from a blocking socket (into ``frames``, which keeps
    what arrived beyond it); ConnectionError when the socket closes."""
    frames = frames if frames is not None else Frames(MAX_ANSWER)
    while (payload := frames.next()) is None:
        data = sock.recv(_RECEIVE)
        if not data:
            raise ConnectionResetError("the relay closed the connection")
        frames.add(data)
    return decode(payload)


_RECEIVE = 1 << 16  # bytes asked of a socket at once (a larger ask costs a larger allocation)
