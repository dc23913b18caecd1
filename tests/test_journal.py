"""A damaged journal is never made worse, and ``hpo repair`` salvages it.

Each test damages a copy of a real journal written by ``hpo run`` (inline
engine) the way a crash or a bad disk would. A torn tail (damage after the
last intact record) is set aside by the next append, whoever makes it; damage
followed by intact records is refused (exit 2, the file unchanged) until
``hpo repair`` salvages the intact records.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.store import RunDir, StudyStore, open_storage

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
SPACE = {"name": "tiny", "objective": "hpo.examples.toy:quadratic", "metric": {"name": "value"},
         "space": {"x": [0, 1, 2], "y": [0, -1]}}
GRID = {(x, y) for x in ("0", "1", "2") for y in ("0", "-1")}


def hpo(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def resume(run_dir: Path) -> subprocess.CompletedProcess:
    """The same ``hpo run`` again, with no trial budget: the whole grid."""
    return hpo("run", run_dir.parent / "space.json", "--engine", "inline", "--runs-dir",
               run_dir.parent, "--quiet")


def completed(run_dir: Path) -> list[tuple[str, str]]:
    """The configurations of the COMPLETE trials, from ``hpo export``."""
    rows = csv.DictReader(io.StringIO(ok(hpo("export", run_dir)).stdout))
    return [(r["params.x"], r["params.y"]) for r in rows if r["state"] == "COMPLETE"]


def aside(run_dir: Path, kind: str) -> list[Path]:
    return sorted(run_dir.glob(f"journal.log.{kind}-*"))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A run directory with 4 of the 6 grid trials done, written once."""
    base = tmp_path_factory.mktemp("written")
    (base / "space.json").write_text(json.dumps(SPACE))
    ok(hpo("run", base / "space.json", "--engine", "inline", "--max-trials", "4",
           "--runs-dir", base, "--quiet"))
    return base / "tiny"


@pytest.fixture
def run_dir(written: Path, tmp_path: Path) -> Path:
    """A copy of the written run directory, for one test to damage."""
    shutil.copy(written.parent / "space.json", tmp_path / "space.json")
    shutil.copytree(written, tmp_path / "tiny")
    return tmp_path / "tiny"


# ------------------------------------------------------------------ torn tail


def test_a_cut_off_last_write_is_set_aside_and_the_study_resumes(run_dir):
    journal = run_dir / "journal.log"
    data = journal.read_bytes()
    journal.write_bytes(data[:-40])
    ok(hpo("status", run_dir))  # readers skip the torn line

    proc = ok(resume(run_dir))
    assert "its last write was cut off" in proc.stderr and "set aside" in proc.stderr
    [torn] = aside(run_dir, "torn")
    last_line = data.rfind(b"\n", 0, len(data) - 1) + 1
    assert torn.read_bytes() == data[last_line:-40]
    assert str(torn) in proc.stderr
    ok(hpo("status", run_dir))
    assert sorted(completed(run_dir)) == sorted(GRID)
    assert journal.read_bytes().startswith(data[:last_line])


@pytest.mark.parametrize("garbage", [b"\x00\x00garbage from a bad disk",
                                     b"garbage\n{\"op_code\": truncated\n"],
                         ids=["no-final-newline", "final-newline"])
def test_garbage_after_the_last_record_is_set_aside(run_dir, garbage):
    journal = run_dir / "journal.log"
    data = journal.read_bytes()
    journal.write_bytes(data + garbage)
    ok(hpo("status", run_dir))

    ok(resume(run_dir))
    [torn] = aside(run_dir, "torn")
    assert torn.read_bytes() == garbage
    assert journal.read_bytes().startswith(data)
    assert sorted(completed(run_dir)) == sorted(GRID)


def test_a_worker_append_sets_a_torn_tail_aside(run_dir, capsys):
    """Not only the master: any process appending through the store does it."""
    journal = run_dir / "journal.log"
    journal.write_bytes(journal.read_bytes()[:-40])  # trial 3's end, torn: it reads as running
    storage = open_storage(str(journal))
    [running] = [t for t in storage.get_all_trials(0) if t.state.name == "RUNNING"]
    storage.set_trial_system_attr(StudyStore.trial_id(running), "hpo:heartbeat", 1.0)

    assert "set aside" in capsys.readouterr().err
    assert len(aside(run_dir, "torn")) == 1
    trials = RunDir(run_dir).open_store(read_only=True).trials()
    assert len(trials) == 4
    assert trials[running.number].system_attrs["hpo:heartbeat"] == 1.0


# ------------------------------------------------------ damage in the middle


def _cut_in_the_middle(data: bytes) -> tuple[bytes, int]:
    """40 bytes gone across the end of a report line and the start of the next."""
    at = data.index(b'{"op_code":7') + 120
    return data[:at] + data[at + 40:], at


def _zeros_in_the_middle(data: bytes) -> tuple[bytes, int]:
    """512 NUL bytes written over trial 0's reports."""
    at = data.index(b'{"op_code":7') + 20
    return data[:at] + b"\0" * 512 + data[at + 512:], at


@pytest.mark.parametrize("damage", [_cut_in_the_middle, _zeros_in_the_middle],
                         ids=["cut", "nul-bytes"])
def test_damage_in_the_middle_is_refused_until_repaired(run_dir, damage):
    journal = run_dir / "journal.log"
    data, at = damage(journal.read_bytes())
    journal.write_bytes(data)
    start = data.rfind(b"\n", 0, at) + 1  # the damaged line

    for proc in (resume(run_dir), hpo("status", run_dir), hpo("export", run_dir)):
        assert proc.returncode == 2, proc.stderr
        assert f"damaged at byte {start}" in proc.stderr
        assert f"hpo repair {run_dir}" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert journal.read_bytes() == data
    assert [p.name for p in run_dir.glob("journal.log.*")] == ["journal.log.epoch"]  # set aside: none

    proc = ok(hpo("repair", run_dir))
    assert f"dropped bytes {start}-" in proc.stdout
    assert "warning: the dropped bytes may have held records" in proc.stdout
    assert "no trial id has shifted" in proc.stdout
    [original] = aside(run_dir, "damaged")
    assert original.read_bytes() == data
    assert f"kept as {original}" in proc.stdout
    ok(hpo("status", run_dir))
    ok(resume(run_dir))
    assert sorted(completed(run_dir)) == sorted(GRID)


@pytest.mark.parametrize("skip", [30, 2], ids=["creation-readable", "creation-unreadable"])
def test_repair_refuses_when_a_trial_creation_is_lost(run_dir, skip):
    """Dropping a trial's creation would shift every later trial's id."""
    journal = run_dir / "journal.log"
    data = journal.read_bytes()
    second_creation = data.index(b'{"op_code":4', data.index(b'{"op_code":4') + 1)
    data = data[:second_creation + skip] + b"\0" * 40 + data[second_creation + skip + 40:]
    journal.write_bytes(data)

    proc = hpo("repair", run_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot be repaired faithfully" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert journal.read_bytes() == data
    assert [p.name for p in run_dir.glob("journal.log.*")] == ["journal.log.epoch"]  # set aside: none


# ------------------------------------------------------------ nothing to do


def test_repair_leaves_an_intact_journal_alone(run_dir):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    proc = ok(hpo("repair", run_dir))
    assert "nothing to repair" in proc.stdout
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_repair_is_for_the_journal_only(run_dir, tmp_path):
    info = json.loads((run_dir / "study.json").read_text())
    (run_dir / "study.json").write_text(json.dumps({**info, "storage": f"sqlite:///{tmp_path}/s.db"}))
    proc = hpo("repair", run_dir)
    assert proc.returncode == 2 and "for the journal file only" in proc.stderr

    (run_dir / "study.json").write_text(json.dumps(info))
    (run_dir / "journal.log").unlink()
    proc = hpo("repair", run_dir)
    assert proc.returncode == 2 and "journal.log is missing" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_damaged_journal_given_as_storage_is_refused_with_its_repair(run_dir, tmp_path):
    data, at = _cut_in_the_middle((run_dir / "journal.log").read_bytes())
    journal = tmp_path / "elsewhere.log"
    journal.write_bytes(data)
    proc = hpo("run", run_dir.parent / "space.json", "--engine", "inline", "--storage", journal,
               "--runs-dir", tmp_path / "runs", "--quiet")
    start = data.rfind(b"\n", 0, at) + 1  # the damaged line
    assert proc.returncode == 2, proc.stderr
    assert f"damaged at byte {start}" in proc.stderr
    assert "hpo repair" in proc.stderr and "Traceback" not in proc.stderr
    assert journal.read_bytes() == data and not (tmp_path / "runs" / "tiny").exists()


# -- the journal's lock, left by a writer that died ------------------------------------

_HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from hpo.store import JournalFile
with JournalFile(sys.argv[1]).locked():
    Path(sys.argv[2]).write_text("held")
    time.sleep(600)
"""


def _holding_the_lock(journal: Path, tmp_path: Path) -> subprocess.Popen:
    """A process that holds the journal's lock until it is killed."""
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_LOCK, str(journal), str(ready)], env=ENV)
    from conftest import wait_for

    wait_for(lambda: ready.exists() or holder.poll() is not None, what="the lock to be held")
    assert holder.poll() is None, "the holder died"
    return holder


def test_a_lock_left_by_a_writer_killed_inside_an_append_is_broken_at_once(tmp_path, capsys):
    """Optuna's writers wait out a 30 s grace for a lock nobody releases; a
    lock whose holder died on this host is broken by the next writer at
    once. The grace is made endless here: only that can let the append in."""
    from hpo.store import HELD_SUFFIX, LOCK_SUFFIX, JournalFile, clear_dead_lock

    journal = tmp_path / "journal.log"
    journal.write_bytes(b"")
    holder = _holding_the_lock(journal, tmp_path)
    held = json.loads(Path(f"{journal}{HELD_SUFFIX}").read_text())
    assert held["pid"] == holder.pid and Path(f"{journal}{LOCK_SUFFIX}").is_symlink()
    assert not clear_dead_lock(str(journal))  # alive: its lock is its own
    holder.kill()
    holder.wait()

    writer = JournalFile(str(journal), create=False)
    writer._journal_lock.grace_period = None  # no grace: only the dead holder's lock may be broken
    record = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n'
    assert writer.append_direct(record)
    assert journal.read_bytes() == record
    assert not Path(f"{journal}{LOCK_SUFFIX}").exists()
    assert f"removed the journal lock that process {holder.pid}" in capsys.readouterr().err


def test_a_lock_named_by_another_host_is_left_to_the_grace_period(tmp_path):
    """A writer on another node cannot be seen from here: its lock stays
    until Optuna's grace runs out, unless it was a relay and the caller is
    the study's next master."""
    from hpo.store import HELD_SUFFIX, clear_dead_lock

    journal = tmp_path / "journal.log"
    journal.write_bytes(b"")
    holder = _holding_the_lock(journal, tmp_path)
    holder.kill()
    holder.wait()
    marker = Path(f"{journal}{HELD_SUFFIX}")
    held = json.loads(marker.read_text())
    marker.write_text(json.dumps({**held, "host": "another-node"}))
    assert not clear_dead_lock(str(journal), relays_gone=True)  # a writer's: alive for all we know
    marker.write_text(json.dumps({**held, "host": "another-node", "role": "relay"}))
    assert clear_dead_lock(str(journal), relays_gone=True)


def test_a_lock_that_cannot_be_named_is_held_and_released_all_the_same(tmp_path):
    """A full disk may refuse the marker: the append goes on under the lock,
    and the lock is let go after it (never left for the grace period)."""
    from hpo.store import HELD_SUFFIX, LOCK_SUFFIX, JournalFile

    journal = tmp_path / "journal.log"
    journal.write_bytes(b"")
    Path(f"{journal}{HELD_SUFFIX}").mkdir()  # writing the marker fails (IsADirectoryError)
    record = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n'
    assert JournalFile(str(journal), create=False).append_direct(record)
    assert journal.read_bytes() == record and not Path(f"{journal}{LOCK_SUFFIX}").exists()
