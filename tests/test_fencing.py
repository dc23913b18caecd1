"""Fencing in the store: a master's run takes the study with an epoch written
into the store, and from then on nothing of an earlier run is written, on
the relay's path or around it; a report the store did not take never
returns as if it had, and the next attempt sends it again.

Real journals, real sockets on 127.0.0.1, and (at the end) real masters
stopped with SIGSTOP while another runs the study.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.errors import StoreUnavailable
from hpo.store import LEASE_FILE, Halted, JournalFile, MasterLease, StudyRelay, StudyStore, TrialLink
from hpo.trial import TrialTask, open_trial
from conftest import stderr_of, toy_space, wait_for

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

EMPTY = {"run": {}, "heartbeat": None, "reports": [], "segments": []}
STUDY = "s"


class _Lease:
    """What a relay needs of a master's lease: its token, held."""

    def __init__(self, token: str) -> None:
        self.token = token

    def still_held(self) -> bool:
        return True

    def still_mine(self) -> bool:
        return True


def _relay(tmp_path: Path, master: str) -> StudyRelay:
    relay = StudyRelay(str(tmp_path / "journal.log"), STUDY, control=tmp_path / "control.json",
                       lease=_Lease(master)).start()
    study = optuna.create_study(study_name=STUDY, storage=relay.storage, direction="maximize",
                                load_if_exists=True)
    relay.claim(relay.storage.get_study_id_from_name(STUDY))
    return relay, study


def _task(url: str, tmp_path: Path, trial_id: int, number: int, master: str) -> TrialTask:
    return TrialTask(storage=url, study_name=STUDY, trial_id=trial_id, number=number, config={},
                     objective="none:none", metric="value", checkpoint_dir=str(tmp_path / "trials" / str(number)),
                     control=str(tmp_path / "control.json"), master=master)


def _records(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "journal.log").read_bytes().splitlines()]


def _after_epoch(tmp_path: Path, epoch: int) -> list[dict]:
    """The records written after the one that took epoch ``epoch``."""
    records = _records(tmp_path)
    at = next(i for i, r in enumerate(records)
              if (r.get("system_attr") or {}).get("hpo:epoch", {}).get("epoch") == epoch)
    return records[at + 1:]


def test_each_run_takes_the_next_epoch_in_the_store_and_names_it_beside_the_journal(tmp_path):
    first, _ = _relay(tmp_path, "a")
    first.stop()
    second, _ = _relay(tmp_path, "b")
    second.stop()
    assert (first.epoch, second.epoch) == (1, 2)
    epochs = [r["system_attr"]["hpo:epoch"] for r in _records(tmp_path)
              if "hpo:epoch" in (r.get("system_attr") or {})]
    assert [(e["epoch"], e["master"]) for e in epochs] == [(1, "a"), (2, "b")]
    beside = json.loads((tmp_path / "journal.log.epoch").read_text())
    assert (beside["epoch"], beside["master"]) == (2, "b")
    # The file is a shortcut: without it the journal says the same.
    (tmp_path / "journal.log.epoch").unlink()
    third, _ = _relay(tmp_path, "c")
    third.stop()
    assert third.epoch == 3


def test_a_relay_of_an_earlier_run_writes_nothing_once_a_later_run_took_the_study(tmp_path):
    first, _ = _relay(tmp_path, "a")
    try:
        trial_id, _ = StudyStore(first.storage, STUDY).create_trial({}, {})
        link = TrialLink(first.writers_url, trial_id, str(tmp_path / "control.json"), master="a")
        link.start({"host": "here", "pid": os.getpid()}, 1.0, 0, EMPTY)
        link.report(0, {"value": 1.0}, 1.0)
        second, _ = _relay(tmp_path, "b")  # the first master slept through this
        try:
            with pytest.raises(Halted) as halted:
                link.report(1, {"value": 2.0}, 2.0)
            assert halted.value.why == "unavailable"
            with pytest.raises(StoreUnavailable, match="another master took this study over"):
                first.append_local([])
            assert first.broken is not None
        finally:
            second.stop()
    finally:
        first.stop()
    assert not [r for r in _after_epoch(tmp_path, 2) if r.get("trial_id") == trial_id]


def test_a_master_that_has_nothing_left_to_write_still_hears_it_was_taken_over(tmp_path):
    """Woken after another master ran the study to its end, a master may find
    nothing to do and write nothing: its last look at the store says so."""
    first, _ = _relay(tmp_path, "a")
    try:
        first.verify()  # its own epoch: nothing to say
        second, _ = _relay(tmp_path, "b")
        second.stop()
        with pytest.raises(StoreUnavailable, match="another master took this study over"):
            first.verify()
    finally:
        first.stop()


def test_a_master_stopped_before_it_took_the_study_does_not_take_it_from_one_that_ran_it(tmp_path):
    """Stopped between its lease and its epoch, while another master ran the
    study to its end and removed the lease: it takes no epoch, and says so."""
    with MasterLease(tmp_path, beat_s=60) as lease:
        (tmp_path / LEASE_FILE).unlink()  # the other master's end
        relay = StudyRelay(str(tmp_path / "journal.log"), STUDY, control=tmp_path / "control.json",
                           lease=lease).start()
        try:
            optuna.create_study(study_name=STUDY, storage=relay.storage, direction="maximize")
            with pytest.raises(StoreUnavailable, match="another master ran this study while this one"):
                relay.claim(relay.storage.get_study_id_from_name(STUDY))
        finally:
            relay.stop()
    assert not [r for r in _records(tmp_path) if "hpo:epoch" in (r.get("system_attr") or {})]


def test_a_write_around_the_relay_of_an_earlier_run_is_refused_under_the_journal_lock(tmp_path):
    """The relay unreachable (its master gone): the attempt writes directly,
    unless the store's epoch names another master."""
    first, _ = _relay(tmp_path, "a")
    trial_id, _ = StudyStore(first.storage, STUDY).create_trial({}, {})
    first.stop()
    url = str(tmp_path / "journal.log")  # no relay: every write goes around it
    link = TrialLink(url, trial_id, str(tmp_path / "control.json"), master="a")
    link.start({"host": "here", "pid": os.getpid()}, 1.0, 0, EMPTY)
    link.report(0, {"value": 1.0}, 1.0)  # its own master's run: written
    assert link.direct
    second, _ = _relay(tmp_path, "b")
    second.stop()
    with pytest.raises(Halted):
        link.report(1, {"value": 2.0}, 2.0)
    records = _records(tmp_path)
    assert [r["step"] for r in records if r.get("trial_id") == trial_id and r.get("op_code") == 7] == [0]
    # An attempt of the current run still writes directly.
    TrialLink(url, trial_id, str(tmp_path / "control.json"), master="b").event(
        "hpo:event:1-1", {"kind": "note"})


def _a_trial_without_its_relay(tmp_path: Path) -> tuple[int, str, str]:
    """A trial of master "a"'s run, its relay gone: its journal and control
    file, where every write goes around the relay."""
    first, _ = _relay(tmp_path, "a")
    trial_id, _ = StudyStore(first.storage, STUDY).create_trial({}, {})
    first.stop()
    return trial_id, str(tmp_path / "journal.log"), str(tmp_path / "control.json")


def test_a_superseded_attempt_of_the_same_run_writes_nothing_around_the_relay(tmp_path):
    """With the relay unreachable (or HPO_RELAY=off), a zombie attempt (its
    worker hung, the trial resumed elsewhere) wakes and writes directly: the
    run records appended since it began show another attempt holds the
    trial, and nothing of it lands."""
    trial_id, url, control = _a_trial_without_its_relay(tmp_path)
    zombie = TrialLink(url, trial_id, control, master="a")
    zombie.start({"host": "here", "pid": 1}, 1.0, 0, EMPTY)
    zombie.report(0, {"value": 1.0}, 1.0)
    newer = TrialLink(url, trial_id, control, master="a")
    newer.start({"host": "there", "pid": 2}, 2.0, 0, EMPTY)
    with pytest.raises(Halted) as halted:
        zombie.report(1, {"value": -1.0}, -1.0)
    assert halted.value.why == "superseded"
    newer.report(1, {"value": 2.0}, 2.0)
    steps = [(r["step"], r["intermediate_value"]) for r in _records(tmp_path)
             if r.get("trial_id") == trial_id and r.get("op_code") == 7]
    assert steps == [(0, 1.0), (1, 2.0)]


def test_an_attempt_started_around_the_relay_carries_on_from_the_stored_one(tmp_path):
    """Dask runs a task again when its worker dies, with the context the
    master gave it before the lost attempt began. Around the relay (its
    master stopped, SIGSTOP), the new attempt still begins from the stored
    run record, as the relay's start does: attempt 2, the lost one charged
    and named in a ``retried`` event. The same start asked again (its
    answer lost) begins nothing more."""
    trial_id, url, control = _a_trial_without_its_relay(tmp_path)
    lost = TrialLink(url, trial_id, control, master="a")
    lost.start({"host": "here", "pid": 111}, 1.0, 0, EMPTY)
    lost.report(0, {"value": 1.0}, 1.0)  # then its worker dies

    again = TrialLink(url, trial_id, control, master="a")
    run = again.start({"host": "there", "pid": 222}, 2.0, 0, EMPTY)["run"]
    assert again.direct and run["attempt"] == 2 and run["pid"] == 222
    assert [a["pid"] for a in run["previous"]] == [111]
    assert again.start({"host": "there", "pid": 222}, 2.0, 0, EMPTY)["run"] == run

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    trial = hpo.TrialRecord.from_frozen(storage.get_trial(trial_id))
    retried = [e["reason"] for e in trial.events if e["kind"] == "retried"]
    assert trial.attempt == 2 and len(retried) == 1 and "(pid 111)" in retried[0]


def test_a_journal_made_read_only_halts_an_attempt_writing_around_the_relay(tmp_path):
    """An immutable journal (chattr +i) refuses even root: the machine's
    fault, so the attempt is halted, never failed with an OSError."""
    first, _ = _relay(tmp_path, "a")
    trial_id, _ = StudyStore(first.storage, STUDY).create_trial({}, {})
    first.stop()
    journal = tmp_path / "journal.log"
    made = subprocess.run(["chattr", "+i", str(journal)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a file immutable here: {made.stderr.strip()}")
    try:
        link = TrialLink(str(journal), trial_id, str(tmp_path / "control.json"), master="a")
        with pytest.raises(Halted) as halted:
            link.start({"host": "here", "pid": 1}, 1.0, 0, EMPTY)
        assert halted.value.why == "unavailable"
    finally:
        subprocess.run(["chattr", "-i", str(journal)], check=True)


def test_a_report_the_store_did_not_take_raises_and_the_next_attempt_sends_it_again(tmp_path):
    first, _ = _relay(tmp_path, "a")
    try:
        trial_id, number = StudyStore(first.storage, STUDY).create_trial({}, {})
        trial = open_trial(_task(first.writers_url, tmp_path, trial_id, number, "a"))
        trial.report(0, value=1.0)
        second, _ = _relay(tmp_path, "b")
        try:
            with pytest.raises(Halted):
                trial.report(1, value=2.0)  # never returns as if stored
            with pytest.raises(Halted):
                trial.report(2, value=3.0)  # nor later, whatever the objective caught
            store = StudyStore(second.storage, STUDY)
            again = open_trial(_task(second.writers_url, tmp_path, trial_id, number, "b"))
            assert [step for step, _ in again.reports] == [0, 1, 2]
            second.settle()
            assert store.trial(trial_id).intermediate_values == {0: 1.0, 1: 2.0, 2: 3.0}
            assert not list((tmp_path / "trials" / str(number)).glob("hpo-unstored-*"))
        finally:
            second.stop()
    finally:
        first.stop()


def test_the_journal_lock_of_a_writer_that_slept_is_not_removed_when_it_wakes(tmp_path):
    """Optuna's own release removes whatever lock is there: a writer whose
    lock was broken while it was stopped would remove the next holder's."""
    path = str(tmp_path / "journal.log")
    lock = path + ".lock"
    Path(path).write_bytes(b"")
    sleeper, holder = JournalFile(path), JournalFile(path)
    with ExitStack() as held:
        with sleeper.locked():
            os.unlink(lock)  # broken by another writer after the grace period...
            held.enter_context(holder.locked())  # ...which holds it when the sleeper lets go
        assert os.path.islink(lock) and sleeper.lock_lost
    assert not os.path.lexists(lock) and not holder.lock_lost


def test_a_value_json_cannot_hold_is_refused_to_the_caller_and_the_relay_goes_on(tmp_path):
    """A user's pruner or sampler writes an attribute Optuna's storage cannot
    encode: Optuna raises TypeError in the caller and goes on; so does hpo."""
    relay, study = _relay(tmp_path, "a")
    try:
        with pytest.raises(TypeError):
            study.set_user_attr("last_seen", {"step": object()})
        study.set_user_attr("fine", 1)
        assert relay.broken is None
        assert optuna.load_study(study_name=STUDY, storage=optuna.storages.JournalStorage(
            JournalFile(str(tmp_path / "journal.log")))).user_attrs == {"fine": 1}
    finally:
        relay.stop()


def test_a_round_that_fails_for_a_reason_of_its_own_answers_everyone(tmp_path, monkeypatch):
    """A bug in a round must not leave its writers waiting for ever: the
    master's own append hears it as a store that stopped (exit 75)."""
    relay, study = _relay(tmp_path, "a")
    try:
        def fail(*_):
            raise RuntimeError("a bug")

        monkeypatch.setattr(relay, "_commit", fail)
        with pytest.raises(StoreUnavailable, match="relay stopped"):
            study.set_user_attr("x", 1)
        with pytest.raises(StoreUnavailable, match="relay stopped"):
            relay.append_local([])
    finally:
        relay.stop()


def test_a_record_of_an_op_code_optuna_does_not_know_is_refused_as_a_newer_optuna(tmp_path):
    relay, _ = _relay(tmp_path, "a")
    relay.stop()
    with open(tmp_path / "journal.log", "ab") as journal:
        journal.write(b'{"op_code":11,"worker_id":"next"}\n')
    from hpo.errors import UsageError
    with pytest.raises(UsageError, match="op code 11"):
        list(JournalFile(str(tmp_path / "journal.log")).read_logs(0))


# ------------------------------------------- a master that wakes late, for real

ORDERS = {
    "after the second ended": dict(relay="on", wait_second=True),
    "while the second runs": dict(relay="on", wait_second=False),
    "relay unreachable": dict(relay="off", wait_second=True),
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_a_master_that_wakes_after_another_ran_the_study_writes_nothing_more(tmp_path, order):
    """SIGSTOP the master mid-study, run the same command (a user whose study
    looks hung), SIGCONT the first after the second ended or while it runs:
    the first exits 75 with one message and writes nothing more; every
    configuration completes once."""
    from test_faults import ENV, QUALITIES, assert_each_once, command, complete, end, running_with_reports

    case = ORDERS[order]
    env = {**ENV, "HPO_RELAY": case["relay"]}
    space = toy_space("late", "hpo.examples.toy:curve", fixed={"steps": 6, "step_s": 0.3},
                      space={"quality": QUALITIES})
    runs, run_dir = tmp_path / "runs", tmp_path / "runs" / "late"
    cmd = command(tmp_path, space, runs, "--engine", "dask", "--workers", "2")
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        wait_for(lambda: len(complete(run_dir)) >= 1 and running_with_reports(run_dir),
                 what="a completed trial and one mid-way")
        first.send_signal(signal.SIGSTOP)
        lease = run_dir / "master.lease"
        wait_for(lambda: time.time() - lease.stat().st_mtime > 4, what="the stopped master's lease to go stale")
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if case["wait_second"]:
            said = stderr_of(second, timeout=240)
            assert second.returncode == 0, said
            assert not lease.exists()  # the second ended and let the study go
        else:
            wait_for(lambda: str(second.pid) in lease.read_text(), what="the second master to hold the study")
        first.send_signal(signal.SIGCONT)
        said = stderr_of(first, timeout=180)
        assert first.returncode == 75, said
        assert "another master took this study over" in said and f"pid {second.pid}" in said
        assert "Traceback" not in said
        if not case["wait_second"]:
            said = stderr_of(second, timeout=240)
            assert second.returncode == 0, said
    finally:
        end(first)
        if second is not None:
            end(second)
    assert_each_once(run_dir, "quality", QUALITIES)
    assert not (run_dir / "master.lease").exists()  # the next run is not refused


# ------------------------------- a report returns only once it is stored, for real

ACKED = '''
import time

def train(config, trial):
    """toy.curve's shape, resumed from its own checkpoint as real training
    is; each report that returned is noted outside the store."""
    value = 0.0
    done = trial.load_checkpoint() or {"step": -1}
    with open(config["acked"], "a") as acked:
        for step in range(done["step"] + 1, config["steps"]):
            time.sleep(config["step_s"])
            value = config["quality"] * (1 - 0.5 ** (step + 1))
            trial.report(step, value=value)
            acked.write(f"{trial.number} {step}\\n")
            acked.flush()
            trial.save_checkpoint({"step": step})
            if trial.should_stop():
                break
    return value
'''


def _acknowledged_but_missing(run_dir: Path, acked: Path) -> list[tuple[int, int]]:
    from hpo.store import RunDir

    stored = {(t.number, step) for t in RunDir(run_dir).load_study().trials for step in t.intermediate_values}
    said = {tuple(map(int, line.split())) for line in acked.read_text().splitlines() if line.strip()}
    return sorted(said - stored)


@pytest.mark.parametrize("fault", ["full disk", "read-only journal", "master killed"])
def test_no_report_that_returned_is_missing_from_the_store(tmp_path, dask_address, fault):
    """Whatever stops the store under running trials, every report for which
    trial.report returned is stored, and the trials stop instead of training
    on against a store that takes nothing. The workers outlive the master
    (an external scheduler, as on a cluster), so its orphans report on."""
    from conftest import tmpfs
    from test_faults import ENV, QUALITIES, assert_each_once, command, complete, end, fill, running_with_reports

    (tmp_path / "acked.py").write_text(ACKED)
    acked = tmp_path / "acked.txt"
    acked.touch()
    space = toy_space("acks", "acked:train", fixed={"steps": 12, "step_s": 0.2, "acked": str(acked)},
                      search={"parallel": 2}, space={"quality": QUALITIES[:6]})
    with ExitStack() as stack:
        runs = stack.enter_context(tmpfs(tmp_path / "fs", "16m")) if fault == "full disk" else tmp_path / "runs"
        run_dir, journal = runs / "acks", runs / "acks" / "journal.log"
        cmd = command(tmp_path, space, runs, "--engine", "dask", "--scheduler", dask_address)
        study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stack.callback(end, study)
        wait_for(lambda: complete(run_dir) and running_with_reports(run_dir), what="a trial mid-way")
        if fault == "full disk":
            filler = fill(runs)
            mend = filler.unlink
        elif fault == "read-only journal":
            made = subprocess.run(["chattr", "+i", str(journal)], capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"cannot make a file immutable here: {made.stderr.strip()}")
            stack.callback(subprocess.run, ["chattr", "-i", str(journal)], capture_output=True)
            mend = lambda: subprocess.run(["chattr", "-i", str(journal)], check=True)  # noqa: E731
        else:
            study.send_signal(signal.SIGKILL)
            mend = lambda: None  # noqa: E731
        said = stderr_of(study, timeout=120)
        assert study.returncode == (-signal.SIGKILL if fault == "master killed" else 75), said
        assert "Traceback" not in said
        # The space freed, the journal writable again, or the master gone: the same command goes on.
        mend()
        rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
        assert rerun.returncode == 0, rerun.stderr
        assert_each_once(run_dir, "quality", QUALITIES[:6])
        assert _acknowledged_but_missing(run_dir, acked) == []
