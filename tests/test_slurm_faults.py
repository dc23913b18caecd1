"""Faults users meet with hpo submit, against a real SLURM controller on this
machine (tests/slurm_cluster.py, as in test_slurm.py): a job SLURM requeues
(after it ended, or while it runs), a job that fails before its study
starts, a study its store stops (exit 75), a job sent without USER in its
environment, a site profile's partition the cluster refuses, and a
controller that cannot be reached.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, toy_space, wait_for
from slurm_cluster import unavailable_reason
from test_slurm import (CHECKPOINTED, cluster, hpo, job_info, logged_steps, output, submit,  # noqa: F401
                        trials, wait_gone)

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


def test_a_study_its_store_stopped_says_why_in_hpo_jobs(cluster, tmp_path):
    """Exit 75: the study's store stops taking writes mid-trial (its journal
    made immutable, as a full disk or another master taking the study over
    would). hpo jobs gives the study's message and fix, kept from the job's
    output, with the resume command; and the trials its dead master left
    RUNNING count as interrupted, not running, once they fell silent."""
    (tmp_path / "ckpt_steps.py").write_text(CHECKPOINTED)
    space = toy_space("readonly-slurm", "ckpt_steps:train", space={"x": [0, 1, 2]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5")
    wait_for(lambda: len({x for x, _ in logged_steps(tmp_path)}) == 2, 150, "two trials running")
    journal = run_dir / "journal.log"
    made = subprocess.run(["chattr", "+i", str(journal)], capture_output=True, text=True)
    if made.returncode != 0:
        subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)
        pytest.skip(f"cannot make a file immutable here: {made.stderr.strip()}")
    try:
        wait_gone(cluster, job_id, timeout=150)
    finally:
        subprocess.run(["chattr", "-i", str(journal)], capture_output=True)
    [job] = job_info(cluster, run_dir)
    assert job["exit_code"] == "75:0", output(job)
    shown = hpo(cluster, tmp_path, "jobs", run_dir).stdout
    assert f"the study exited with status 75: {journal}: cannot be written any more" in shown, shown
    assert "  fix: make it writable again" in shown and "see the job's output" not in shown
    assert f"resume: {job['resubmit']}" in shown
    last = last_hpo_line(output(job))
    assert last.startswith("hpo: study exited with status 75") and job["resubmit"] in last, last

    def interrupted() -> str:
        time.sleep(1)
        line = hpo(cluster, tmp_path, "jobs", run_dir).stdout.splitlines()[-1]
        return line if "2 interrupted" in line else ""
    # Nothing of the job is alive: its trials' heartbeats fall silent.
    line = wait_for(interrupted, 150, "the trials left RUNNING to count as interrupted")
    assert line.startswith("study readonly-slurm: 3 trials (") and "2 running" not in line, line


# Trial x=0 checkpoints after every step, x=1 never does.
MIXED_CHECKPOINTS = """
import time
from pathlib import Path

def train(config, trial):
    state = trial.load_checkpoint() or {"step": 0}
    for step in range(state["step"], 60):
        time.sleep(1.0)
        with open(Path(__file__).with_name("steps.log"), "a") as log:
            log.write(f"{config['x']} {step}\\n")
        trial.report(step, value=config["x"] + step / 100)
        if config["x"] == 0:
            trial.save_checkpoint({"step": step + 1})
        if trial.should_stop():
            break
    return {"value": config["x"] + 1.0}
"""


def test_a_job_requeued_while_it_runs_says_nothing_is_to_resubmit(cluster, tmp_path):
    """scontrol requeue of a running job: its run stops cleanly on SIGTERM and
    SLURM will run it again. Its output ends saying so, with no resume
    command and no "run the same command again" from the study before it;
    the trial that saved no checkpoint is not counted as suspended with one."""
    (tmp_path / "mixed_ckpt.py").write_text(MIXED_CHECKPOINTS)
    space = toy_space("requeue-running-slurm", "mixed_ckpt:train", space={"x": [0, 1]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5")
    wait_for(lambda: len({x for x, _ in logged_steps(tmp_path)}) == 2, 150, "two trials running")
    scontrol(cluster, "requeuehold", job_id)  # held once requeued: it does not start again
    try:
        wait_for(lambda: _slurm_state(cluster, job_id) == "PENDING", 120, "the job requeued")
        text = (run_dir / "jobs" / f"slurm-{job_id}.out").read_text()
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)
        wait_gone(cluster, job_id, timeout=60)
    last = last_hpo_line(text)
    assert "SLURM requeued this job" in last and "nothing to resubmit" in last, text
    assert "resume it with" not in text and "run the same command again" not in text, text
    assert "2 trials suspended, 1 of them without a checkpoint" in last, last
    assert "suspended with checkpoints" not in text


def last_hpo_line(text: str) -> str:
    """The job's last line of its own (srun may print after it)."""
    return [line for line in text.splitlines() if line.startswith("hpo: ")][-1]


def _slurm_state(cluster, job_id: str) -> str:
    time.sleep(0.5)
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=cluster.env,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def test_submit_without_a_reachable_controller_says_so(cluster, tmp_path):
    """sbatch cannot reach slurmctld (down, or the wrong SLURM_CONF): the fix
    is the controller, not the partition, QOS or account."""
    # A port bound and never listened on, for as long as sbatch runs: it
    # refuses every connection, and no other server of the test run takes it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        conf = tmp_path / "slurm.conf"
        conf.write_text(re.sub(r"^SlurmctldPort=\d+$", f"SlurmctldPort={port}", cluster.conf.read_text(),
                               flags=re.MULTILINE))
        path = tmp_path / "noctld-slurm.json"
        path.write_text(json.dumps(toy_space("noctld-slurm")))
        proc = subprocess.run([sys.executable, "-m", "hpo", "submit", str(path), "--interface", "lo",
                               "--time", "5"], cwd=tmp_path, env={**cluster.env, "SLURM_CONF": str(conf)},
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Unable to contact slurm controller" in proc.stderr, proc.stderr
    assert "the SLURM controller cannot be reached from this host" in proc.stderr
    assert "slurmctld" in proc.stderr and str(conf) in proc.stderr and "login node" in proc.stderr
    assert "--partition" not in proc.stderr and "Traceback" not in proc.stderr
