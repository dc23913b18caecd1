"""The study's relay: one reader and sequencer, group commits, decisions in the
answers, and what happens when a writer, a stranger or the relay misbehaves.

Every test runs real sockets on 127.0.0.1 against a real journal file, and
the relay the master starts (:class:`hpo.store.StudyRelay`).
"""

from __future__ import annotations

import json
import os
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
    ControlFile, Decision, JournalFile, StudyRelay, StudyStore, TrialLink, clear_dead_relay_lock,
    split_relay,
)
from hpo.store.records import EVENT_ATTR, RUN_ATTR
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
        relay.catch_up()  # the relay follows the direct appends into its replica
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
    lock, held = Path(f"{journal}.lock"), Path(f"{journal}.relay-held")
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_RELAY, str(journal)])
    try:
        wait_for(lambda: held.exists() or busy.poll() is not None, what="the relay to hold the lock")
        assert busy.poll() is None, "the busy relay died"
    finally:
        busy.kill()
        busy.wait()
    assert lock.is_symlink()  # left behind: Optuna's writers would wait 30 s for it
    with StudyRelay(str(journal), "s") as relay:  # as the next hpo.run opens the study
        assert not lock.is_symlink() and not held.exists()
        link = _started(relay, tmp_path)
        link.report(0, {"value": 1.0}, 1.0)  # no wait for a grace period


def test_a_live_relay_keeps_its_lock(relay, tmp_path):
    link, stop = _started(relay, tmp_path), threading.Event()
    writer = threading.Thread(target=lambda: [link.report(1, {"value": 1.0}, 1.0)
                                              for _ in iter(lambda: stop.is_set(), True)])
    writer.start()
    try:
        journal = split_relay(relay.writers_url)[0]
        wait_for(lambda: Path(f"{journal}.relay-held").exists(), what="the relay to hold the lock")
        assert not clear_dead_relay_lock(journal)  # its process is alive
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
