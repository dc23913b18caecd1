"""hpo submit against a real SLURM controller on this machine.

A single-node cluster (munged, slurmctld, slurmd, two fake GPUs) is started
for this module in a temp dir and stopped after (tests/slurm_cluster.py).
Studies are submitted as a user would, with ``hpo submit`` in a subprocess,
and run as real batch jobs: a Dask scheduler, workers started by srun, the
study against them, over TLS. One study hits its walltime: SLURM's USR1
stops it cleanly and a resubmission finishes it; another is cancelled
mid-trial (scancel's SIGTERM reaches every process of the job) and its
trials suspend with their checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import toy_space, wait_for
from hpo.store import RunDir, TrialStatus
from hpo.store.records import status_of
from slurm_cluster import SlurmCluster, unavailable_reason

_WHY = unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"cannot run SLURM here: {_WHY}")


@pytest.fixture(scope="module")
def cluster():
    # Under /tmp itself: munged (user munge) must reach its socket directory.
    root = Path(tempfile.mkdtemp(prefix="hpo-slurm-"))
    slurm = SlurmCluster(root, gpus=2)
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)


def hpo(cluster, cwd: Path, *args) -> subprocess.CompletedProcess:
    # The job inherits this environment (sbatch --export=ALL): SLURM_CONF
    # reaches srun inside it; --interface lo keeps Dask on 127.0.0.1.
    return subprocess.run([sys.executable, "-m", "hpo", *map(str, args)], cwd=cwd, env=cluster.env,
                          capture_output=True, text=True, timeout=120)


def submit(cluster, tmp_path: Path, space: dict, *options) -> tuple[str, Path]:
    path = tmp_path / f"{space['name']}.json"
    path.write_text(json.dumps(space))
    proc = hpo(cluster, tmp_path, "submit", path, "--interface", "lo", *options)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / space["name"]
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    assert f"submitted SLURM job {job_id}" in proc.stdout
    return job_id, run_dir


def wait_gone(cluster, job_id: str, timeout: float) -> float:
    """Wait until the job left the queue; returns the seconds waited."""
    start = time.monotonic()
    while job_id in cluster.jobs():
        if time.monotonic() - start > timeout:
            pytest.fail(f"job {job_id} still queued after {timeout} s\n{cluster.logs()}")
        time.sleep(1)
    return time.monotonic() - start


def job_info(cluster, run_dir: Path) -> list[dict]:
    proc = hpo(cluster, run_dir, "jobs", run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["jobs"]


def trials(run_dir: Path) -> list:
    return RunDir(run_dir).load_study().trials


def output(job: dict) -> str:
    return Path(job["stdout"]).read_text()


def test_dask_study_runs_to_completion(cluster, tmp_path):
    job_id, run_dir = submit(cluster, tmp_path, toy_space("toy-slurm"), "--time", "5")
    waited = wait_gone(cluster, job_id, timeout=180)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0", output(job)
    assert "hpo: study ended (exit 0)" in output(job)
    done = trials(run_dir)
    assert len(done) == 8 and all(t.state.name == "COMPLETE" for t in done)
    assert {(t.params["x"], t.params["y"]) for t in done} == {(x, y) for x in range(4) for y in (-1, 0)}
    # hpo status shows the SLURM job beside the study's progress.
    status = hpo(cluster, tmp_path, "status", run_dir)
    assert status.returncode == 0 and "SLURM jobs:" in status.stdout
    assert f"{job_id}" in status.stdout and "COMPLETED" in status.stdout
    assert_nothing_left(run_dir)
    print(f"job {job_id}: 8/8 trials complete, {waited:.0f} s from submission to the end")
    # Submitting a finished study again finds it done: no trial runs twice.
    again, _ = submit(cluster, tmp_path, toy_space("toy-slurm"), "--time", "5")
    wait_gone(cluster, again, timeout=180)
    assert job_info(cluster, run_dir)[1]["exit_code"] == "0:0"
    assert len(trials(run_dir)) == 8


def test_one_worker_per_gpu(cluster, tmp_path):
    space = toy_space("gpu-slurm", "hpo.examples.toy:sleep", resources={"gpus": 1},
                      space={"x": [0, 1, 2, 3], "sleep_s": [1.0]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5", "--gpus-per-node", "2")
    wait_gone(cluster, job_id, timeout=180)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "COMPLETED", output(job)
    assert "2 worker(s)" in output(job)
    assigned = [tuple(t.system_attrs["hpo:run"]["gpus"]) for t in trials(run_dir)]
    # Each worker sees one of the node's two GPUs; trials ran on both.
    assert len(assigned) == 4 and set(assigned) == {("0",), ("1",)}, assigned
    assert_nothing_left(run_dir)


def test_walltime_stops_cleanly_and_resubmission_resumes(cluster, tmp_path):
    """--time 1: SLURM sends USR1 15 s before the limit; the study stops cleanly
    (exit 138), which the job reports to SLURM as 0: a stop meant to be
    continued is no failure. The resubmission, queued behind it with --after,
    finishes it."""
    space = toy_space("slow-slurm", "hpo.examples.toy:slow",
                      space={"x": [0, 1, 2, 3, 4, 5], "sleep_s": [15.0]})
    first, run_dir = submit(cluster, tmp_path, space, "--time", "1", "--stop-before", "15")
    second, _ = submit(cluster, tmp_path, space, "--time", "3", "--after", first)
    wait_gone(cluster, first, timeout=150)
    jobs = job_info(cluster, run_dir)
    cut = jobs[0]
    assert (cut["state"], cut["exit_code"]) == ("COMPLETED", "0:0"), output(cut)
    ended = cut["ended"]  # what the job recorded: 128 + SIGUSR1, nothing left running
    assert (ended["exit_status"], ended["clean"], ended["left_running"]) == (138, True, 0), ended
    assert "hpo: SIGUSR1 received, stopping the study" in output(cut)
    # The printed resume command names the run directory: it works from anywhere.
    resume = output(cut).split("resume it with: ", 1)[1].splitlines()[0]
    assert resume == cut["resubmit"] and f"--runs-dir={run_dir.parent}" in resume, resume
    assert " -m hpo submit " in resume
    shown = hpo(cluster, tmp_path, "jobs", run_dir).stdout
    assert "stopped cleanly on SIGUSR1 before the walltime" in shown, shown
    complete = [t for t in trials(run_dir) if t.state.name == "COMPLETE"]
    assert len(complete) < 6, "the first job was meant to be cut short by its walltime"
    wait_gone(cluster, second, timeout=180)
    resumed = job_info(cluster, run_dir)[1]
    assert resumed["state"] == "COMPLETED" and resumed["exit_code"] == "0:0", output(resumed)
    complete = [t for t in trials(run_dir) if t.state.name == "COMPLETE"]
    assert sorted(t.params["x"] for t in complete) == [0, 1, 2, 3, 4, 5]
    assert_nothing_left(run_dir)


# An objective beside its space file that writes down what its trial sees:
# the site's set-up and the folder of the Dask worker running it.
SITE_PROBE = """
import json
import os
from pathlib import Path

def train(config, trial):
    from distributed import get_worker
    seen = {"mark": os.environ.get("HPO_SITE_MARK"), "sourced": os.environ.get("HPO_SOURCED"),
            "local_directory": get_worker().local_directory}
    Path(__file__).with_name(f"seen-{config['x']}.json").write_text(json.dumps(seen))
    return {"value": float(config["x"])}
"""


def test_site_setup_reaches_the_trials_and_dask_works_on_scratch(cluster, tmp_path):
    """A site profile's set-up lines (an export, a sourced file) run before the
    job's Python, so every trial sees them; Dask's workers keep their files
    in the profile's scratch folder, a path expanded on the node. The
    objective sits beside the space file, submitted from another directory
    with no PYTHONPATH: the job finds it, as the submission's check did."""
    study, elsewhere, scratch = tmp_path / "study", tmp_path / "elsewhere", tmp_path / "node-local"
    study.mkdir(), elsewhere.mkdir()
    (study / "site_probe.py").write_text(SITE_PROBE)
    (study / "env.sh").write_text("export HPO_SOURCED=yes\n")
    site = study / "site.toml"
    site.write_text(f'setup = ["export HPO_SITE_MARK=site-ok", "source {study}/env.sh", '
                    f'"export NODE_DISK={scratch}"]\nscratch = "$NODE_DISK/dask"\n')
    space = study / "site-slurm.json"
    space.write_text(json.dumps(toy_space("site-slurm", "site_probe:train", space={"x": [0, 1]})))
    env = {k: v for k, v in cluster.env.items() if k not in ("PYTHONPATH", "HPO_SITE")}
    proc = subprocess.run([sys.executable, "-m", "hpo", "submit", str(space), "--interface", "lo",
                           "--time", "5", "--site", str(site)], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_dir = elsewhere / "runs" / "site-slurm"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    wait_gone(cluster, job_id, timeout=180)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0", output(job)
    seen = [json.loads(p.read_text()) for p in sorted(study.glob("seen-*.json"))]
    assert len(seen) == 2, output(job)
    for trial in seen:
        assert (trial["mark"], trial["sourced"]) == ("site-ok", "yes"), trial
        assert trial["local_directory"].startswith(str(scratch / "dask") + "/"), trial
    assert (scratch / "dask" / "dask-scratch-space").is_dir()
    assert_nothing_left(run_dir)


# An objective that checkpoints after every step and logs each step it does,
# so that a step lost or done twice shows in the log.
CHECKPOINTED = """
import time
from pathlib import Path

def train(config, trial):
    state = trial.load_checkpoint() or {"step": 0}
    for step in range(state["step"], 8):
        time.sleep(1.0)
        with open(Path(__file__).with_name("steps.log"), "a") as log:
            log.write(f"{config['x']} {step}\\n")
        trial.report(step, value=config["x"] + step / 10)
        trial.save_checkpoint({"step": step + 1})
        if step < 7 and trial.should_stop():
            break
    return {"value": config["x"] + 0.7}
"""

# A client without the job's certificate: plain TCP to the scheduler's port,
# then TLS with a certificate of its own. Neither may run anything.
INTRUDER = """
import sys
from distributed import Client
from distributed.security import Security
address, marker = sys.argv[1], sys.argv[2]
for target, security in ((address.replace("tls://", "tcp://"), None), (address, Security.temporary())):
    try:
        with Client(target, security=security, timeout=3) as client:
            client.submit(open, marker, "w").result(timeout=3)
    except Exception as exc:
        print("refused:", type(exc).__name__)
"""


def logged_steps(folder: Path) -> list[tuple[int, int]]:
    log = folder / "steps.log"
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []


def test_scancel_suspends_running_trials_and_a_resubmission_finishes(cluster, tmp_path):
    """scancel mid-trial: SLURM's SIGTERM reaches every process at once. The
    workers let their running trials checkpoint and suspend, the study waits
    for them, and the job records a clean stop (exit 0, not a failure). The
    resubmission finishes every trial, no step lost or done twice. Meanwhile:
    the cluster speaks TLS only, with the job's own key, and the same study
    cannot be submitted a second time."""
    (tmp_path / "ckpt_steps.py").write_text(CHECKPOINTED)
    space = toy_space("cancel-slurm", "ckpt_steps:train", space={"x": [0, 1, 2]})
    job_id, run_dir = submit(cluster, tmp_path, space, "--time", "5")
    job_dir = run_dir / "jobs" / job_id
    wait_for(lambda: len({x for x, _ in logged_steps(tmp_path)}) == 2, 150, "two trials running")

    address = json.loads((job_dir / "scheduler.json").read_text())["address"]
    assert address.startswith("tls://127.0.0.1:"), address
    assert {oct(p.stat().st_mode & 0o777) for p in job_dir.glob("tls-*.pem")} == {"0o600"}
    marker = tmp_path / "intruder-was-here"
    intruder = subprocess.run([sys.executable, "-c", INTRUDER, address, str(marker)], text=True,
                              capture_output=True, timeout=60, env=_without_dask_config())
    assert intruder.stdout.count("refused:") == 2 and not marker.exists(), intruder.stdout + intruder.stderr

    again = hpo(cluster, tmp_path, "submit", tmp_path / "cancel-slurm.json", "--interface", "lo", "--time", "5")
    assert again.returncode == 2 and f"SLURM job {job_id} (RUNNING)" in again.stderr, again.stderr
    assert "--after " + job_id in again.stderr

    subprocess.run(["scancel", job_id], env=cluster.env, check=True)
    wait_gone(cluster, job_id, timeout=60)
    [job] = job_info(cluster, run_dir)
    assert job["state"] == "CANCELLED" and job["exit_code"] == "0:0", output(job)
    states = {t.number: status_of(t) for t in trials(run_dir)}
    assert TrialStatus.RUNNING not in states.values(), (states, output(job))
    suspended = [n for n, state in states.items() if state is TrialStatus.SUSPENDED]
    assert len(suspended) == 2, states
    for number in suspended:
        assert (run_dir / "trials" / f"{number:06d}" / "state.pkl").is_file()
    assert job["ended"]["clean"] and job["ended"]["suspended"] == 2, job["ended"]
    shown = hpo(cluster, tmp_path, "jobs", run_dir).stdout
    assert "stopped cleanly on SIGTERM" in shown and "2 trials suspended" in shown, shown
    assert_nothing_left(run_dir)

    second, _ = submit(cluster, tmp_path, space, "--time", "5")
    wait_gone(cluster, second, timeout=180)
    assert job_info(cluster, run_dir)[1]["exit_code"] == "0:0"
    done = trials(run_dir)
    assert sorted(t.params["x"] for t in done if t.state.name == "COMPLETE") == [0, 1, 2]
    steps = logged_steps(tmp_path)
    assert sorted(steps) == [(x, s) for x in range(3) for s in range(8)], steps
    assert_nothing_left(run_dir)


def _without_dask_config() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


def assert_nothing_left(run_dir: Path) -> None:
    """Every process a job started (scheduler, workers, study) ended with it."""
    deadline = time.monotonic() + 10
    while (left := _processes_mentioning(str(run_dir))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline and int(proc.name) != os.getpid():
            found.append(cmdline)
    return found
