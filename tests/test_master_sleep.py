"""A master that was itself stopped (SIGSTOP, Ctrl-Z then fg, swapping, a
stalled file system) heard no heartbeat while it slept: it must not take its
workers' silence for theirs, and the study goes on when it wakes. Nor when
only its relay was held up, the master's loop awake: the heartbeats it has
not committed yet are not silence."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpo.store import JournalFile, RunDir
from hpo.store.records import run_of
from hpo.trial import SILENT_HEARTBEATS
from conftest import stderr_of, toy_space, wait_for
from test_faults import ENV, QUALITIES, assert_each_once, command, end, running_with_reports

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

WINDOW_S = SILENT_HEARTBEATS * float(ENV["HPO_HEARTBEAT_S"])  # the silence window the master judges by


def unwritten_for(run_dir: Path) -> float:
    """Seconds since anything was written to the study's journal."""
    return time.time() - (run_dir / "journal.log").stat().st_mtime


def test_a_master_stopped_longer_than_the_silence_window_takes_no_worker_out(tmp_path):
    """The master is stopped until nothing was written for two silence
    windows, then continued: no worker is taken out as hung, and every
    configuration completes once on the embedded cluster."""
    space = toy_space("asleep", "hpo.examples.toy:curve", fixed={"steps": 8, "step_s": 0.25},
                      space={"quality": QUALITIES[:6]})
    run_dir = tmp_path / "runs" / "asleep"
    cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask", "--workers", "2")
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: running_with_reports(run_dir), what="a trial mid-way")
        study.send_signal(signal.SIGSTOP)
        wait_for(lambda: unwritten_for(run_dir) > 2 * WINDOW_S, what="two silence windows without a write")
        study.send_signal(signal.SIGCONT)
        said = stderr_of(study, timeout=180)
    finally:
        end(study)
    assert study.returncode == 0, said
    assert "stopped answering" not in said and "no Dask worker is left" not in said, said
    assert_each_once(run_dir, "quality", QUALITIES[:6])


def test_a_relay_held_up_by_its_journal_takes_no_worker_out(tmp_path):
    """Another writer holds the journal's lock (a slow shared file system
    does this) for two silence windows while trials run: the relay cannot
    commit their heartbeats meanwhile, the master's loop is awake and looks
    at them, and still no trial is given up and no worker taken out."""
    space = toy_space("held", "hpo.examples.toy:curve", fixed={"steps": 60, "step_s": 0.25},
                      space={"quality": QUALITIES[:2]})
    run_dir = tmp_path / "runs" / "held"
    cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask", "--workers", "2")
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: running_with_reports(run_dir), what="a trial mid-way")
        with JournalFile(str(run_dir / "journal.log")).locked():
            wait_for(lambda: unwritten_for(run_dir) > 2 * WINDOW_S, what="two silence windows without a write")
        said = stderr_of(study, timeout=180)
    finally:
        end(study)
    assert study.returncode == 0, said
    assert "stopped answering" not in said and "no Dask worker is left" not in said, said
    assert_each_once(run_dir, "quality", QUALITIES[:2])
    resumed = [t.number for t in RunDir(run_dir).load_study().trials if run_of(t).get("previous")]
    assert not resumed, f"trials {resumed} were given up while their relay was held up"
