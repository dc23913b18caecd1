"""A store holding a record no reader can use (a value that is not a number,
a step out of range, an hpo record that is not one), however it got there:
every command still reads the study, says which record it skips and how to
set it aside, and ``hpo repair`` sets it aside."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from hpo.store import JournalFile
from conftest import ROOT, toy_space

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

POISON = {
    "values of text": {"op_code": 6, "state": 1, "values": ["abc"]},
    "values NaN": {"op_code": 6, "state": 1, "values": [math.nan]},
    "no values": {"op_code": 6, "state": 1, "values": None},
    "negative step": {"op_code": 7, "step": -7, "intermediate_value": 1.0},
    "huge step": {"op_code": 7, "step": 2**70, "intermediate_value": 1.0},
    "value of text": {"op_code": 7, "step": 3, "intermediate_value": "zz"},
    "run record a list": {"op_code": 9, "system_attr": {"hpo:run": [1, 2]}},
    "segment key": {"op_code": 9, "system_attr": {"hpo:segment:abc": {"steps": [0, 1]}}},
}


def hpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished study of two trials: copied by each test before it poisons it."""
    folder = tmp_path_factory.mktemp("clean")
    space = toy_space("p", search={"parallel": 1}, space={"x": [0, 1], "y": [0]})
    (folder / "space.json").write_text(json.dumps(space))
    done = hpo("run", "space.json", "--engine", "inline", "--runs-dir", "runs", "--quiet", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


def _poisoned(study: Path, tmp_path: Path, poison: dict) -> Path:
    subprocess.run(["cp", "-r", str(study / "runs"), str(tmp_path / "runs")], check=True)
    (tmp_path / "space.json").write_text((study / "space.json").read_text())
    journal = tmp_path / "runs" / "p" / "journal.log"
    storage = optuna.storages.JournalStorage(JournalFile(str(journal)))
    trial_id = storage.create_new_trial(storage.get_study_id_from_name("p"))
    record = {"worker_id": "stranger", "trial_id": trial_id, **poison}
    if record["op_code"] == 6:
        record["datetime_complete"] = "2026-11-27T00:00:00.000000"
    with open(journal, "a") as f:  # Python's JSON writes NaN as Optuna's journal does
        f.write(json.dumps(record) + "\n")
    return tmp_path


@pytest.mark.parametrize("poison", list(POISON))
def test_every_command_reads_a_study_holding_a_record_it_cannot_use(study, tmp_path, poison):
    folder = _poisoned(study, tmp_path, POISON[poison])
    for command in (["status", "runs/p"], ["export", "runs/p", "--format", "json"],
                    ["report", "runs/p", "-o", str(tmp_path / "report.html")]):
        done = hpo(*command, cwd=folder)
        assert done.returncode == 0, (command, done.stderr)
        assert "is skipped" in done.stderr and "hpo repair" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    from hpo.dashboards.data import load_snapshot

    assert [t.number for t in load_snapshot(folder / "runs" / "p").trials][:2] == [0, 1]
    # The study goes on: the trial whose end was unusable runs again.
    done = hpo("run", "space.json", "--engine", "inline", "--runs-dir", "runs", "--quiet", cwd=folder)
    assert done.returncode == 0, done.stderr


def test_repair_sets_the_unusable_records_aside_and_the_warning_goes(study, tmp_path):
    folder = _poisoned(study, tmp_path, POISON["values of text"])
    repaired = hpo("repair", "runs/p", cwd=folder)
    assert repaired.returncode == 0, repaired.stderr
    assert "set aside the record at byte" in repaired.stdout and "not all finite numbers" in repaired.stdout
    (aside,) = (folder / "runs" / "p").glob("journal.log.unusable-*")
    assert json.loads(aside.read_text())["values"] == ["abc"]  # kept, not lost
    done = hpo("status", "runs/p", cwd=folder)
    assert done.returncode == 0 and "is skipped" not in done.stderr, done.stderr
    again = hpo("repair", "runs/p", cwd=folder)
    assert "nothing to repair" in again.stdout
