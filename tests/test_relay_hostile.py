"""The relay against strangers and malformed requests: no input from a
connection ends anything but that connection (or that one request), and
what is stored is what Optuna and hpo's readers can read.

Real sockets against the relay the master starts, and a real journal file.
Nothing here waits on the clock: a socket's timeout only turns a hang into
a failure.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.store import StudyRelay, StudyStore, TrialLink, relay_interface, split_relay
from hpo.store import MalformedRequest
from hpo.store.records import RUN_ATTR, TrialStatus, end_run

EMPTY = {"run": {}, "heartbeat": None, "reports": [], "segments": []}
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def relay(tmp_path):
    with StudyRelay(str(tmp_path / "journal.log"), "s", control=tmp_path / "control.json") as served:
        optuna.create_study(study_name="s", storage=served.storage, direction="maximize")
        yield served


class Attempt:
    """A started attempt of a new trial, and its run record."""

    def __init__(self, relay: StudyRelay, tmp_path: Path, url: str | None = None) -> None:
        self.trial_id, _ = StudyStore(relay.storage, "s").create_trial({}, {})
        self.link = TrialLink(url or relay.writers_url, self.trial_id, str(tmp_path / "control.json"))
        self.run = self.link.start({"host": "here", "pid": os.getpid()}, time.time(), 0, EMPTY)["run"]

    def ended(self, value: float) -> dict:
        return end_run(self.run, time.time(), 0, metrics={"value": value}, error=None,
                       stop_reason=None, timed_out=False, suspended=False)

    def finish(self, value: float) -> bool:
        return self.link.end(TrialStatus.COMPLETE, [value], self.ended(value)).won


class Raw:
    """A client speaking raw bytes to the relay."""

    def __init__(self, relay: StudyRelay, hello: bool = True) -> None:
        host, port, self.token = split_relay(relay.writers_url)[1].rsplit(":", 2)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(60)  # a hang fails the test; no answer is timed
        self.buffer = b""
        if hello:
            self.send({"hello": self.token, "v": 1})
            assert self.answer()["v"] == 1

    def send(self, message: dict | bytes) -> None:
        payload = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.sock.sendall(struct.pack("!I", len(payload)) + payload)

    def answer(self) -> dict | None:
        """The next answer; None once the relay closed the connection."""
        while True:
            if len(self.buffer) >= 4:
                (size,) = struct.unpack_from("!I", self.buffer)
                if len(self.buffer) >= 4 + size:
                    payload, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
                    return json.loads(payload)
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.buffer += data

    def close(self) -> None:
        self.sock.close()


def _journal(relay: StudyRelay) -> bytes:
    return Path(relay.url).read_bytes()


def _serves(relay: StudyRelay, attempt: Attempt, step: int) -> None:
    """The relay is whole: it takes an attempt's report, and its master may write."""
    attempt.link.report(step, {"value": float(step)}, float(step))
    assert not attempt.link.direct and relay.broken is None
    StudyStore(relay.storage, "s").set_contender(None)


def _readable(relay: StudyRelay) -> list[optuna.trial.FrozenTrial]:
    """Every trial, as plain Optuna reads the journal, each read as readers do."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(relay.url))
    study = optuna.load_study(study_name="s", storage=storage)
    for trial in study.trials:
        hpo.store.records.status_of(trial)
        hpo.store.records.cost_of(trial)
        hpo.store.records.grouped_attrs(trial)
        [float(v) for v in trial.intermediate_values.values()]
    if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        best = study.best_trials if len(study.directions) > 1 else [study.best_trial]
        [float(v) for trial in best for v in trial.values]
    return study.trials


# -- strangers: before hello --------------------------------------------------------


def test_a_stranger_nesting_a_kilobyte_deep_before_hello_loses_only_its_connection(relay, tmp_path):
    attempt = Attempt(relay, tmp_path)
    stranger = Raw(relay, hello=False)
    stranger.send(b"[" * 1000)  # within what a stranger may send before hello
    assert stranger.answer() is None  # closed
    _serves(relay, attempt, 0)


def test_a_stranger_whose_token_no_bytes_can_hold_loses_only_its_connection(relay, tmp_path):
    attempt = Attempt(relay, tmp_path)
    stranger = Raw(relay, hello=False)
    stranger.send(b'{"hello": "\\ud800", "v": 1}')  # a lone surrogate: no UTF-8 for it
    assert stranger.answer() is None
    _serves(relay, attempt, 0)


def test_a_client_nesting_deep_after_hello_loses_only_its_connection(relay, tmp_path):
    attempt = Attempt(relay, tmp_path)
    client = Raw(relay)
    client.send(b"[" * 100_000)
    assert client.answer() is None
    _serves(relay, attempt, 0)


def test_a_multi_node_relay_listens_only_on_the_interface_its_workers_reach(tmp_path, monkeypatch):
    monkeypatch.delenv("HPO_RELAY_HOST", raising=False)
    host, advertised = relay_interface(local=False)
    assert host not in ("", "0.0.0.0", "::")  # never every interface
    with StudyRelay(str(tmp_path / "journal.log"), "s", host=host, advertised=advertised) as served:
        optuna.create_study(study_name="s", storage=served.storage)
        attempt = Attempt(served, tmp_path)
        attempt.link.report(0, {"value": 1.0}, 1.0)
        assert not attempt.link.direct  # its workers reach it by the name it gives them
        port = int(split_relay(served.writers_url)[1].rsplit(":", 2)[1])
        if not host.startswith("127."):  # the loopback interface is not that one
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=60).close()


def test_a_host_name_standing_for_loopback_here_gives_the_outward_interface(monkeypatch):
    monkeypatch.delenv("HPO_RELAY_HOST", raising=False)
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "node-a")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # as /etc/hosts often has it
    host, advertised = relay_interface(local=False)
    assert host not in ("", "0.0.0.0", "127.0.1.1") and advertised == host


# -- a token holder's malformed requests --------------------------------------------

# (case, the request as JSON text, the field refused). TRIAL and RUN stand for
# a live trial and its own attempt's token: the request passes fencing.
MALFORMED = [
    # The item 3: each stopped the study.
    ("trial 1e999", '{"op": "report", "trial": 1e999, "run": RUN, "step": 0, "metrics": {}}', "trial"),
    ("trial Infinity", '{"op": "report", "trial": Infinity, "run": RUN, "step": 0, "metrics": {}}', "trial"),
    ("step 1e999", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 1e999, "metrics": {}}', "step"),
    ("hpo:run a list", '{"op": "note", "trial": TRIAL, "run": RUN, "key": "hpo:run", "value": [1]}', "value"),
    ("hpo:run a string", '{"op": "note", "trial": TRIAL, "run": RUN, "key": "hpo:run", "value": "x"}', "value"),
    ("segment key abc", '{"op": "note", "trial": TRIAL, "run": RUN, "key": "hpo:segment:abc", '
     '"value": {"index": 0}}', "value"),
    ("end record a list", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "COMPLETE", '
     '"values": [1.0], "record": [1]}', "record"),
    # Item 4: stored, then every reader failed.
    ("values text", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "COMPLETE", '
     '"values": ["abc"], "record": {"token": RUN}}', "values"),
    ("values NaN", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "COMPLETE", '
     '"values": [NaN], "record": {"token": RUN}}', "values"),
    ("values null", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "COMPLETE", '
     '"values": null, "record": {"token": RUN}}', "values"),
    ("two values, one objective", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "COMPLETE", '
     '"values": [1.0, 2.0], "record": {"token": RUN}}', "values"),
    ("a failure with values", '{"op": "end", "trial": TRIAL, "run": RUN, "status": "FAILED", '
     '"values": [1.0], "record": {"token": RUN}}', "values"),
    ("step -7", '{"op": "report", "trial": TRIAL, "run": RUN, "step": -7, "metrics": {}}', "step"),
    ("step 10**18", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 1000000000000000000, '
     '"metrics": {}}', "step"),
    ("step 2**70", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 1180591620717411303424, '
     '"metrics": {}}', "step"),
    ("value NaN", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 0, "metrics": {}, '
     '"value": NaN}', "value"),
    ("value infinite", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 0, "metrics": {}, '
     '"value": -Infinity}', "value"),
    ("nested metrics", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 0, '
     '"metrics": {"a": {"b": 1.0}}}', "metrics"),
    ("a NaN metric", '{"op": "report", "trial": TRIAL, "run": RUN, "step": 0, '
     '"metrics": {"a": NaN}}', "metrics"),
]


@pytest.mark.parametrize("text,field", [(t, f) for _, t, f in MALFORMED], ids=[c for c, _, _ in MALFORMED])
def test_a_malformed_request_is_refused_alone_and_the_study_goes_on(relay, tmp_path, text, field):
    attempt = Attempt(relay, tmp_path)
    client = Raw(relay)
    before = _journal(relay)
    client.send(text.replace("TRIAL", str(attempt.trial_id)).replace("RUN", json.dumps(attempt.link.token))
                .replace('{"op"', '{"id": 1, "op"', 1).encode())
    answer = client.answer()
    assert answer is not None and answer["id"] == 1 and answer["ok"] is False
    assert answer["error"].startswith(f"malformed request: {field}: ")
    assert _journal(relay) == before  # nothing written
    client.send({"id": 2, "op": "poll", "trial": attempt.trial_id})  # the same connection goes on
    assert client.answer() == {"id": 2, "ok": True}
    _serves(relay, attempt, 0)
    assert attempt.finish(0.0)
    (trial,) = _readable(relay)
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.values == [0.0]
    assert trial.intermediate_values == {0: 0.0}


def test_an_end_holds_one_value_per_objective_of_the_study(tmp_path):
    with StudyRelay(str(tmp_path / "journal.log"), "s") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, directions=["minimize", "maximize"])
        attempt = Attempt(relay, tmp_path)
        for values in ([1.0], [1.0, 2.0, 3.0]):
            with pytest.raises(MalformedRequest, match="values: must hold 2 "):
                attempt.link.end(TrialStatus.COMPLETE, values, attempt.ended(1.0))
        assert attempt.link.end(TrialStatus.COMPLETE, [1.0, 2.0], attempt.ended(1.0)).won
        (trial,) = _readable(relay)
        assert trial.values == [1.0, 2.0] and relay.broken is None


# -- the direct path ------------------------------------------------------------------


def test_a_trial_process_writing_around_the_relay_refuses_what_the_relay_refuses(relay, tmp_path):
    attempt = Attempt(relay, tmp_path, url=relay.url)  # no relay in its URL: it writes directly
    link = attempt.link
    assert link.direct
    before = _journal(relay)
    bad = [
        ("step", lambda: link.report(-7, {"value": 1.0}, 1.0)),
        ("step", lambda: link.report(2 ** 70, {"value": 1.0}, 1.0)),
        ("value", lambda: link.report(0, {}, NAN)),
        ("metrics", lambda: link.report(0, {"a": {"b": 1.0}}, None)),
        ("metrics", lambda: link.report(0, {"a": INF}, None)),
        ("values", lambda: link.end(TrialStatus.COMPLETE, [NAN], attempt.ended(0.0))),
        ("values", lambda: link.end(TrialStatus.COMPLETE, ["abc"], attempt.ended(0.0))),
        ("values", lambda: link.end(TrialStatus.COMPLETE, None, attempt.ended(0.0))),
        ("record", lambda: link.end(TrialStatus.COMPLETE, [1.0], ["not", "a", "record"])),
        ("value", lambda: link.note(RUN_ATTR, ["x"])),
        ("value", lambda: link.note("hpo:segment:abc", {"index": 0})),
    ]
    for field, request in bad:
        with pytest.raises(ValueError, match=f"^{field}: ") as refused:
            request()
        assert not isinstance(refused.value, (OSError, hpo.store.Halted))  # not the machine's fault
    assert _journal(relay) == before
    link.report(0, {"value": 1.0}, 1.0)
    assert attempt.finish(1.0)
    relay.settle()
    (trial,) = _readable(relay)
    assert trial.values == [1.0] and trial.intermediate_values == {0: 1.0}


# -- fuzzing, while a study runs ------------------------------------------------------

FUZZ_FRAMES = 600  # frames sent in all: bounded by count, never by time
FUZZ_SEED = 20261


def _deep(kind: type, depth: int = 40) -> list | dict:
    value: list | dict = [] if kind is list else {}
    for _ in range(depth):
        value = [value] if kind is list else {"a": value}
    return value


# Values wrong for every field of every request: a request from the trial's
# own attempt with one of these is refused whatever field it replaces.
ALWAYS_WRONG = [NAN, -INF, True, _deep(list), _deep(dict)]
# Anything at all, some of it right for some field.
HOSTILE = ALWAYS_WRONG + [
    None, False, 0, -7, 1, 2 ** 31, 10 ** 18, 2 ** 70, -2 ** 70, 1.5, 1e308, INF, "", "abc", "\ud800",
    "x" * 5000, "hpo:run", "hpo:segment:abc", "hpo:profile:nan", "hpo:event:x", "COMPLETE",
    "RUNNING", [], [1], ["abc"], [NAN], [1.0, 2.0], ["hpo:event:1-1", {}], {}, {"a": {"b": 1}},
    {"token": None}, {"rate": "fast"},
]


def _fields(op: str, run: str) -> dict:
    """A well-formed request's own fields."""
    now = time.time()
    return {
        "start": {"where": {"host": "h", "pid": 1}, "now": now, "gpus": 0, "knows": [0, 0]},
        "report": {"step": 3, "metrics": {"value": 1.0}, "value": 1.0},
        "beat": {"now": now},
        "event": {"key": f"hpo:event:{time.time_ns():020d}-1",
                  "record": {"time": now, "kind": "stopped", "step": None, "reason": "x", "host": "h"}},
        "note": {"key": "hpo:profile:1", "value": {"rate": 1.0, "unit": "batches/s"}},
        "end": {"status": "COMPLETE", "values": [1.0], "record": {"token": run}, "segment": None},
        "give_up": {"record": None, "event": [f"hpo:event:{time.time_ns():020d}-1", {"time": now}],
                    "now": now},
        "poll": {},
    }[op]


OPS = ["start", "report", "beat", "event", "note", "end", "give_up", "poll"]


def _fuzzed_request(rng: random.Random, number: int, attempts: list[tuple[int, str]]) -> dict:
    """A request with one field made hostile, or left out, on one of the
    ``attempts`` (trial id, token) or an unknown trial. Only an unknown
    trial is ever started (a start with a fresh token on a live trial takes
    it over: that is how a lost attempt's retry begins)."""
    op = rng.choice(OPS)
    trial_id, token = rng.choice(attempts)
    own = op != "start" and rng.random() < 0.5  # the attempt's own token: passes fencing
    trial = trial_id if op != "start" and rng.random() < 0.8 else 10_000 + rng.randrange(50)
    run = token if own else uuid.uuid4().hex
    message = {"id": number, "op": op, "trial": trial, "run": run, **_fields(op, run)}
    field = rng.choice(sorted(message))
    if own or (op == "start" and field == "trial"):  # HOSTILE holds live trials' ids
        message[field] = rng.choice(ALWAYS_WRONG)
    elif rng.random() < 0.2:
        del message[field]
    else:
        message[field] = rng.choice(HOSTILE)
    return message


def _breaking_frame(rng: random.Random, limit: int) -> bytes:
    """Bytes that end the connection that sends them (whole: no wait for more)."""
    return rng.choice([
        struct.pack("!I", 1000) + b"[" * 1000,
        struct.pack("!I", limit + 1 + rng.randrange(1 << 20)),  # announces too much
        struct.pack("!I", 0xFFFFFFFF),
        struct.pack("!I", 2) + b"\xff\xfe",  # not UTF-8
        struct.pack("!I", 5) + b"[1,2]",  # not an object
        struct.pack("!I", 5) + b"1e999",
        struct.pack("!I", 4) + b"null",
        struct.pack("!I", 0),
        struct.pack("!I", 7) + b'{"a":1,',  # not JSON
    ])


def _fuzz_stranger(relay: StudyRelay, rng: random.Random) -> int:
    """One connection that never says a right hello; the frames it sent."""
    stranger = Raw(relay, hello=False)
    try:
        choice = rng.randrange(4)
        if choice == 0:
            stranger.sock.sendall(_breaking_frame(rng, 1024))
        elif choice == 1:
            stranger.send({"hello": rng.choice(HOSTILE + ["0" * 32]), "v": rng.choice([1, 2, None, "1"])})
        elif choice == 2:  # a request in place of the hello
            stranger.send(_fuzzed_request(rng, 0, [(999_999, "0" * 32)]))
        else:  # a frame cut short: the relay waits for the rest, and the stranger leaves
            stranger.sock.sendall(struct.pack("!I", 200) + rng.randbytes(rng.randrange(200)))
            return 1
        assert stranger.answer() is None  # closed, without a word
        return 1
    finally:
        stranger.close()


def _fuzz_client(relay: StudyRelay, rng: random.Random, attempts: list[tuple[int, str]]) -> int:
    """One connection with the study's token; the frames it sent."""
    client = Raw(relay)
    try:
        for sent in range(1, rng.randrange(2, 12)):
            if rng.random() < 0.08:
                client.sock.sendall(_breaking_frame(rng, 4 << 20))
                assert client.answer() is None
                return sent
            if rng.random() < 0.03:  # cut short, and gone
                client.sock.sendall(struct.pack("!I", 500) + b'{"id": 1, "op": "rep')
                return sent
            message = _fuzzed_request(rng, sent, attempts)
            client.send(json.dumps(message).encode())
            answer = client.answer()
            number = message.get("id")
            assert answer is not None and answer["id"] == (number if type(number) is int else None)
            assert answer["ok"] is False or message.get("op") == "poll", (message, answer)
        return sent
    finally:
        client.close()


def test_a_relay_fuzzed_before_and_after_hello_serves_a_study_to_its_exact_end(relay, tmp_path):
    attempts = [Attempt(relay, tmp_path) for _ in range(4)]
    fuzzed, steps, failures = threading.Event(), {}, []

    def train(attempt: Attempt) -> None:
        try:
            step = 0
            while step < 5 or not fuzzed.is_set():  # reports go on until the fuzzing is over
                attempt.link.report(step, {"value": float(step), "loss": 1.0 / (step + 1)}, float(step))
                if step % 10 == 0:
                    attempt.link.beat(time.time())
                step += 1
            steps[attempt.trial_id] = step
            assert attempt.finish(float(step - 1))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    workers = [threading.Thread(target=train, args=(a,)) for a in attempts]
    for worker in workers:
        worker.start()
    rng = random.Random(FUZZ_SEED)
    targets = [(a.trial_id, a.link.token) for a in attempts]
    try:
        sent = 0
        while sent < FUZZ_FRAMES:
            if rng.random() < 0.35:
                sent += _fuzz_stranger(relay, rng)
            else:
                sent += _fuzz_client(relay, rng, targets)
    finally:
        fuzzed.set()
        for worker in workers:
            worker.join()
    assert not failures, failures
    assert relay.broken is None
    trials = {StudyStore.trial_id(t): t for t in _readable(relay)}
    assert sorted(trials) == sorted(a.trial_id for a in attempts)  # nothing started by the fuzzer
    ends = [json.loads(line) for line in _journal(relay).splitlines()]
    for attempt in attempts:
        trial, last = trials[attempt.trial_id], steps[attempt.trial_id] - 1
        assert trial.state == optuna.trial.TrialState.COMPLETE and trial.values == [float(last)]
        assert trial.intermediate_values == {s: float(s) for s in range(last + 1)}
        assert sorted(trial.system_attrs) == sorted(
            [RUN_ATTR, "hpo:heartbeat"] + [f"hpo:report:{s:06d}" for s in range(last + 1)])
        assert trial.system_attrs[RUN_ATTR]["token"] == attempt.link.token
        completes = [r for r in ends if r.get("op_code") == 6 and r.get("trial_id") == attempt.trial_id
                     and r.get("state") == optuna.trial.TrialState.COMPLETE.value]
        assert len(completes) == 1  # COMPLETE once
