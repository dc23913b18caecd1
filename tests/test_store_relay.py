"""The study's relay: one reader and sequencer, group commits, decisions in the
answers, and what happens when a writer, a stranger or the relay misbehaves.

Every test runs real sockets on 127.0.0.1 against a real journal file, and
the relay the master starts (:class:`hpo.store.StudyRelay`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.store import (
    ControlFile, Decision, JournalFile, MasterLease, RelayConnection, StudyRelay, StudyStore, TrialLink,
    clear_dead_lock, lock_holder,
    local_socket_name,
    process_stopped,
    split_relay,
)
from hpo.dashboards.synthetic import write_study
from hpo.master import asha_pruning, median_pruning
from hpo.store import _snapshot
from hpo.store.records import EVENT_ATTR, RUN_ATTR, report_key
from hpo.trial import TrialTask, open_trial
from conftest import toy_space, wait_for

EMPTY = {"run": {}, "heartbeat": None, "reports": [], "segments": []}


def _frame(message: dict) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack("!I", len(data)) + data


@pytest.fixture
def relay(tmp_path):
    with StudyRelay(str(tmp_path / "journal.log"), "s", control=tmp_path / "control.json") as served:
        optuna.create_study(study_name="s", storage=served.storage, direction="maximize")
        yield served


def _started(relay: StudyRelay, tmp_path: Path) -> TrialLink:
    """An attempt of a new trial, started."""
    trial_id, _ = StudyStore(relay.storage, "s").create_trial({}, {})
    link = TrialLink(relay.writers_url, trial_id, str(tmp_path / "control.json"))
    link.start({"host": "here", "pid": os.getpid()}, 1.0, 0, EMPTY)
    return link


def _journal(relay: StudyRelay) -> list[dict]:
    return [json.loads(line) for line in Path(split_relay(relay.writers_url)[0]).read_bytes().splitlines()]


def test_many_threads_share_rounds_and_each_report_lands_once_in_order(relay, tmp_path):
    links = [_started(relay, tmp_path) for _ in range(8)]
    threads = [threading.Thread(target=lambda link=link: [link.report(s, {"value": s}, s) for s in range(200)])
               for link in links]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal = _journal(relay)
    for link in links:
        steps = [r["step"] for r in journal if r.get("trial_id") == link.trial_id and "step" in r]
        assert steps == list(range(200))  # each report once, in the order it was made
    rounds = relay.storage  # the replica was fed every report, without reading the file
    assert all(len(rounds.get_trial(link.trial_id).intermediate_values) == 200 for link in links)


class _HoldingRelay:
    """A stand-in relay on 127.0.0.1 that answers every request at once,
    except starts, held until :attr:`release` is set."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}:{os.urandom(8).hex()}"
        self.release = threading.Event()
        self._sending = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _send(self, conn: socket.socket, message: dict) -> None:
        with self._sending:
            conn.sendall(_frame(message))

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        reader = conn.makefile("rb")
        while header := reader.read(4):
            message = json.loads(reader.read(struct.unpack("!I", header)[0]))
            if "hello" in message:
                self._send(conn, {"v": message["v"], "epoch": 0})
            elif message.get("op") == "start":
                threading.Thread(target=lambda m=message: (self.release.wait(60), self._send(
                    conn, {"id": m["id"], "ok": True, "run": {"token": m["run"]}})), daemon=True).start()
            else:
                self._send(conn, {"id": message["id"], "ok": True})


def test_a_request_whose_answer_is_read_later_holds_back_no_other_thread():
    relay = _HoldingRelay()
    connection = RelayConnection(relay.address)
    held = connection.ask({"op": "start", "trial": 0, "run": "later"})  # its thread prepares meanwhile
    done: list[int] = []

    def polls() -> None:
        for _ in range(50):
            connection.request({"op": "poll", "trial": 0}, timeout=30)  # a hang fails, not waits
        done.append(1)

    threads = [threading.Thread(target=polls) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert done == [1, 1, 1]  # each thread had its answers read while the start's waited
    relay.release.set()
    assert held()["run"] == {"token": "later"}


def test_an_answer_comes_once_the_report_is_durable(relay, tmp_path):
    link = _started(relay, tmp_path)
    link.report(0, {"value": 1.0}, 1.0)
    reports = [r for r in _journal(relay) if r.get("step") == 0]
    assert reports and reports[0]["intermediate_value"] == 1.0  # on disk before report returned


def test_the_master_replica_is_fed_and_never_reads_the_file_again(tmp_path, monkeypatch):
    reads: list[str] = []
    for name in ("read_logs", "read_from"):
        real = getattr(JournalFile, name)
        monkeypatch.setattr(JournalFile, name, lambda self, *a, _real=real, _name=name: (
            reads.append(_name), _real(self, *a))[1])
    with StudyRelay(str(tmp_path / "journal.log"), "s") as relay:
        opened = list(reads)  # the one replay, when the relay opened it
        optuna.create_study(study_name="s", storage=relay.storage)
        link = _started(relay, tmp_path)
        for step in range(20):
            link.report(step, {"value": step}, step)
        assert len(relay.storage.get_trial(link.trial_id).intermediate_values) == 20
        assert reads == opened == ["read_logs"]


def test_a_writer_killed_mid_frame_loses_only_its_own_request_and_stalls_nobody(relay, tmp_path):
    host, port, token = split_relay(relay.writers_url)[1].rsplit(":", 2)
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, host, port, token],
                              stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "sent"
    link = _started(relay, tmp_path)
    link.report(0, {"value": 1.0}, 1.0)  # while the half frame waits
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    link.report(1, {"value": 2.0}, 2.0)
    assert b"killed" not in Path(tmp_path / "journal.log").read_bytes()
    assert relay.storage.get_trial(link.trial_id).intermediate_values == {0: 1.0, 1: 2.0}


_KILLED_WRITER = """
import json, socket, struct, sys, time
host, port, token = sys.argv[1:4]
sock = socket.create_connection((host, int(port)))
hello = json.dumps({"hello": token, "v": 1}).encode()
sock.sendall(struct.pack("!I", len(hello)) + hello)
sock.sendall(struct.pack("!I", 1000) + b'{"op":"report","killed":')  # 1000 announced
print("sent", flush=True)
time.sleep(600)
"""


def test_a_stranger_without_the_token_is_dropped_without_a_word(relay, tmp_path):
    host, port, _ = split_relay(relay.writers_url)[1].rsplit(":", 2)
    link = _started(relay, tmp_path)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(_frame({"hello": "0" * 32, "v": 1}) + _frame(
            {"id": 1, "op": "report", "trial": link.trial_id, "run": link.token, "step": 9,
             "metrics": {}, "value": 9.0}))
        sock.settimeout(10)
        assert sock.recv(16) == b""  # closed, no answer
    assert 9 not in relay.storage.get_trial(link.trial_id).intermediate_values


def _answer(sock: socket.socket) -> dict:
    size = struct.unpack("!I", sock.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(sock.recv(size, socket.MSG_WAITALL))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_on_the_relays_host_a_writer_reaches_it_over_a_unix_socket_a_stranger_there_is_dropped(relay, tmp_path):
    address = split_relay(relay.writers_url)[1]
    token = address.rsplit(":", 1)[1]
    name = local_socket_name(address)
    assert token not in name  # every user of the host can list the name
    link = _started(relay, tmp_path)
    report = {"id": 1, "op": "report", "trial": link.trial_id, "run": link.token, "metrics": {}}
    with socket.socket(socket.AF_UNIX) as stranger:
        stranger.connect(name)
        stranger.settimeout(10)
        stranger.sendall(_frame({"hello": "0" * 32, "v": 1}) + _frame({**report, "step": 9, "value": 9.0}))
        assert stranger.recv(16) == b""  # closed, no answer
    with socket.socket(socket.AF_UNIX) as writer:
        writer.connect(name)
        writer.settimeout(10)
        writer.sendall(_frame({"hello": token, "v": 1}))
        assert _answer(writer)["v"] == 1
        writer.sendall(_frame({**report, "step": 3, "value": 3.0}))
        assert _answer(writer) == {"id": 1, "ok": True}  # once durable
    link.report(4, {"value": 4.0}, 4.0)  # the link's own way there
    assert not link.direct
    assert relay.storage.get_trial(link.trial_id).intermediate_values == {3: 3.0, 4: 4.0}


def test_a_writer_that_finds_no_unix_socket_there_reaches_the_relay_over_tcp(tmp_path, monkeypatch):
    import hpo.store._relay as relay_module

    monkeypatch.setattr(relay_module, "local_socket_name", lambda address: None)  # as on another host
    with StudyRelay(str(tmp_path / "journal.log"), "s", control=tmp_path / "control.json") as served:
        optuna.create_study(study_name="s", storage=served.storage, direction="maximize")
        with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(local_socket_name(split_relay(served.writers_url)[1]))
        link = _started(served, tmp_path)
        link.report(0, {"value": 1.0}, 1.0)
        assert not link.direct
        assert served.storage.get_trial(link.trial_id).intermediate_values == {0: 1.0}


def test_a_frame_over_the_limit_is_refused_before_it_is_read(relay):
    host, port, token = split_relay(relay.writers_url)[1].rsplit(":", 2)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(_frame({"hello": token, "v": 1}))
        sock.settimeout(10)
        assert sock.recv(1 << 16)  # the hello's answer
        sock.sendall(struct.pack("!I", 1 << 30))  # a gigabyte announced
        assert sock.recv(16) == b""


def test_a_client_that_never_says_hello_is_closed(relay, monkeypatch):
    import hpo.store._relay as relay_module

    monkeypatch.setattr(relay_module, "HELLO_TIMEOUT_S", 0.2)
    host, port, _ = split_relay(relay.writers_url)[1].rsplit(":", 2)
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(30)
        assert sock.recv(16) == b""  # closed once its time to say hello passed


def test_without_a_reachable_relay_a_link_writes_directly_and_reads_the_control_file(tmp_path, capfd):
    with StudyRelay(str(tmp_path / "journal.log"), "s", control=tmp_path / "control.json") as relay:
        optuna.create_study(study_name="s", storage=relay.storage)
        trial_id, _ = StudyStore(relay.storage, "s").create_trial({}, {})
        StudyStore(relay.storage, "s").set_stop({"reason": "target"})
        wait_for(lambda: ControlFile(tmp_path / "control.json").decision(trial_id).stop,
                 what="the stop in the control file")
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]  # nobody listens there once closed
        url = f"{relay.url}#hpo-relay=127.0.0.1:{port}:{'ab' * 16}"
        link = TrialLink(url, trial_id, str(tmp_path / "control.json"))
        link.start({"host": "h", "pid": 1}, 1.0, 0, EMPTY)
        decision = link.report(0, {"value": 1.0}, 1.0)
        link.report(1, {"value": 2.0}, 2.0)
        assert link.direct and decision.stop == {"reason": "target"}
        relay.settle()  # the relay follows the direct appends into its replica
        assert relay.storage.get_trial(trial_id).intermediate_values == {0: 1.0, 1: 2.0}
    err = capfd.readouterr().err
    assert err.count("cannot be reached") == 1 and "control file" in err


def test_a_request_whose_answer_never_came_is_written_again_directly_and_counts_once(tmp_path):
    journal = tmp_path / "journal.log"
    storage = optuna.storages.JournalStorage(JournalFile(str(journal)))
    optuna.create_study(study_name="s", storage=storage)
    trial_id, _ = StudyStore(storage, "s").create_trial({}, {})
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_nothing():  # a relay that reads the request and dies
        sock, _ = listener.accept()
        with sock, listener:
            sock.recv(65536)
            sock.sendall(_frame({"v": 1, "epoch": 0}))
            sock.recv(65536)

    thread = threading.Thread(target=answer_nothing, daemon=True)
    thread.start()
    link = TrialLink(f"{journal}#hpo-relay=127.0.0.1:{listener.getsockname()[1]}:{'ab' * 16}",
                     trial_id)
    link.report(3, {"value": 9.0}, 9.0)
    thread.join(timeout=10)
    fresh = optuna.storages.JournalStorage(JournalFile(str(journal)))
    assert fresh.get_trial(trial_id).intermediate_values == {3: 9.0}


def test_a_study_under_the_relay_reads_back_in_plain_optuna(tmp_path):
    result = hpo.run(toy_space("plain", fixed={"steps": 4}), engine="inline", runs_dir=tmp_path,
                     progress=False)
    assert result.counts["COMPLETE"] == 8
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "plain" / "journal.log")))
    trials = optuna.load_study(study_name="plain", storage=storage).trials
    assert len(trials) == 8 and all(len(t.intermediate_values) == 4 for t in trials)


def test_workers_are_kept_from_the_relay_when_asked_and_databases_have_one(tmp_path, monkeypatch):
    with StudyRelay(f"sqlite:///{tmp_path}/s.db", "s") as relay:
        assert split_relay(relay.writers_url)[1] is not None
    monkeypatch.setenv("HPO_RELAY", "off")
    with StudyRelay(str(tmp_path / "journal.log"), "s") as relay:
        assert split_relay(relay.writers_url)[1] is None


def test_each_answer_carries_the_masters_decisions(relay, tmp_path):
    link = _started(relay, tmp_path)
    store = StudyStore(relay.storage, "s")
    assert link.report(0, {"value": 1.0}, 1.0) == Decision()
    store.set_contender(float("inf"))
    store.set_resize(link.trial_id, 2)
    store.set_stop({"reason": "target", "trial": 0})
    decision = link.report(1, {"value": 1.0}, 1.0)
    assert decision == Decision(stop={"reason": "target", "trial": 0}, resize=2, contender=float("inf"))
    control = json.loads((tmp_path / "control.json").read_text())
    assert control["stop"] == {"reason": "target", "trial": 0} and control["contender"] == "inf"


def test_a_direct_append_of_another_process_is_followed_and_judged(tmp_path):
    from hpo.master import median_pruning

    pruning = median_pruning(maximize=True, study_name="s", metric="value")
    with StudyRelay(str(tmp_path / "journal.log"), "s", pruning=pruning,
                    control=tmp_path / "control.json") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, direction="maximize")
        store = StudyStore(relay.storage, "s")
        for _ in range(2):  # two completed curves to compare with
            trial_id, _ = store.create_trial({}, {})
            for step in range(3):
                relay.storage.set_trial_intermediate_value(trial_id, step, 1.0)
            store.finish(trial_id, hpo.TrialStatus.COMPLETE, 1.0)
        bad, _ = store.create_trial({}, {})
        link = TrialLink(relay.url, bad, str(tmp_path / "control.json"))  # no relay: direct
        link.start({"host": "h", "pid": 1}, 1.0, 0, EMPTY)
        link.report(0, {"value": 0.0}, 0.0)
        wait_for(lambda: link.poll().prune, what="the prune in the control file")
        assert 0 in relay.storage.get_trial(bad).intermediate_values  # followed, not re-read


_BUSY_RELAY = """
import os, sys, time, optuna
from hpo.store import StudyRelay, StudyStore, TrialLink
with StudyRelay(sys.argv[1], "s") as relay:
    optuna.create_study(study_name="s", storage=relay.storage)
    trial_id, _ = StudyStore(relay.storage, "s").create_trial({}, {})
    link = TrialLink(relay.writers_url, trial_id)
    link.start({"host": "h", "pid": os.getpid()}, 1.0, 0, {"run": {}, "heartbeat": None,
                                                          "reports": [], "segments": []})
    step = 0
    while True:
        link.report(step, {"value": 1.0}, 1.0)
        step += 1
"""


def test_the_lock_of_a_relay_killed_while_busy_is_cleared_by_the_next_master(tmp_path):
    journal = tmp_path / "journal.log"
    lock = Path(f"{journal}.lock")
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_RELAY, str(journal)])
    try:
        wait_for(lambda: lock_holder(str(journal)) or busy.poll() is not None, what="the relay to hold the lock")
        assert busy.poll() is None, "the busy relay died"
    finally:
        busy.kill()
        busy.wait()
    assert lock.is_symlink()  # left behind: Optuna's writers would wait 30 s for it
    with StudyRelay(str(journal), "s") as relay:  # as the next hpo.run opens the study
        assert not lock.is_symlink()
        link = _started(relay, tmp_path)
        link.report(0, {"value": 1.0}, 1.0)  # no wait for a grace period


def _stopped_holding_the_lock(busy: subprocess.Popen, journal: Path) -> None:
    """Stop ``busy`` (SIGSTOP) at a moment its relay holds the journal's lock."""
    while True:
        wait_for(lambda: lock_holder(str(journal)) or busy.poll() is not None,
                 what="the relay to hold the lock")
        assert busy.poll() is None, "the busy relay died"
        busy.send_signal(signal.SIGSTOP)
        wait_for(lambda: process_stopped(busy.pid), what="the relay's process to stop")
        if (lock_holder(str(journal)) or {}).get("pid") == busy.pid:
            return
        busy.send_signal(signal.SIGCONT)  # it let go just before: again


def test_the_lock_of_a_stopped_relay_is_cleared_by_a_master_that_took_the_lease(tmp_path):
    """A master stopped (Ctrl-Z) while its relay held the journal's lock:
    the next master, which took the study's lease, removes it at once
    instead of waiting out Optuna's 30 s grace; a relay without the lease
    leaves it."""
    journal = tmp_path / "journal.log"
    lock = Path(f"{journal}.lock")
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_RELAY, str(journal)])
    try:
        _stopped_holding_the_lock(busy, journal)
        assert not clear_dead_lock(str(journal))  # a stopped process may be continued
        assert lock.is_symlink()
        with MasterLease(tmp_path) as lease, StudyRelay(str(journal), "s", lease=lease) as relay:
            assert not lock.is_symlink()
            link = _started(relay, tmp_path)
            link.report(0, {"value": 1.0}, 1.0)  # no wait for a grace period
    finally:
        busy.kill()
        busy.wait()


def test_a_live_relay_keeps_its_lock(relay, tmp_path):
    link, stop = _started(relay, tmp_path), threading.Event()
    writer = threading.Thread(target=lambda: [link.report(1, {"value": 1.0}, 1.0)
                                              for _ in iter(lambda: stop.is_set(), True)])
    writer.start()
    try:
        journal = split_relay(relay.writers_url)[0]
        wait_for(lambda: lock_holder(journal), what="the relay to hold the lock")
        assert not clear_dead_lock(journal)  # its process is alive
        assert Path(f"{journal}.lock").is_symlink()
    finally:
        stop.set()
        writer.join()


def test_the_first_end_wins_when_the_master_and_the_attempt_end_a_trial_at_once(relay, tmp_path):
    store = StudyStore(relay.storage, "s")
    links = [_started(relay, tmp_path) for _ in range(16)]
    outcomes: dict[int, object] = {}

    def worker_end(link):
        outcomes[link.trial_id] = link.end(hpo.TrialStatus.COMPLETE, [1.0],
                                           {"token": link.token, "ended_by": "worker"})

    def master_end(link):
        store.end_without_result(link.trial_id, "cancelled", "study stopped")

    threads = [threading.Thread(target=f, args=(link,)) for link in links for f in (worker_end, master_end)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for link in links:
        stored = store.trial(link.trial_id)  # a read raises nothing
        ended = outcomes.get(link.trial_id)
        if stored.state == optuna.trial.TrialState.COMPLETE:
            assert ended.won and stored.system_attrs[RUN_ATTR]["ended_by"] == "worker"
        else:  # the master's end came first: the attempt heard it
            assert ended is None or not ended.won


def test_requests_of_an_ended_trial_are_refused_and_nothing_is_written(relay, tmp_path):
    link = _started(relay, tmp_path)
    assert link.end(hpo.TrialStatus.COMPLETE, [1.0], {"token": link.token}).won
    before = Path(split_relay(relay.writers_url)[0]).read_bytes()
    for request in (lambda: link.beat(2.0), lambda: link.note(RUN_ATTR, {"token": link.token}),
                    lambda: link.event(f"{EVENT_ATTR}1-1", {"kind": "stopped"})):
        with pytest.raises(hpo.store.Halted) as refused:
            request()
        assert refused.value.why == "ended" and refused.value.status == "COMPLETE"
    assert Path(split_relay(relay.writers_url)[0]).read_bytes() == before


def test_a_relay_that_cannot_write_stops_and_its_master_hears_it(relay, tmp_path, monkeypatch):
    link = _started(relay, tmp_path)
    import hpo.store._relay as relay_module

    def full_disk(file, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(relay_module, "write_durably", full_disk)
    with pytest.raises(hpo.store.Halted) as refused:
        link.report(0, {"value": 1.0}, 1.0)  # told at once, not left waiting: its attempt stops
    assert refused.value.why == "unavailable"
    with pytest.raises(hpo.StoreUnavailable, match=r"file system holding the study is full[\s\S]*fix: free space"):
        StudyStore(relay.storage, "s").set_stop({"reason": "x"})
    assert isinstance(relay.broken, hpo.StoreUnavailable)


def test_a_trial_open_through_the_relay_pickles_into_a_task_for_another_process(relay, tmp_path):
    trial_id, number = StudyStore(relay.storage, "s").create_trial({}, {})
    task = TrialTask(storage=relay.writers_url, study_name="s", trial_id=trial_id, number=number,
                     config={}, objective="none:none", metric="value",
                     checkpoint_dir=str(tmp_path / "t"), control=str(tmp_path / "control.json"))
    script = ("import pickle, sys; from hpo.trial import open_trial; "
              "t = open_trial(pickle.loads(sys.stdin.buffer.read())); t.report(0, value=5.0)")
    import pickle

    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(task), timeout=120)
    assert done.returncode == 0
    assert relay.storage.get_trial(trial_id).intermediate_values == {0: 5.0}
    assert open_trial(task).reports == [(0, {"value": 5.0})]  # a later attempt gets them back


# ------------------------------------------------------------------ opened from the store's snapshot

PRUNINGS = {"median": median_pruning, "asha": asha_pruning}
_State = optuna.trial.TrialState


def _pruning(kind: str = "median", min_steps: int = 1):
    return PRUNINGS[kind](min_steps=min_steps, maximize=True, study_name="syn", metric="val_accuracy")


def _plain(journal: Path) -> optuna.storages.JournalStorage:
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))


def _go_on(journal: Path, seed: int) -> None:
    """What a live study writes, appended directly (as a process that cannot
    reach the relay does): reports of running trials, an end of each kind, a
    new trial that reports, the master's decisions."""
    rng = random.Random(seed)
    storage = _plain(journal)
    study = optuna.load_study(study_name="syn", storage=storage, sampler=optuna.samplers.RandomSampler(seed))
    store = StudyStore(storage, "syn")
    running = [t for t in study.get_trials(deepcopy=False) if t.state == _State.RUNNING]
    for trial in running[:4]:
        trial_id, first = StudyStore.trial_id(trial), max(trial.intermediate_values, default=-1) + 1
        for step in range(first, first + 3):
            value = rng.random()
            storage.set_trial_intermediate_value(trial_id, step, value)
            store.write(trial_id, report_key(step), {"val_accuracy": value, "loss": 1 - value})
    for trial, state in zip(running[:3], (_State.COMPLETE, _State.PRUNED, _State.FAIL)):
        storage.set_trial_state_values(StudyStore.trial_id(trial), state,
                                       [rng.random()] if state == _State.COMPLETE else None)
    new = study.ask()
    new.suggest_float("dropout", 0.0, 0.5)
    storage.set_trial_intermediate_value(new._trial_id, 0, rng.random())
    store.set_contender(rng.random())
    store.set_resize(StudyStore.trial_id(running[3]), 2)


def _learnt(value):
    """What a pruner learnt, as values that compare."""
    if isinstance(value, list):
        return [_learnt(v) for v in value]
    if hasattr(value, "__dict__"):
        return {k: _learnt(v) for k, v in vars(value).items()}
    return value


def _opened(journal: Path, pruning=None, study: str = "syn") -> dict:
    """What a master that opens the study knows: its replica, its ledger's
    answers, what its pruner learnt; and where its replay started."""
    with StudyRelay(str(journal), study, pruning=pruning) as relay:
        storage, ledger = relay.storage, relay.ledger
        study_id = storage.get_study_id_from_name(study)
        trials = storage.get_all_trials(study_id, deepcopy=False)
        ids = [StudyStore.trial_id(t) for t in trials] + [10_000]
        return {"from": relay._feed.restored_from, "trials": trials,
                "studies": [(s.study_name, s.user_attrs, s.system_attrs, s.directions)
                            for s in storage.get_all_studies()],
                "ledger": ledger.dump(), "live": [ledger.live(i) for i in ids],
                "ended": [ledger.ended(i) for i in ids], "decisions": ledger.study(),
                "objectives": ledger.objectives(), "pruning": _learnt(pruning)}


def _without_from(opened: dict) -> dict:
    return {k: v for k, v in opened.items() if k != "from"}


def _study_with_snapshot(tmp_path: Path, kind: str = "median") -> Path:
    """A synthetic study that went on (direct appends), ended under a master
    (whose relay wrote records of its own, then the snapshot), and went on
    after it: the journal."""
    run_dir = write_study(tmp_path / "syn", 150, workers=6, seed=3, name="syn")
    journal = run_dir / "journal.log"
    _go_on(journal, 0)
    with StudyRelay(str(journal), "syn", pruning=_pruning(kind)) as relay:
        assert relay._feed.restored_from is None  # no snapshot yet: the whole journal
        store = StudyStore(relay.storage, "syn")
        dropout = {"dropout": optuna.distributions.FloatDistribution(0.0, 0.5)}
        store.create_trials([({"dropout": 0.25}, dropout)] * 2)  # the next ask() takes one of them
        store.set_stop({"reason": "budget"})
        assert relay.save_snapshot()
    _go_on(journal, 1)
    return journal


def _set_snapshot_aside(journal: Path) -> None:
    snapshot = Path(f"{journal}.snapshot")
    snapshot.rename(snapshot.with_name("aside"))


@pytest.mark.parametrize("kind", PRUNINGS)
def test_a_master_opened_from_the_snapshot_and_the_tail_knows_what_a_full_replay_knows(
        tmp_path, monkeypatch, kind):
    monkeypatch.setattr(_snapshot, "SNAPSHOT_EVERY", 1)
    journal = _study_with_snapshot(tmp_path, kind)
    fresh = _learnt(_pruning(kind))
    opened = _opened(journal, _pruning(kind))
    records = journal.read_bytes().count(b"\n")
    assert opened["from"] is not None and 150 < opened["from"].records < records  # the tail replayed
    _set_snapshot_aside(journal)
    replayed = _opened(journal, _pruning(kind))
    assert replayed["from"] is None
    assert _without_from(opened) == _without_from(replayed)
    assert opened["pruning"] != fresh  # it learnt from the records, and from the snapshot
    states = {t.state for t in opened["trials"]}
    assert {_State.COMPLETE, _State.PRUNED, _State.FAIL, _State.RUNNING, _State.WAITING} <= states
    assert opened["decisions"].stop == {"reason": "budget"} and opened["decisions"].resize
    # The journal is still Optuna's: Optuna reads the same trials from it.
    assert optuna.load_study(study_name="syn", storage=_plain(journal)).trials == opened["trials"]


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _other_versions(path: Path) -> None:
    header, _, payload = path.read_bytes().partition(b"\n")
    path.write_bytes(json.dumps({**json.loads(header), "hpo": "0.0.1"}).encode() + b"\n" + payload)


def _journal_rolled_back(path: Path) -> None:
    journal = path.with_name("journal.log")
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:len(lines) // 2]))


def _written_by_a_reader(path: Path) -> None:
    """A snapshot without the relay's state (``RunDir.save_snapshot``)."""
    path.unlink()
    assert hpo.store.RunDir(path.parent).save_snapshot(min_new_records=0)


WRONG = {"a flipped byte": (_flip_payload_byte, "median"), "other versions": (_other_versions, "median"),
         "cut short": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "median"),
         "journal rolled back": (_journal_rolled_back, "median"),
         "written by a reader": (_written_by_a_reader, "median"),
         "another pruner": (lambda p: None, "asha")}


@pytest.mark.parametrize("wrong", WRONG)
def test_a_master_replays_the_journal_beside_a_snapshot_it_cannot_start_from(tmp_path, monkeypatch, wrong):
    monkeypatch.setattr(_snapshot, "SNAPSHOT_EVERY", 1)
    journal = _study_with_snapshot(tmp_path)
    change, kind = WRONG[wrong]
    change(Path(f"{journal}.snapshot"))
    opened = _opened(journal, _pruning(kind))
    assert opened["from"] is None
    _set_snapshot_aside(journal)
    assert _without_from(opened) == _without_from(_opened(journal, _pruning(kind)))


def test_a_master_of_another_study_in_the_journal_replays_it(tmp_path, monkeypatch):
    monkeypatch.setattr(_snapshot, "SNAPSHOT_EVERY", 1)
    run_dir = write_study(tmp_path / "syn", 60, workers=4, seed=4, name="syn")
    journal = run_dir / "journal.log"
    other = optuna.create_study(study_name="other", storage=_plain(journal))
    other.add_trial(optuna.trial.create_trial(value=1.0))
    with StudyRelay(str(journal), "syn") as relay:
        assert relay.save_snapshot()
    mine = _opened(journal, study="syn")
    theirs = _opened(journal, pruning=_pruning("median", min_steps=2), study="other")
    assert mine["from"] is not None and theirs["from"] is None
    _set_snapshot_aside(journal)
    assert _without_from(theirs) == _without_from(_opened(journal, _pruning("median", 2), "other"))


def test_a_study_resumed_from_its_snapshot_goes_on_and_ends_as_one(tmp_path, monkeypatch):
    import hpo.store._relay as relay_module

    monkeypatch.setattr(_snapshot, "SNAPSHOT_EVERY", 1)
    restored = []
    load = relay_module._Feed.load_snapshot
    monkeypatch.setattr(relay_module._Feed, "load_snapshot",
                        lambda feed: (found := load(feed), restored.append(found is not None))[0])
    space = toy_space("resumed", search={"algorithm": "random", "max_trials": 4, "seed": 0},
                      space={"x": {"type": "float", "low": 0.0, "high": 3.0}}, fixed={"steps": 3},
                      metric={"direction": "minimize"}, early_stopping={"pruner": "median", "min_steps": 1})
    hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    space["search"]["max_trials"] = 8
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    assert restored == [False, True]  # the second master started from the first one's snapshot
    journal = tmp_path / "resumed" / "journal.log"
    trials = optuna.load_study(study_name="resumed", storage=_plain(journal)).trials
    assert [t.number for t in trials] == list(range(8))
    assert sum(result.counts.values()) == 8 and all(t.state.is_finished() for t in trials)
    assert all(len(t.intermediate_values) >= 1 for t in trials)
    # The next master starts from the second one's snapshot, and knows what a replay knows.
    def pruning():  # the one the space asks for, as the master makes it
        return median_pruning(min_steps=1, maximize=False, study_name="resumed", metric="value")

    opened = _opened(journal, pruning(), study="resumed")
    _set_snapshot_aside(journal)
    assert opened["from"] is not None and opened["pruning"] != _learnt(pruning())
    assert _without_from(opened) == _without_from(_opened(journal, pruning(), "resumed"))


def test_a_decision_written_while_a_database_ledger_reads_the_study_reaches_the_next_answer(tmp_path):
    """The relay's thread reads the study's decisions while the master writes
    one: the view it read is not kept, so the next request sees the decision
    (and not a view up to 0.2 s old that misses a stop)."""
    from hpo.store._ledger import StorageLedger

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    optuna.create_study(study_name="s", storage=storage)
    ledger = StorageLedger(storage, "s")
    read = storage.get_study_system_attrs

    def read_as_the_master_decides(study_id):
        attrs = read(study_id)  # read before the master's write...
        storage.get_study_system_attrs = read
        StudyStore(storage, "s").set_stop({"reason": "target"})  # ...which lands now
        ledger.forget_study()  # as the master's database storage says (on_decision)
        return attrs

    storage.get_study_system_attrs = read_as_the_master_decides
    assert ledger.study().stop is None  # the read that began first
    assert ledger.study().stop == {"reason": "target"}
