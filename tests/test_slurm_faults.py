"""Faults users meet with hpo submit, against a real SLURM controller on this
machine (tests/slurm_cluster.py, as in test_slurm.py): a job SLURM requeues,
a job that fails before its study starts, a job sent without USER in its
environment, and a site profile's partition the cluster refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, toy_space
from slurm_cluster import unavailable_reason
from test_slurm import cluster, hpo, job_info, output, submit, trials, wait_gone  # noqa: F401

_WHY = unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"cannot run SLURM here: {_WHY}")

GENERIC = ROOT / "launchers" / "sites" / "generic.toml"


def scontrol(cluster, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=cluster.env, check=True, capture_output=True, timeout=30)


def test_a_requeued_job_runs_its_study_once_and_keeps_each_runs_record(cluster, tmp_path):
    """SLURM requeues a job that ended (scontrol requeue, a node failure): while
    it waits, a second submission is refused and hpo jobs does not advise one;
    when it runs again, it finds the study done, keeps its first run's record
    and ends cleanly."""
    space = toy_space("requeue-slurm", space={"x": [0, 1], "y": [0]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5")
    wait_gone(cluster, job_id, timeout=180)
    [first] = job_info(cluster, run_dir)
    assert first["state"] == "COMPLETED" and first["ended"]["exit_status"] == 0, output(first)

    scontrol(cluster, "requeuehold", job_id)  # held, so that it waits while we look
    again = hpo(cluster, tmp_path, "submit", tmp_path / "requeue-slurm.json", "--interface", "lo",
                "--time", "5")
    assert again.returncode == 2 and f"SLURM job {job_id} (PENDING) already runs" in again.stderr, \
        again.stderr
    shown = hpo(cluster, tmp_path, "jobs", run_dir).stdout
    assert "requeued by SLURM (restarts: 1)" in shown and "resume:" not in shown, shown

    scontrol(cluster, "release", job_id)
    scontrol(cluster, "update", f"jobid={job_id}", "StartTime=now")  # no requeue delay
    wait_gone(cluster, job_id, timeout=180)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0", output(job)
    assert job["ended"]["restart"] == 1 and job["ended"]["exit_status"] == 0, job["ended"]
    assert [e["restart"] for e in job["earlier_runs"]] == [0]
    assert f"SLURM requeued job {job_id}" in output(job)
    assert len(trials(run_dir)) == 2  # nothing ran twice


def test_a_job_that_ends_before_its_study_shows_why(cluster, tmp_path):
    """A set-up line breaks the job's Python: the job fails at once, and hpo
    jobs shows the end of its output, where Python said why."""
    space = toy_space("nostart-slurm", space={"x": [0], "y": [0]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5",
                             "--setup", "export PYTHONHOME=/nonexistent/python-home")
    wait_gone(cluster, job_id, timeout=120)
    shown = hpo(cluster, tmp_path, "jobs", run_dir).stdout
    assert "study: not started yet" in shown
    assert f"job {job_id} ended (FAILED 1:0) before the study started" in shown, shown
    assert "No module named 'encodings'" in shown, shown


def test_a_profiles_refused_partition_is_named_as_the_profiles(cluster, tmp_path):
    path = tmp_path / "generic-slurm.json"
    path.write_text(json.dumps(toy_space("generic-slurm")))
    refused = hpo(cluster, tmp_path, "submit", path, "--interface", "lo", "--time", "5",
                  "--site", GENERIC)  # partition = "compute": this cluster has "debug"
    assert refused.returncode == 2 and "partition" in refused.stderr.lower(), refused.stderr
    assert f"--partition compute: from the site profile {GENERIC}" in refused.stderr, refused.stderr
    assert "override with --partition NAME" in refused.stderr


def test_the_generic_profile_runs_without_USER(cluster, tmp_path):
    """Sent from cron, CI or a container, the job has no USER; the shipped
    generic profile's scratch folder names it."""
    path = tmp_path / "nouser-slurm.json"
    path.write_text(json.dumps(toy_space("nouser-slurm", space={"x": [0, 1], "y": [0]})))
    env = {k: v for k, v in cluster.env.items() if k not in ("USER", "HPO_SITE")}
    proc = subprocess.run([sys.executable, "-m", "hpo", "submit", str(path), "--interface", "lo",
                           "--time", "5", "--site", str(GENERIC), "--partition", "debug"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / "nouser-slurm"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    wait_gone(cluster, job_id, timeout=180)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0", output(job)
    assert "unbound variable" not in output(job)
    assert len(trials(run_dir)) == 2
