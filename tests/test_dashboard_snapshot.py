"""Journal snapshots: the store's (``journal.log.snapshot``) and the
dashboard's (``journal.log.views``).

A reader that starts from a snapshot must see exactly what a reader of the
whole journal sees, replaying only the records after the snapshot; a
snapshot that does not match the journal must be ignored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.dashboards import data
from hpo.dashboards.data import StoreReader
from hpo.dashboards.synthetic import write_study
from hpo.store import RunDir, StudyStore
from hpo.store import _snapshot
from hpo.store._snapshot import SnapshotJournal, records_read
from hpo.store.records import RUN_ATTR, report_key
from conftest import toy_space

SNAPSHOTS = ("journal.log.snapshot", "journal.log.views")


@pytest.fixture
def study(tmp_path) -> Path:
    """400 synthetic trials, 8 of them still running, and both snapshots."""
    run_dir = write_study(tmp_path / "syn", 400, workers=6, seed=1, name="syn")
    assert RunDir(run_dir).save_snapshot(min_new_records=0)
    assert StoreReader(run_dir, write_views=False).write_views_snapshot()
    return run_dir


def append_records(run_dir: Path) -> int:
    """What goes on in a live study: a running trial reports and finishes,
    another reports, three new trials end; the number of records appended."""
    journal = run_dir / "journal.log"
    before = journal.read_bytes().count(b"\n")
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="syn", storage=storage)
    running = [t for t in study.get_trials(deepcopy=False)
               if t.state == optuna.trial.TrialState.RUNNING]
    first, second = StudyStore.trial_id(running[0]), StudyStore.trial_id(running[1])
    storage.set_trial_system_attr(first, report_key(99), {"val_accuracy": 0.5, "loss": 0.5})
    storage.set_trial_state_values(first, optuna.trial.TrialState.COMPLETE, [0.5])
    storage.set_trial_system_attr(second, report_key(98), {"val_accuracy": 0.25, "loss": 0.75})
    template = study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE])[0]
    study.add_trials([optuna.trial.create_trial(
        state=template.state, value=0.1 * k, params=template.params,
        distributions=template.distributions, system_attrs=template.system_attrs,
        intermediate_values=template.intermediate_values) for k in range(3)])
    return journal.read_bytes().count(b"\n") - before


def replayed_records(monkeypatch) -> list[int]:
    """The numbers of the records SnapshotJournal reads from now on."""
    numbers: list[int] = []
    read_logs = SnapshotJournal.read_logs

    def counting(self, log_number_from):
        for k, record in enumerate(read_logs(self, log_number_from)):
            numbers.append(log_number_from + k)
            yield record
    monkeypatch.setattr(SnapshotJournal, "read_logs", counting)
    return numbers


def without_snapshots(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the run directory with its journal only."""
    plain = tmp_path / "plain" / run_dir.name
    plain.mkdir(parents=True)
    for name in ("journal.log", "study.json"):
        shutil.copy(run_dir / name, plain / name)
    return plain


def views(run_dir: Path) -> list:
    return list(StoreReader(run_dir, write_views=False).snapshot().trials)


def assert_same_trials(run_dir: Path, plain: Path) -> None:
    """Same trials, states, values, reports, parameters and run records, as
    views and as Optuna's trials."""
    got, expected = views(run_dir), views(plain)
    assert got == expected
    assert [t.reports for t in got] == [t.reports for t in expected]
    assert [t.distributions for t in got] == [t.distributions for t in expected]
    store = RunDir(run_dir).open_store(read_only=True)
    assert store.trials() == RunDir(plain).open_store(read_only=True).trials()


# ------------------------------------------------------------------ written and used

def test_a_cold_reader_replays_only_the_records_after_the_snapshots(study, tmp_path, monkeypatch):
    appended = append_records(study)
    journal_records = (study / "journal.log").read_bytes().count(b"\n")
    read = replayed_records(monkeypatch)
    reader = StoreReader(study, write_views=False)
    snap = reader.snapshot()
    assert read == list(range(journal_records - appended, journal_records))
    assert len(reader._finished) == 400 - 8  # the finished views came from the snapshot
    assert len(snap.trials) == 403
    read.clear()
    store = RunDir(study).open_store(read_only=True)  # the store's snapshot, for hpo status
    assert store.storage._backend.restored_from.records == journal_records - appended
    assert 1 not in store.storage._backend._offsets  # it sought the snapshot's offset, no scan
    assert len(store.trials()) == 403 and len(read) == appended
    assert_same_trials(study, without_snapshots(study, tmp_path))


def test_the_snapshot_reader_sees_new_trials_their_states_values_and_reports(study, tmp_path):
    append_records(study)
    trials = views(study)
    plain = views(without_snapshots(study, tmp_path))
    assert trials == plain
    finished = [t for t in trials if t.reports and t.reports[-1][0] == 99]
    assert len(finished) == 1 and finished[0].state is hpo.TrialStatus.COMPLETE
    assert finished[0].value == 0.5
    assert [t.value for t in trials[-3:]] == [0.0, 0.1, 0.2]
    assert sum(1 for t in trials if t.reports and t.reports[-1][0] == 98) == 1


def test_a_live_reader_started_from_the_snapshots_keeps_up(study, tmp_path):
    reader = StoreReader(study, write_views=False)
    first = reader.snapshot()
    append_records(study)
    second = reader.snapshot()
    assert second is not first and len(second.trials) == 403
    assert list(second.trials) == views(without_snapshots(study, tmp_path))


def test_the_dashboard_writes_its_snapshot_after_replaying_many_records(tmp_path, monkeypatch):
    run_dir = write_study(tmp_path / "syn", 120, workers=4, seed=2, name="syn")
    monkeypatch.setattr(data, "VIEWS_EVERY", 50)
    StoreReader(run_dir).snapshot()
    assert (run_dir / "journal.log.views").is_file()
    reader = StoreReader(run_dir)
    assert len(reader._finished) == 120 - 8
    assert list(reader.snapshot().trials) == views(without_snapshots(run_dir, tmp_path))


def test_the_master_writes_the_store_snapshot_at_the_end_of_a_study(tmp_path, monkeypatch):
    monkeypatch.setattr(_snapshot, "SNAPSHOT_EVERY", 1)
    space = toy_space("ended", space={"x": [0, 1, 2, 3]}, fixed={"steps": 3})
    hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    run_dir = tmp_path / "ended"
    assert (run_dir / "journal.log.snapshot").is_file()
    store = RunDir(run_dir).open_store(read_only=True)
    assert records_read(store.storage)[1] == 0  # nothing replayed: all in the snapshot
    assert len(store.trials()) == 4
    assert store.trials() == optuna.load_study(study_name="ended", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(run_dir / "journal.log")))).trials


# ------------------------------------------------------------------ ignored when wrong

def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def _other_versions(path: Path) -> None:
    header, _, payload = path.read_bytes().partition(b"\n")
    fields = json.loads(header)
    fields["optuna"] = "0.0.1"
    path.write_bytes(json.dumps(fields).encode() + b"\n" + payload)


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1000])


DAMAGE = {"a flipped byte": _flip_payload_byte, "other versions": _other_versions,
          "cut short": _cut_short, "not a snapshot": lambda p: p.write_bytes(b"\x00garbage\n")}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_or_foreign_snapshot_is_ignored(study, tmp_path, damage):
    append_records(study)
    for name in SNAPSHOTS:
        DAMAGE[damage](study / name)
    reader = StoreReader(study, write_views=False)
    assert reader._finished == {} and reader._store.storage._backend.restored_from is None
    assert RunDir(study).open_store(read_only=True).storage._backend.restored_from is None
    assert_same_trials(study, without_snapshots(study, tmp_path))


def _replaced(run_dir: Path, tmp_path: Path) -> None:
    """Another study's journal (a larger one) in its place."""
    other = write_study(tmp_path / "other" / "syn", 500, workers=6, seed=7, name="syn")
    shutil.copy(other / "journal.log", run_dir / "journal.log")


def _repaired(run_dir: Path, tmp_path: Path) -> None:
    """A record in the middle dropped (as a repair drops damage), new ones after."""
    journal = run_dir / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    del lines[len(lines) // 2]
    journal.write_bytes(b"".join(lines))
    append_records(run_dir)


def _rolled_back(run_dir: Path, tmp_path: Path) -> None:
    """The journal shorter than the snapshot: restored from an older copy."""
    journal = run_dir / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-20]))


@pytest.mark.parametrize("change", [_replaced, _repaired, _rolled_back], ids=lambda f: f.__name__[1:])
def test_a_snapshot_of_another_journal_prefix_is_ignored(study, tmp_path, change):
    change(study, tmp_path)
    reader = StoreReader(study, write_views=False)
    assert reader._finished == {} and reader._store.storage._backend.restored_from is None
    assert RunDir(study).open_store(read_only=True).storage._backend.restored_from is None
    assert_same_trials(study, without_snapshots(study, tmp_path))


# ------------------------------------------------------------------ without a snapshot

def test_a_study_without_a_snapshot_reads_as_before_and_gains_no_file(tmp_path, monkeypatch):
    run_dir = write_study(tmp_path / "syn", 200, workers=4, seed=3, name="syn")
    before = sorted(p.name for p in run_dir.iterdir())
    read = replayed_records(monkeypatch)
    reader = StoreReader(run_dir)
    snap = reader.snapshot()
    assert read == list(range(201))  # every record, from the first
    assert reader._store.storage._backend.restored_from is None and len(snap.trials) == 200
    assert sorted(p.name for p in run_dir.iterdir()) == before
    assert [t.number for t in snap.trials] == list(range(200))
