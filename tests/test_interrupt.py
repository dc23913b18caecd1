"""Ctrl-C or SIGTERM on a running study: a clean exit, and the same command resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import hpo
from conftest import ROOT, toy_space

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_study_resumes_with_the_same_command(tmp_path, signum, code):
    space = tmp_path / "space.json"
    space.write_text(json.dumps(toy_space("ctrlc", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.5},
                                          space={"x": list(range(10))})))
    command = [sys.executable, str(ROOT / "hpo_main.py"), str(space), "--engine", "dask",
               "--workers", "2", "--runs-dir", str(tmp_path / "runs")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A suite started in the background from a script inherits SIGINT ignored;
    # a user's terminal delivers it.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run_dir = tmp_path / "runs" / "ctrlc"
    deadline = time.monotonic() + 90
    while not _complete(run_dir) >= 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers  # the embedded Dask cluster's processes
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code and "run the same command again to resume" in stderr
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == []  # the cluster was shut down, nothing orphaned
    before = {t.number: t.value for t in hpo.StudyResult.load(run_dir).trials
              if t.state is hpo.TrialStatus.COMPLETE}

    resumed = subprocess.run(command + ["--quiet"], env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    result = hpo.StudyResult.load(run_dir)
    complete = {t.number: t.value for t in result.trials if t.state is hpo.TrialStatus.COMPLETE}
    assert len(complete) == 10 and all(complete[n] == v for n, v in before.items())
    assert sorted(complete.values()) == [float(x) for x in range(10)]  # each config once


def _complete(run_dir) -> int:
    try:
        return hpo.StudyResult.load(run_dir).counts["COMPLETE"]
    except (hpo.UsageError, KeyError, ValueError):
        return 0  # not created yet
