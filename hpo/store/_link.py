"""A trial attempt's link to its study's store, from the trial's own process.

The process holds no Optuna storage and never reads the journal: every write
is a request to the study's relay (:mod:`hpo.store._protocol`), answered once
durable with what the trial must do next. A process keeps one connection per
relay, shared by its threads (the trials a worker runs side by side); a
forked child makes its own.

When the relay cannot be reached (a compute node that cannot open a
connection to the master's node, a relay that died), the link says so once
and makes the same writes itself: journal records appended under the file
lock, as every writer did before the relay, or the same calls on a database
storage; decisions then come from the study's control file
(:mod:`hpo.store._control`). A request whose answer never came is made
again that way: requests are idempotent. Writes made that way are fenced by
the store's epoch (:mod:`hpo.store._epoch`): an attempt whose master's run
is no longer the study's writes nothing more. What this path cannot do is
fence a stale attempt of the same master's run, or say whether an end won:
the master reads that from the store.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpo.store._control import FRESH_S, ControlFile
from hpo.store._epoch import EPOCH_ATTR, journal_epoch
from hpo.store._files import MACHINE_FAULTS
from hpo.store._format import last_trial_system_attrs
from hpo.store._protocol import (
    HELLO_TIMEOUT_S,
    MAX_ANSWER,
    VERSION,
    Decision,
    Frames,
    Halted,
    MalformedRequest,
    check_request,
    encode,
    local_socket_name,
    read_frame,
    split_relay,
)
from hpo.store._writes import Write, apply_writes, journal_records, writes_of
from hpo.store.records import (
    HEARTBEAT_ATTR,
    RUN_ATTR,
    EventRecord,
    RunRecord,
    TrialContext,
    TrialStatus,
    attempt_open,
    begin_attempt,
)

if TYPE_CHECKING:
    import optuna

__all__ = ["TrialLink", "RelayConnection", "Ended", "RelayUnreachable"]

_CONNECT_TIMEOUT_S = 10.0
_ANSWER_TIMEOUT_S = 60.0  # a round is one write and one fsync (slow on a loaded NFS); a stopped master: go around it
_RETRY_CONNECT_S = 30.0  # after a failed connect, write directly for this long


class RelayUnreachable(OSError):
    """Nothing was sent: the relay could not be reached."""


class _AnswerLost(OSError):
    """Sent, but no answer came: the outcome is unknown."""


@dataclass(frozen=True)
class Ended:
    """How an attempt's end request went: ``won`` when it is the trial's
    stored end (assumed on the direct path), else the end that was."""

    won: bool
    status: str | None
    value: float | None


class _Waiter:
    """A place in the queue of answers: a thread's (one per thread, reused),
    or a request's whose answer is read later (:meth:`RelayConnection.ask`)."""

    __slots__ = ("wake", "answer", "present")

    def __init__(self) -> None:
        self.wake = threading.Event()  # its answer came, or it is its turn to read
        self.answer: dict[str, Any] | None = None
        self.present = False  # a thread waits for it now: the reading may be handed to it

    @classmethod
    def mine(cls) -> _Waiter:
        waiter = getattr(_thread_waiter, "waiter", None)
        if waiter is None:
            waiter = _thread_waiter.waiter = cls()
        waiter.answer = None
        waiter.wake.clear()
        return waiter


_thread_waiter = threading.local()


class RelayConnection:
    """One process's connection to one relay, shared by its threads. Requests
    are sent under a lock; answers are read by whichever waiting thread holds
    the reading lock, which hands each answer to its thread and the reading
    on to another waiter when its own answer came (no reader thread: a lone
    trial reads its own answer, without a thread switch)."""

    _here: dict[str, RelayConnection] = {}
    _pid = os.getpid()
    _making = threading.Lock()

    @classmethod
    def to(cls, address: str) -> RelayConnection:
        """This process's connection to the relay at ``address``."""
        with cls._making:
            if cls._pid != os.getpid():  # a forked child: the parent's socket stays the parent's
                cls._here, cls._pid = {}, os.getpid()
            connection = cls._here.get(address)
            if connection is None:
                connection = cls._here[address] = cls(address)
            return connection

    def __init__(self, address: str) -> None:
        host, port, token = address.rsplit(":", 2)
        self.where = (host, int(port))
        self._local = local_socket_name(address)
        self._token = token
        self._sending = threading.Lock()
        self._reading = threading.Lock()
        self._sock: socket.socket | None = None
        self._frames = Frames(MAX_ANSWER)
        self._waiting: dict[int, _Waiter] = {}
        self._ids = itertools.count()
        self._unreachable_until = 0.0
        self.why = ""
        self.epoch: int | None = None

    def request(self, message: dict[str, Any], timeout: float = _ANSWER_TIMEOUT_S) -> dict[str, Any]:
        """Send ``message`` and return the relay's answer.

        Raises
        ------
        RelayUnreachable
            Nothing was sent.
        OSError
            Sent, but no answer came (the outcome is unknown).
        """
        waiter = _Waiter.mine()
        return self._await(self._send(message, waiter), waiter, timeout)

    def ask(self, message: dict[str, Any], later: bool = False) -> Callable[[], dict[str, Any]]:
        """Send ``message`` now and return what waits for its answer: at once,
        with the thread's own waiter, or ``later`` (the thread may make other
        requests before, so the answer waits in a place of its own).
        RelayUnreachable when nothing was sent; the answer raises OSError
        when it never came."""
        waiter = _Waiter() if later else _Waiter.mine()
        sock = self._send(message, waiter)
        return lambda: self._await(sock, waiter, _ANSWER_TIMEOUT_S)

    def _await(self, sock: socket.socket, waiter: _Waiter, timeout: float) -> dict[str, Any]:
        """``waiter``'s answer, read by this thread or handed to it by another."""
        deadline = time.monotonic() + timeout
        waiter.present = True
        try:
            while waiter.answer is None and sock is self._sock:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._lost(sock, TimeoutError(f"no answer in {timeout:g} s"))
                elif self._reading.acquire(blocking=False):
                    try:
                        self._read_until(sock, waiter, left)
                    finally:
                        self._reading.release()
                        self._pass_the_reading()
                else:
                    waiter.wake.wait(left)
                    waiter.wake.clear()
        finally:
            waiter.present = False
        if waiter.answer is None:
            raise _AnswerLost(f"the relay stopped answering ({self.why})")
        return waiter.answer

    @property
    def same_host(self) -> bool:
        """Connected over the relay's Unix socket: a frame sent is in the
        relay's queue once :meth:`post` returns."""
        sock = self._sock
        return sock is not None and sock.family == socket.AF_UNIX

    def post(self, message: dict[str, Any]) -> None:
        """Send ``message`` and wait for no answer (a later request's reader
        drops it); the relay may hold it a few milliseconds to write it with
        the next request. OSError when the connection broke while it was sent."""
        self._send(message, None)

    def _send(self, message: dict[str, Any], waiter: _Waiter | None) -> socket.socket:
        """Send ``message`` with an id of its own, its answer awaited by
        ``waiter`` (None: by nobody, and the relay is told it was posted);
        the socket it went out on."""
        with self._sending:
            sock = self._connected()
            number = next(self._ids)
            if waiter is not None:
                self._waiting[number] = waiter
            framed = {**message, "id": number}
            if waiter is None:
                framed["posted"] = True
            try:
                sock.sendall(encode(framed))
            except OSError as exc:
                self._lost(sock, exc)
                raise _AnswerLost(f"the relay stopped answering ({exc})") from None
        return sock

    def _read_until(self, sock: socket.socket, waiter: _Waiter, left: float) -> None:
        """Read answers, handing each to its thread, until ``waiter``'s came."""
        try:
            if left < _ANSWER_TIMEOUT_S:  # the socket waits this long unless told otherwise
                sock.settimeout(left)
            while waiter.answer is None:
                answer = read_frame(sock, self._frames)
                # A frame with no id (or one nobody waits for) finds no waiter.
                other = self._waiting.pop(answer.get("id"), None)  # type: ignore[arg-type]
                if other is not None:
                    other.answer = answer
                    other.wake.set()
        except (OSError, ValueError) as exc:
            self._lost(sock, exc)

    def _pass_the_reading(self) -> None:
        for other in list(self._waiting.values()):
            if other.present:  # a thread waits for it: it takes the reading over
                other.wake.set()
                return

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if time.monotonic() < self._unreachable_until:
            raise RelayUnreachable(self.why)
        try:
            sock = self._dial()
            sock.sendall(encode({"hello": self._token, "v": VERSION}))
            sock.settimeout(HELLO_TIMEOUT_S)
            self._frames = Frames(MAX_ANSWER)
            hello = read_frame(sock, self._frames)
            sock.settimeout(_ANSWER_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            self.why = f"{type(exc).__name__}: {exc}"
            self._unreachable_until = time.monotonic() + _RETRY_CONNECT_S
            raise RelayUnreachable(self.why) from None
        self.epoch = hello.get("epoch")
        self._sock = sock
        return sock

    def _dial(self) -> socket.socket:
        """A connection to the relay: its Unix socket where this process runs
        on the relay's host (and network namespace), else TCP."""
        if self._local is not None:
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.settimeout(_CONNECT_TIMEOUT_S)
            try:
                unix.connect(self._local)
                return unix
            except OSError:  # another host: no such name here
                unix.close()
        sock = socket.create_connection(self.where, timeout=_CONNECT_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _lost(self, sock: socket.socket, why: BaseException) -> None:
        """The connection broke: every request waiting on it has no answer."""
        if self._sock is sock:
            self._sock = None
            self.why = f"{type(why).__name__}: {why}"
        try:
            sock.close()
        except OSError:
            pass
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.wake.set()


class TrialLink:
    """One attempt's link to trial ``trial_id`` of the store at ``storage``
    (the URL its task carries, with the relay's address); ``control`` is the
    study's control file; ``token`` names the attempt (a new one by default;
    an isolated trial's process goes on with its parent's). Each request
    raises :class:`Halted` when the relay refuses it: the attempt must stop,
    and its result does not count."""

    def __init__(self, storage: str, trial_id: int, control: str | None = None,
                 token: str | None = None, master: str | None = None) -> None:
        self.url, self.address = split_relay(storage)
        self.trial_id = trial_id
        self.token = token or uuid.uuid4().hex  # a new attempt's, unless it goes on in another process
        # The lease token of the master that made the task: a write around the
        # relay checks that the store's epoch is still that master's (fencing).
        self.master = master
        # And that no later attempt took the trial over since this one began.
        self._fence = _AttemptFence(self.url, trial_id, self.token) if "://" not in self.url else None
        self.decision = Decision()
        self.direct = False  # whether the last request went around the relay
        self._control = ControlFile(control) if control else None
        self._sink: _DirectSink | None = None
        self._polled = 0.0
        self._relay: RelayConnection | None = None
        self._pid = 0  # the process that found self._relay

    def __getstate__(self) -> dict[str, Any]:
        # A storage, a file handle or a connection stays in its process.
        return {**self.__dict__, "_sink": None, "_relay": None, "_pid": 0}

    # -- requests --------------------------------------------------------------------

    def start(self, where: dict[str, Any], now: float, gpus: float,
              context: TrialContext) -> dict[str, Any]:
        """Begin the attempt: ``{"run": RUN_RECORD, "reports": [...],
        "segments": [...]}``, the reports and segments being those stored
        beyond what ``context`` (the task's) holds."""
        return self.begin_start(where, now, gpus, context)()

    def begin_start(self, where: dict[str, Any], now: float, gpus: float,
                    context: TrialContext) -> Callable[[], dict[str, Any]]:
        """:meth:`start`, sent now: what returns its answer (or raises
        :class:`Halted`) once called, by this thread, before its next request.
        The attempt has begun only once that answer came: meanwhile its
        process may prepare (claim cores), never run the objective."""
        message = {"op": "start", "where": where, "now": now, "gpus": gpus,
                   "knows": [len(context["reports"]), len(context["segments"])]}
        return self._begin(message, lambda: self._start_here(where, now, gpus, context), later=True)

    def report(self, step: int, metrics: dict[str, float], value: float | None) -> Decision:
        """One step's metrics, durable when it returns; the decision that follows."""
        self._ask({"op": "report", "step": step, "metrics": metrics, "value": value})
        return self.decision

    def beat(self, now: float) -> None:
        self._ask({"op": "beat", "now": now})

    def event(self, key: str, record: EventRecord) -> None:
        self._ask({"op": "event", "key": key, "record": record})

    def note(self, key: str, value: Any) -> None:
        self._ask({"op": "note", "key": key, "value": value})

    def end(self, status: TrialStatus, values: list[float] | None, record: RunRecord,
            segment: tuple[str, dict[str, Any]] | None = None, wait: bool = True) -> Ended:
        """End the attempt: the trial's final state (or SUSPENDED) and its
        final run record, with its segment's record when it ran in segments.
        Not ``wait``: on the relay's host, it returns once the relay holds
        the request, before it is durable (the master's
        :meth:`~hpo.store.StudyRelay.settle` makes it so); elsewhere, and
        around the relay, once durable as always."""
        # While the study stops, its master may be gone before it settles a
        # posted end: the end waits, and goes around a relay that stopped.
        posted = not wait and self.decision.stop is None
        answer = self._ask({"op": "end", "status": status.value, "values": values, "record": record,
                            "segment": list(segment) if segment else None}, posted=posted)
        if "won" not in answer:  # posted, written directly, or suspended: nothing says otherwise
            return Ended(True, status.value, values[0] if values else None)
        return Ended(bool(answer["won"]), answer.get("status"), answer.get("value"))

    def give_up(self, record: RunRecord | None, event: tuple[str, EventRecord], now: float) -> None:
        """The attempt ends without a result (``record``: its final run record,
        where known); its trial is resumed at once."""
        self._ask({"op": "give_up", "record": record, "event": list(event), "now": now})

    def poll(self, fresh: bool = False) -> Decision:
        """The decision now, asked at most every 0.2 s (the last one between)
        unless ``fresh``."""
        now = time.monotonic()
        if fresh or now - self._polled >= FRESH_S:
            self._polled = now
            self._ask({"op": "poll"})
        return self.decision

    def unfinished(self) -> bool:
        """Whether the trial has not ended, asked by no attempt (a multi-node
        trial's holder on another node); True when the relay cannot say."""
        if self.address is None:
            return True
        message = {"op": "poll", "trial": self.trial_id}
        try:
            answer = RelayConnection.to(self.address).request(message)
        except OSError:
            return True
        return not answer.get("halt")

    # -- inside ---------------------------------------------------------------------

    def _ask(self, message: dict[str, Any], here: Any = None, posted: bool = False) -> dict[str, Any]:
        connection = self._connection() if posted and self.address is not None else None
        if connection is not None and connection.same_host:
            message["trial"], message["run"] = self.trial_id, self.token
            check_request(message)  # refused here, as the relay would, not lost unseen
            try:
                connection.post(message)
            except OSError as exc:  # the connection broke: the same writes, directly
                _say_once(connection, exc)
                return self._directly(message, here)
            self.direct = False
            return {"ok": True}
        return self._begin(message, here)()

    def _begin(self, message: dict[str, Any], here: Any, later: bool = False) -> Callable[[], dict[str, Any]]:
        """Send ``message`` to the relay; what returns its answer (read
        ``later``: see :meth:`RelayConnection.ask`), made directly when the
        relay cannot be reached or gave none (``here()`` where given:
        requests are idempotent)."""
        message["trial"], message["run"] = self.trial_id, self.token
        if self.address is not None:
            connection = self._connection()
            try:
                answer = connection.ask(message, later)
            except OSError as exc:  # unreachable: the same writes, directly (below)
                _say_once(connection, exc)
            else:
                return lambda: self._answer_of(connection, answer, message, here)
        done = self._directly(message, here)
        return lambda: done

    def _answer_of(self, connection: RelayConnection, answer: Callable[[], dict[str, Any]],
                   message: dict[str, Any], here: Any) -> dict[str, Any]:
        try:
            got = answer()
        except OSError as exc:  # no answer: the same writes, directly
            _say_once(connection, exc)
            return self._directly(message, here)
        self.direct = False
        return self._answered(got)

    def _directly(self, message: dict[str, Any], here: Any) -> dict[str, Any]:
        """Make ``message``'s writes around the relay (``here()``, when given)."""
        self.direct = True
        # What the relay would refuse is not written around it either
        # (MalformedRequest, a ValueError: the caller's fault, not the machine's).
        check_request(message)
        return here() if here is not None else self._here(message)

    def _connection(self) -> RelayConnection:
        """This process's connection to the relay (found once per process)."""
        pid = os.getpid()
        if self._pid != pid:
            if self.address is None:
                raise RuntimeError("hpo internal error: asked only of a link with a relay")
            self._relay, self._pid = RelayConnection.to(self.address), pid
        if self._relay is None:
            raise RuntimeError("hpo internal error: self._relay is not None")
        return self._relay

    def _answered(self, answer: dict[str, Any]) -> dict[str, Any]:
        if answer.get("ok"):
            self.decision = _NO_DECISION if len(answer) == 2 else Decision.from_wire(answer)
            self._polled = time.monotonic()
            return answer
        if answer.get("halt"):
            raise Halted(answer["halt"], answer.get("status"), answer.get("value"))
        error = str(answer.get("error"))
        if error.startswith(_MALFORMED):  # the caller's mistake, as on the direct path
            field, _, why = error[len(_MALFORMED):].partition(": ")
            raise MalformedRequest(field, why)
        raise OSError(f"the study's relay could not write: {error}")

    def _here(self, message: dict[str, Any]) -> dict[str, Any]:
        """Make a request's writes directly; the decision from the control file."""
        self._write_here(writes_of(message))
        if self._control is not None:
            self.decision = self._control.decision(self.trial_id)
        return {"ok": True}

    def _direct_sink(self) -> _DirectSink:
        if self._sink is None:
            self._sink = _DirectSink(self.url)
        return self._sink

    def _start_here(self, where: dict[str, Any], now: float, gpus: float,
                    context: TrialContext) -> dict[str, Any]:
        # The attempt carries on from the trial's stored run record, as the
        # relay's start does, not from its task's: a task Dask runs again after
        # its worker died was made before the lost attempt began.
        with _store_faults_halt():
            stored = self._direct_sink().trial_attrs(self.trial_id, (RUN_ATTR, HEARTBEAT_ATTR))
        previous = stored.get(RUN_ATTR) or context["run"]
        heartbeat = stored[HEARTBEAT_ATTR] if HEARTBEAT_ATTR in stored else context["heartbeat"]
        events: list[tuple[str, EventRecord]]
        if previous.get("token") == self.token and attempt_open(previous):  # asked again
            run, events = previous, []
        else:
            run, events = begin_attempt(previous, heartbeat, where, now, gpus, self.token)
        writes: list[Write] = [("attr", self.trial_id, key, event) for key, event in events]
        self._write_here([*writes, ("attr", self.trial_id, RUN_ATTR, run),
                          ("state", self.trial_id, TrialStatus.RUNNING, None)])
        return {"ok": True, "run": run, "reports": [], "segments": []}

    def _write_here(self, writes: list[Write]) -> None:
        if not writes:
            return
        with _store_faults_halt():
            written = self._direct_sink().write(writes, self.master, self._fence)
        if not written:  # another master's run took the study, or another attempt the trial
            raise Halted("superseded" if self._fence is not None and self._fence.superseded else "unavailable")


class _DirectSink:
    """Writes made around the relay: journal records appended under the
    file lock, or calls on a database storage."""

    def __init__(self, url: str) -> None:
        self._worker_id = f"hpo-direct-{socket.gethostname()}-{os.getpid()}"
        self._storage: optuna.storages.BaseStorage | None
        if "://" in url:
            from hpo.store._study import open_storage

            self._storage = open_storage(url)
            self._journal = None
        else:
            from hpo.store._journal import JournalFile

            self._storage = None
            self._journal = JournalFile(url, create=False)

    def trial_attrs(self, trial_id: int, keys: tuple[str, ...]) -> dict[str, Any]:
        """The stored values of a trial's system attributes ``keys`` (those
        never set: absent). The whole journal is read: this path is the
        fallback, taken once per attempt that starts around the relay."""
        if self._journal is not None:
            with open(self._journal.path, "rb") as f:
                return last_trial_system_attrs(f.read(), trial_id, keys)
        if self._storage is None:
            raise RuntimeError("hpo internal error: a database's sink")
        attrs = self._storage.get_trial(trial_id).system_attrs
        return {key: attrs[key] for key in keys if key in attrs}

    def write(self, writes: list[Write], master: str | None, fence: _AttemptFence | None = None) -> bool:
        """Make ``writes`` unless the store's epoch names another master than
        ``master`` (checked under the journal's lock, where the relay names
        its epoch too), or ``fence`` finds a later attempt; False when refused."""
        if self._journal is not None:
            from hpo.store._journal import encode_records

            data = encode_records(journal_records(writes, self._worker_id))
            path = self._journal.path

            def allowed() -> bool:
                return _current(journal_epoch(path), master) and (fence is None or fence.current())

            return self._journal.append_direct(data, allowed)
        if self._storage is None:
            raise RuntimeError("hpo internal error: a database's sink")
        if not _current_in_database(self._storage, master):
            return False
        apply_writes(self._storage, writes)
        return True


class _AttemptFence:
    """Whether another attempt took a trial over since this one began, read
    from the run records appended to the journal meanwhile (the relay's own
    check, for an attempt writing around it): only the bytes appended since
    the last look are read, and only lines naming the trial's run record."""

    def __init__(self, journal: str, trial_id: int, token: str) -> None:
        self._path, self._token = journal, token
        self._mark = b'"trial_id":%d,"system_attr":{"hpo:run":' % trial_id
        try:
            self._read = os.stat(journal).st_size  # what came before this attempt is older
        except OSError:
            self._read = 0
        self.superseded = False

    def current(self) -> bool:
        """False once a run record of another attempt is found (asked under
        the journal's lock: nothing is appended meanwhile)."""
        if self.superseded:
            return False
        with open(self._path, "rb") as f:
            f.seek(self._read)
            data = f.read()
        end = data.rfind(b"\n") + 1  # whole lines only
        at = data.find(self._mark, 0, end)
        while at >= 0:
            start, stop = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
            try:
                run = json.loads(data[start:stop])["system_attr"]["hpo:run"]
            except (ValueError, KeyError, TypeError):
                run = None
            if isinstance(run, dict) and run.get("token") not in (None, self._token):
                self.superseded = True
                return False
            at = data.find(self._mark, stop, end)
        self._read += end
        return True


@contextmanager
def _store_faults_halt() -> Iterator[None]:
    """The store's faults are not the trial's (a full disk, a journal deleted
    or made read-only): the attempt stops, resumable."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (*MACHINE_FAULTS, errno.ENOENT, errno.EPERM, errno.EACCES):
            raise Halted("unavailable") from exc
        raise


_NO_DECISION = Decision()
_MALFORMED = "malformed request: "  # how the relay's refusal of a malformed request begins


def _current(epoch: dict[str, Any] | None, master: str | None) -> bool:
    """Whether the store's ``epoch`` lets the attempts of ``master`` write
    (a store no master's run took yet, or an attempt of no master, says
    nothing against it)."""
    return master is None or not isinstance(epoch, dict) or epoch.get("master") in (None, master)


def _current_in_database(storage: Any, master: str | None) -> bool:
    """A database may hold several studies, and a trial's process knows only
    its trial: ``master`` must be the master of some study's current epoch,
    when any study has one."""
    if master is None:
        return True
    epochs = [s.system_attrs.get(EPOCH_ATTR) for s in storage.get_all_studies()]
    epochs = [e for e in epochs if isinstance(e, dict)]
    return not epochs or any(e.get("master") == master for e in epochs)


_told: set[str] = set()


def _say_once(connection: RelayConnection, exc: OSError) -> None:
    """Say once per process and relay that the store is written around it."""
    key = f"{os.getpid()}:{connection.where}"
    if key in _told:
        return
    _told.add(key)
    host, port = connection.where
    print(f"hpo: the study's relay at {host}:{port} cannot be reached ({exc}); this process "
          "appends to the journal directly, under its file lock, and reads the study's decisions "
          "from its control file", file=sys.stderr, flush=True)
