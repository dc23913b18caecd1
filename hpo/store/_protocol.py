"""The store protocol: what a trial's process says to the study's relay, and
what each answer promises (version 1).

A study has one reader and one sequencer: the relay in the master process
(:mod:`hpo.store._relay`). Workers and trial processes hold no Optuna storage;
they speak this protocol over TCP and get back, with each acknowledgement,
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
                SUSPENDED status leaves the trial to be resumed.
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
    and its result does not count. ``{"id": N, "ok": false, "error": TEXT}``:
    the relay could not write (its master stops).
    An ``end`` answered ``"won": true`` is the trial's stored end.

Every request is idempotent (a report, a note, an event or a beat written
twice stores the same thing; a second end loses to the first), so a client
that got no answer sends it again, to the relay or straight to the journal.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["VERSION", "MAX_REQUEST", "MAX_ANSWER", "HELLO_TIMEOUT_S", "RELAY_MARK", "Decision",
           "Halted", "split_relay", "relay_url", "encode", "decode", "read_frame", "Frames",
           "FrameTooLarge", "HEADER"]

VERSION = 1
HEADER = struct.Struct("!I")
MAX_REQUEST = 4 << 20  # a report is small; a final record with a long traceback is not huge
MAX_ANSWER = 256 << 20  # a start's answer may carry a long trial's reports
HELLO_TIMEOUT_S = 10.0
RELAY_MARK = "#hpo-relay="


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
    def from_wire(cls, wire: dict[str, Any]) -> "Decision":
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
    message = _DECODER(payload.decode())
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message


_DECODER = json.JSONDecoder().decode


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
