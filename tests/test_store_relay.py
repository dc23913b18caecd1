"""The study's relay: group commits, and what happens when a writer or the relay dies.

Every test runs real processes or sockets on 127.0.0.1 against a real journal
file; the relay is the one ``hpo.run`` starts (``serve_journal``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.store import StudyStore, open_storage
from hpo.store._journal import JournalFile
from hpo.store.records import HEARTBEAT_ATTR, RUN_ATTR
from hpo.store._relay import (
    RELAY_MARK, JournalRelay, RelayClient, clear_dead_relay_lock, serve_journal, split_relay,
)
from conftest import toy_space

RECORD = b'{"op_code":7,"worker_id":"w","trial_id":0,"step":%d,"intermediate_value":%d}\n'


def _frame(data: bytes) -> bytes:
    return struct.pack("!I", len(data)) + data


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.fixture
def journal(tmp_path) -> Path:
    return tmp_path / "journal.log"


def test_many_writers_share_rounds_and_each_batch_lands_once(journal):
    with serve_journal(str(journal)) as url:
        path, address = split_relay(url)
        client = RelayClient(address)
        threads = [threading.Thread(target=lambda n=n: [client.append(RECORD % (n, i))
                                                         for i in range(200)]) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = _lines(journal)
    assert sorted(lines) == sorted(RECORD % (n, i) for n in range(8) for i in range(200))
    for n in range(8):  # each writer's records in the order it sent them
        mine = [line for line in lines if line.startswith(b'{"op_code":7,"worker_id":"w","trial_id":0,"step":%d,' % n)]
        assert mine == [RECORD % (n, i) for i in range(200)]


def test_an_append_is_durable_when_acknowledged(journal):
    relay = JournalRelay(str(journal)).start()
    try:
        client = RelayClient(relay.address)
        assert client.append(RECORD % (1, 1)) is True
        assert _lines(journal) == [RECORD % (1, 1)]  # on disk before append returned
    finally:
        relay.stop()


_KILLED_WRITER = """
import socket, struct, sys, time
host, port, token = sys.argv[1].rsplit(":", 2)
sock = socket.create_connection((host, int(port)))
token = bytes.fromhex(token)
sock.sendall(struct.pack("!I", len(token)) + token)
sock.sendall(struct.pack("!I", 1000) + b'{"op_code":7,"worker_id":"killed"')  # 1000 announced
print("sent", flush=True)
time.sleep(600)
"""


def test_a_writer_killed_mid_batch_loses_only_its_unacknowledged_batch_and_stalls_nobody(journal):
    relay = JournalRelay(str(journal)).start()
    try:
        killed = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, relay.address],
                                  stdout=subprocess.PIPE, text=True)
        assert killed.stdout.readline().strip() == "sent"
        client = RelayClient(relay.address)
        assert client.append(RECORD % (1, 1)) is True  # while the half batch waits
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        done = threading.Event()
        threading.Thread(target=lambda: (client.append(RECORD % (1, 2)), done.set()), daemon=True).start()
        assert done.wait(10), "a writer killed mid-batch stalled the others"
    finally:
        relay.stop()
    assert _lines(journal) == [RECORD % (1, 1), RECORD % (1, 2)]
    assert b"killed" not in journal.read_bytes()


def test_a_stranger_without_the_token_cannot_write(journal):
    relay = JournalRelay(str(journal)).start()
    try:
        host, port, _ = relay.address.rsplit(":", 2)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(_frame(b"0" * 16) + _frame(RECORD % (6, 6)))
            sock.settimeout(10)
            assert sock.recv(16) == b""  # dropped without an answer
        assert RelayClient(relay.address).append(RECORD % (1, 1)) is True
    finally:
        relay.stop()
    assert _lines(journal) == [RECORD % (1, 1)]


def test_without_a_reachable_relay_a_writer_appends_directly_and_says_so(journal, capfd):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nobody listens there once closed
    backend = JournalFile(str(journal), relay=f"127.0.0.1:{port}:{'ab' * 16}")
    backend.append_logs([{"op_code": 7, "worker_id": "w", "trial_id": 0, "step": 0,
                          "intermediate_value": 1.0}])
    backend.append_logs([{"op_code": 7, "worker_id": "w", "trial_id": 0, "step": 1,
                          "intermediate_value": 2.0}])
    assert [json.loads(line)["step"] for line in _lines(journal)] == [0, 1]
    err = capfd.readouterr().err
    assert err.count("cannot be reached") == 1 and "appends to the journal directly" in err


def _one_shot_relay(journal: Path, commit: bool) -> tuple[str, threading.Thread]:
    """A relay that dies after receiving one batch, before acknowledging it;
    with ``commit`` it had written the batch first."""
    listener = socket.create_server(("127.0.0.1", 0))
    token = os.urandom(16)

    def serve():
        sock, _ = listener.accept()
        with sock, listener:
            buffer = b""
            while True:
                buffer += sock.recv(65536)
                if len(buffer) >= 4 + 16 + 4:
                    size = struct.unpack("!I", buffer[20:24])[0]
                    if len(buffer) >= 24 + size:
                        break
            if commit:
                with open(journal, "ab") as f:
                    f.write(buffer[24:24 + size])
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{listener.getsockname()[1]}:{token.hex()}", thread


@pytest.mark.parametrize("committed", [True, False])
def test_a_batch_the_relay_died_on_is_written_exactly_once(journal, committed):
    address, relay = _one_shot_relay(journal, committed)
    backend = JournalFile(str(journal), relay=address)
    log = {"op_code": 7, "worker_id": "w", "trial_id": 0, "step": 3, "intermediate_value": 9.0}
    backend.append_logs([log])
    relay.join(timeout=10)
    assert [json.loads(line) for line in _lines(journal)] == [log]


def test_a_study_under_the_relay_reads_back_in_plain_optuna(tmp_path):
    result = hpo.run(toy_space("plain", fixed={"steps": 4}), engine="inline", runs_dir=tmp_path,
                     progress=False)
    assert result.counts["COMPLETE"] == 8
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "plain" / "journal.log")))
    trials = optuna.load_study(study_name="plain", storage=storage).trials
    assert len(trials) == 8 and all(len(t.intermediate_values) == 4 for t in trials)


def test_the_relay_is_off_when_asked_and_for_databases(tmp_path, monkeypatch):
    with serve_journal(f"sqlite:///{tmp_path}/s.db") as url:
        assert url == f"sqlite:///{tmp_path}/s.db"
    monkeypatch.setenv("HPO_RELAY", "off")
    with serve_journal(str(tmp_path / "journal.log")) as url:
        assert RELAY_MARK not in url


def _reporting_process(url: str, trial_id: int, reports: int, ready) -> None:
    store = StudyStore(open_storage(url), "s")
    ready.set()
    for step in range(reports):
        store.report(trial_id, step, {"value": float(step)}, "value")


def test_a_report_to_a_trial_finished_meanwhile_is_refused_at_the_next_read(journal):
    with serve_journal(str(journal)) as url:
        study = optuna.create_study(study_name="s", storage=open_storage(url))
        trial = study.ask()
        store = StudyStore.of(study)
        store.finish(store.trial_id(trial), hpo.TrialStatus.COMPLETE, 1.0)
        store.report(store.trial_id(trial), 0, {"value": 2.0}, "value")
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
            store.trial(store.trial_id(trial))
    assert StudyStore(open_storage(str(journal)), "s").trials()[0].intermediate_values == {}


def test_processes_reporting_through_the_relay_are_read_back_whole(journal):
    with serve_journal(str(journal)) as url:
        study = optuna.create_study(study_name="s", storage=open_storage(url))
        ids = [StudyStore.trial_id(study.ask()) for _ in range(4)]
        ctx = mp.get_context("spawn")
        ready = [ctx.Event() for _ in ids]
        procs = [ctx.Process(target=_reporting_process, args=(url, i, 300, r)) for i, r in zip(ids, ready)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
            assert proc.exitcode == 0
    trials = StudyStore(open_storage(str(journal)), "s").trials()
    assert [t.intermediate_values for t in trials] == [{s: float(s) for s in range(300)}] * 4


_BUSY_RELAY = """
import sys
from hpo.store._relay import serve_journal, split_relay, RelayClient
with serve_journal(sys.argv[1]) as url:
    client = RelayClient(split_relay(url)[1])
    while True:
        client.append(b'{"op_code":7,"worker_id":"w","trial_id":0,"step":1,"intermediate_value":1}\\n')
"""


def test_the_lock_of_a_relay_killed_while_busy_is_cleared_by_the_next_master(journal):
    lock, held = Path(f"{journal}.lock"), Path(f"{journal}.relay-held")
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_RELAY, str(journal)])
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert time.monotonic() < deadline and busy.poll() is None, "the relay never held the lock"
            time.sleep(0.05)
    finally:
        busy.kill()
        busy.wait()
    assert lock.is_symlink()  # left behind: Optuna's writers would wait 30 s for it
    with serve_journal(str(journal)) as url:  # as the next hpo.run starts its relay
        assert not lock.is_symlink() and not held.exists()
        started = time.monotonic()
        JournalFile(str(journal)).append_direct(RECORD % (2, 2))  # no wait for a grace period
        assert time.monotonic() - started < 10
        assert RelayClient(split_relay(url)[1]).append(RECORD % (3, 3)) is True


def test_a_live_relay_keeps_its_lock(journal):
    with serve_journal(str(journal)) as url:
        client, stop = RelayClient(split_relay(url)[1]), threading.Event()
        writer = threading.Thread(target=lambda: [client.append(RECORD % (1, 1))
                                                  for _ in iter(lambda: stop.is_set(), True)])
        writer.start()
        try:
            deadline = time.monotonic() + 30
            while not Path(f"{journal}.relay-held").exists():
                assert time.monotonic() < deadline, "the relay never held the lock"
                time.sleep(0.01)
            assert not clear_dead_relay_lock(str(journal))  # its process is alive
            assert Path(f"{journal}.lock").is_symlink()
        finally:
            stop.set()
            writer.join()


def test_the_first_end_of_a_trial_wins_and_a_later_one_is_refused_without_an_error(journal):
    """Threads of one process end trials at once, each trial twice: one end
    wins, the other hears False, and no reader of the process sees an error."""
    with serve_journal(str(journal)) as url:
        study = optuna.create_study(study_name="s", storage=open_storage(url))
        store = StudyStore.of(study)
        ids = [store.trial_id(study.ask()) for _ in range(16)]
        won: dict[tuple[int, float], bool] = {}

        def end(trial_id: int, value: float) -> None:
            won[trial_id, value] = store.finish(trial_id, hpo.TrialStatus.COMPLETE, value,
                                                run={"ended_by": value})
        threads = [threading.Thread(target=end, args=(i, v)) for i in ids for v in (1.0, 2.0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(t.state.is_finished() for t in store.trials())  # a read raises nothing
    fresh = StudyStore(open_storage(str(journal)), "s")
    for trial_id in ids:
        winner = [v for v in (1.0, 2.0) if won[trial_id, v]]
        assert len(winner) == 1, won
        stored = fresh.trial(trial_id)
        assert stored.values == winner and stored.system_attrs[RUN_ATTR] == {"ended_by": winner[0]}


def test_a_heartbeat_or_start_record_on_an_ended_trial_is_dropped_without_an_error(journal):
    """A worker may beat once more for a trial the master ended meanwhile: the
    note is dropped, the trial's stored record stays, and no read raises."""
    with serve_journal(str(journal)) as url:
        study = optuna.create_study(study_name="s", storage=open_storage(url))
        store = StudyStore.of(study)
        trial_id = store.trial_id(study.ask())
        assert store.finish(trial_id, hpo.TrialStatus.COMPLETE, 1.0, run={"ended_by": "worker"})
        store.beat(trial_id)
        store.note(trial_id, RUN_ATTR, {"started_by": "late worker"})
        stored = store.trial(trial_id)  # a read after the notes raises nothing
    assert stored.system_attrs[RUN_ATTR] == {"ended_by": "worker"}
    fresh = StudyStore(open_storage(str(journal)), "s").trial(trial_id)
    assert fresh.system_attrs[RUN_ATTR] == {"ended_by": "worker"} and fresh.values == [1.0]
    assert HEARTBEAT_ATTR not in fresh.system_attrs
