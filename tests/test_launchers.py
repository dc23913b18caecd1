"""hpo submit / hpo jobs without SLURM: the enqueue_compss command line, the
Dask batch script (bash -n, shellcheck), --dry-run, bad options, and the
provider's text handling against a recorded command runner.

The same code runs against a real SLURM controller in test_slurm.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, toy_space
from hpo.launchers import JobState, SlurmProvider, SrunLauncher, SubmitError
from hpo.launchers.dask_node import worker_settings
from hpo.launchers.records import append_job, read_jobs, write_ending
from hpo.launchers.request import BatchRequest
from hpo.launchers.states import from_slurm
from hpo.store import MasterLease

# hpo, space: tests/conftest.py; no site profile of this machine's user leaks in.
pytestmark = pytest.mark.usefixtures("no_user_site")

# The enqueue_compss flags DESIGN.md lists (COMPSs 3.3 sources).
ENQUEUE_FLAGS = {"--num_nodes", "--exec_time", "--qos", "--queue", "--project_name",
                 "--cpus_per_node", "--gpus_per_node", "--worker_in_master_cpus",
                 "--worker_in_master_memory", "--worker_working_dir", "--master_working_dir",
                 "--log_dir", "--job_dependency", "--sc_cfg", "--pythonpath", "--node_memory",
                 "--python_interpreter", "--wall_clock_limit", "--env_script", "--pre_env_script"}


@pytest.fixture
def gpu_space(tmp_path) -> Path:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(toy_space("gpu", "hpo.examples.toy:sleep", resources={"gpus": 1})))
    return path


# ---------------------------------------------------------------- enqueue_compss


def compss_argv(hpo, space, *options) -> list[str]:
    status, out, err = hpo("submit", space, "--engine", "compss", "--dry-run", *options)
    assert status == 0, err
    return shlex.split(out)


def flags_of(argv: list[str]) -> dict[str, str]:
    """enqueue_compss's own --flag=value options (before the application)."""
    app = next(i for i, a in enumerate(argv) if a.endswith("hpo_main.py"))
    return dict(a.split("=", 1) for a in argv[1:app])


def test_compss_one_node_flag_by_flag(hpo, space, tmp_path):
    argv = compss_argv(hpo, space, "--nodes", "1", "--time", "360", "--cpus-per-node", "48",
                       "--sc-cfg", "mn5.cfg")
    flags = flags_of(argv)
    assert argv[0] == "enqueue_compss"
    run_dir = tmp_path / "runs" / "toy"
    assert flags == {
        "--num_nodes": "1", "--exec_time": "360", "--cpus_per_node": "48",
        # One node: the master's node runs the trials (COMPSs' default is 0 there).
        "--worker_in_master_cpus": "48",
        "--worker_working_dir": str(run_dir / "jobs" / "compss-work"),
        "--log_dir": str(run_dir / "jobs" / "compss-logs"),
        "--pythonpath": f"{ROOT}:{tmp_path}",
        "--python_interpreter": sys.executable,  # the project's environment, not PATH's python3
        "--sc_cfg": "mn5.cfg",
        # The runtime's own limit after the study's budget (walltime - 300 s).
        "--wall_clock_limit": str(360 * 60 - 150),
    }
    # The repository's hpo_main.py and the space, both absolute; the study stops
    # before the walltime (default margin: 10% of 360 min, capped at 300 s).
    main_script = Path(argv[len(flags) + 1])
    assert main_script == ROOT / "hpo_main.py" and main_script.is_file()
    assert argv[len(flags) + 2:] == [str(space.resolve()), "--runs-dir", str(tmp_path / "runs"),
                                     "--timeout-s", str(360 * 60 - 300), "--quiet"]


def project_python(tmp_path: Path) -> Path:
    """A Python of the project's environment elsewhere (a wrapper of this one)."""
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python


def test_compss_four_gpu_nodes_flag_by_flag(hpo, tmp_path):
    python = project_python(tmp_path)
    space = tmp_path / "gpus.json"
    spec = toy_space("gpus", "hpo.examples.toy:sleep", resources={"cpus": 8, "gpus": 1})
    del spec["search"]["parallel"]  # chosen from the allocation
    space.write_text(json.dumps(spec))
    argv = compss_argv(hpo, space, "--nodes", "4", "--time", "120", "--cpus-per-node", "80",
                       "--gpus-per-node", "4", "--mem-per-node-gb", "300", "--qos", "acc_debug",
                       "--partition", "acc", "--account", "bsc99", "--sc-cfg", "mn5.cfg",
                       "--stop-before", "600", "--after", "1234", "--max-trials", "6",
                       "--timeout-s", "3600", "--python", python)
    flags = flags_of(argv)
    run_dir = tmp_path / "runs" / "gpus"
    assert flags == {
        "--num_nodes": "4", "--exec_time": "120", "--cpus_per_node": "80", "--gpus_per_node": "4",
        "--node_memory": str(300 * 1024), "--queue": "acc", "--qos": "acc_debug",
        "--project_name": "bsc99",
        # Explicit: a profile's default (mn.cfg: 24) would give the master trials too.
        "--worker_in_master_cpus": "0",
        "--worker_working_dir": str(run_dir / "jobs" / "compss-work"),
        "--log_dir": str(run_dir / "jobs" / "compss-logs"),
        "--pythonpath": f"{ROOT}:{tmp_path}", "--python_interpreter": str(python),
        "--sc_cfg": "mn5.cfg", "--job_dependency": "1234",
        "--wall_clock_limit": str(120 * 60 - 300),
    }
    tail = argv[len(flags) + 3:]
    assert tail[tail.index("--max-trials") + 1] == "6"
    # 3 worker nodes (the master's runs none) x min(80 CPUs / 8, 4 GPUs / 1).
    assert tail[tail.index("--parallel") + 1] == str(3 * 4)
    # The smaller of the user's budget and walltime - margin.
    assert tail[tail.index("--timeout-s") + 1] == "3600"


def test_compss_warns_what_a_profile_may_drop(hpo, space):
    status, out, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "2",
                           "--time", "10", "--sc-cfg", "mn5.cfg", "--qos", "debug", "--account", "a1")
    assert status == 0
    assert "drops --qos without a word if it sets DISABLE_QARG_QOS=true" in err
    # common.sh sends --project_name only where the profile enables it.
    assert ("drops --account (--project_name) without a word unless the profile 'mn5.cfg' sets "
            "ENABLE_PROJECT_NAME=true") in err, err
    assert "--extra=--extra_submit_flag=--account=a1" in err


def compss_space(tmp_path: Path, **resources) -> Path:
    path = tmp_path / "shaped.json"
    spec = toy_space("shaped", "hpo.examples.toy:sleep", resources=resources)
    del spec["search"]["parallel"]  # chosen from the allocation
    path.write_text(json.dumps(spec))
    return path


def parallel_of(argv: list[str]) -> int:
    return int(argv[argv.index("--parallel") + 1])


def test_compss_slots_of_multi_node_trials(hpo, tmp_path):
    # 3-node trials of 4 GPUs on 3 worker nodes of 4 GPUs: one at a time.
    space = compss_space(tmp_path, cpus=8, gpus=4, nodes=3)
    argv = compss_argv(hpo, space, "--nodes", "4", "--time", "60", "--cpus-per-node", "80",
                       "--gpus-per-node", "4", "--sc-cfg", "mn.cfg")
    assert parallel_of(argv) == 1
    # 2-node CPU trials on 3 worker nodes of 10 places each: 15 at once.
    space = compss_space(tmp_path, cpus=8, nodes=2)
    argv = compss_argv(hpo, space, "--nodes", "4", "--time", "60", "--cpus-per-node", "80",
                       "--sc-cfg", "mn.cfg")
    assert parallel_of(argv) == 15 and flags_of(argv)["--worker_in_master_cpus"] == "0"


def test_compss_slots_count_the_masters_share_when_asked(hpo, tmp_path):
    space = compss_space(tmp_path, cpus=8)
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--cpus-per-node", "80",
                       "--sc-cfg", "mn.cfg")
    assert parallel_of(argv) == 10 and flags_of(argv)["--worker_in_master_cpus"] == "0"
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--cpus-per-node", "80",
                       "--sc-cfg", "mn.cfg", "--extra=--worker_in_master_cpus=40")
    assert parallel_of(argv) == 10 + 5  # the worker node's 10 and the master's 40 CPUs / 8
    assert argv.count("--worker_in_master_cpus=40") == 1 and "--worker_in_master_cpus=0" not in argv
    status, _, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "2",
                         "--time", "60", "--sc-cfg", "mn.cfg", "--extra=--worker_in_master_cpus=all")
    assert status == 2 and "whole number" in err and "fix:" in err


def test_compss_extra_master_cpus_gives_the_masters_node_a_part_of_multi_node_trials(hpo, tmp_path):
    # --extra replaces hpo's --worker_in_master_cpus=0: the master's node then
    # runs trials, and 3 nodes hold a 3-node trial.
    space = compss_space(tmp_path, cpus=8, nodes=3)
    argv = compss_argv(hpo, space, "--nodes", "3", "--time", "60", "--cpus-per-node", "80",
                       "--sc-cfg", "mn.cfg", "--extra=--worker_in_master_cpus=80")
    assert flags_of(argv)["--num_nodes"] == "3" and argv.count("--worker_in_master_cpus=80") == 1
    assert "--worker_in_master_cpus=0" not in argv
    assert parallel_of(argv) == 10  # 10 places on each of the 3 nodes, a trial on all three
    # Without it the master's node runs none, and 3 nodes are too few.
    status, _, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "3",
                         "--time", "60", "--cpus-per-node", "80", "--sc-cfg", "mn.cfg")
    assert status == 2 and "fix: --nodes 4 or more" in err
    # A master's share too small for a trial's CPUs holds none of it.
    status, _, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "3",
                         "--time", "60", "--cpus-per-node", "80", "--sc-cfg", "mn.cfg",
                         "--extra=--worker_in_master_cpus=4")
    assert status == 2 and "fix: --nodes 4 or more" in err


def test_compss_slots_count_the_memory_of_a_node(hpo, tmp_path):
    space = compss_space(tmp_path, cpus=1, memory_gb=10)
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--cpus-per-node", "48",
                       "--mem-per-node-gb", "200", "--sc-cfg", "mn.cfg")
    assert parallel_of(argv) == 20  # 200 GB / 10 GB, not 48 CPUs / 1
    # --extra=--node_memory replaces hpo's, and the slots count it.
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--cpus-per-node", "48",
                       "--mem-per-node-gb", "200", "--sc-cfg", "mn.cfg", "--extra=--node_memory=102400")
    assert parallel_of(argv) == 10
    assert [a for a in argv if a.startswith("--node_memory")] == ["--node_memory=102400"]
    # A node's memory unknown here: the study counts it at run time.
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--cpus-per-node", "48",
                       "--sc-cfg", "mn.cfg")
    assert "--parallel" not in argv


def test_compss_extra_flags_replace_hpos_own(hpo, space):
    argv = compss_argv(hpo, space, "--nodes", "2", "--time", "60", "--sc-cfg", "mn.cfg",
                       "--extra=--wall_clock_limit=1000", "--extra=--log_dir=/scratch/logs")
    assert [a for a in argv if a.startswith("--wall_clock_limit")] == ["--wall_clock_limit=1000"]
    assert [a for a in argv if a.startswith("--log_dir")] == ["--log_dir=/scratch/logs"]


@pytest.mark.parametrize("extra, option", [
    ("--cpus_per_node=40", "--cpus-per-node 40"),
    ("--num_nodes=8", "--nodes 8"),
    ("--exec_time=30", "--time 30"),
    ("--gpus_per_node=2", "--gpus-per-node 2"),
])
def test_compss_extra_flags_hpo_computes_with_name_hpos_option(hpo, space, extra, option):
    status, out, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "2",
                           "--time", "60", "--sc-cfg", "mn.cfg", f"--extra={extra}")
    assert status == 2 and out == "", err
    assert f"--extra={extra}" in err and f"fix: {option}" in err


def test_compss_rounds_fractional_memory_up_and_says_so(hpo, tmp_path):
    space = compss_space(tmp_path, memory_gb=1.5)
    status, out, err = hpo("submit", space, "--engine", "compss", "--dry-run", "--nodes", "2",
                           "--time", "60", "--sc-cfg", "mn.cfg")
    assert status == 0, err
    assert '"memory_gb": 1.5: COMPSs reserves whole GB' in err and "asks for 2 GB per trial" in err


@pytest.mark.parametrize("options, words", [
    (["--nodes", "1", "--time", "10", "--sc-cfg", "x.cfg"], ["--cpus-per-node", "--worker_in_master_cpus"]),
    (["--nodes", "2", "--time", "10", "--gpus-per-node", "0", "--sc-cfg", "x.cfg"],
     ["GPU", "--gpus-per-node 1"]),
    (["--nodes", "2", "--time", "10", "--gpus-per-node", "1"], ["--sc-cfg PROFILE", "default.cfg"]),
])
def test_compss_refuses_what_cannot_run(hpo, gpu_space, options, words):
    status, out, err = hpo("submit", gpu_space, "--engine", "compss", "--dry-run", *options)
    assert status == 2 and out == ""
    for word in words:
        assert word in err


def test_compss_without_enqueue_compss_on_path(hpo, space, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    status, _, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "5",
                         "--sc-cfg", "x.cfg")
    assert status == 2 and "enqueue_compss: not found on PATH" in err and "--dry-run" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------- the Dask script


def dask_script(hpo, space, *options) -> str:
    status, out, err = hpo("submit", space, "--dry-run", *options)
    assert status == 0, err
    return out


def directives(script: str) -> dict[str, str]:
    lines = [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    return dict((line.split("=", 1) + [""])[:2] for line in lines)


def check_shell(script: str, tmp_path: Path, severity: str = "style") -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n passed")
    lint = subprocess.run(["shellcheck", "-s", "bash", "-S", severity, str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_dask_script_cpu_defaults(hpo, space, tmp_path):
    script = dask_script(hpo, space, "--time", "60", "--nodes", "2")
    d = directives(script)
    assert d == {"--job-name": "hpo-toy", "--nodes": "2", "--ntasks-per-node": "1",
                 "--exclusive": "", "--time": "60", "--signal": "B:USR1@300",
                 "--output": str(tmp_path / "runs" / "toy" / "jobs" / "slurm-%j.out"),
                 "--open-mode": "append"}
    assert f"python={sys.executable}" in script
    assert f"-m hpo run {space.resolve()} --runs-dir {tmp_path / 'runs'} --engine dask" in script
    assert "trap stop_cluster EXIT" in script and "on_signal USR1" in script
    assert 'kill -USR1 "$study"' in script  # SLURM's SIGTERM reaches the study itself
    # The cluster speaks TLS only, with the job's own certificate (made in the job).
    assert "dask_node tls --dir \"$job_dir\"" in script
    assert 'export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION="True"' in script
    assert 'export DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY="$job_dir/tls-key.pem"' in script
    check_shell(script, tmp_path)


def test_dask_script_gpu_site_options(hpo, gpu_space, tmp_path):
    script = dask_script(hpo, gpu_space, "--time", "30", "--nodes", "3", "--gpus-per-node", "4",
                         "--cpus-per-node", "80", "--mem-per-node-gb", "300", "--partition", "acc",
                         "--qos", "acc_bsccs", "--account", "bsc99", "--extra=--reservation=hpo",
                         "--interface", "ib0", "--env", "OMP_NUM_THREADS=20", "--stop-before", "120")
    d = directives(script)
    # One worker per GPU (the study needs 1 per trial), each with 80/4 CPUs.
    assert d["--ntasks-per-node"] == "4" and d["--cpus-per-task"] == "20"
    assert d["--gres"] == "gpu:4" and d["--mem"] == "300G" and "--exclusive" not in d
    assert (d["--partition"], d["--qos"], d["--account"]) == ("acc", "acc_bsccs", "bsc99")
    assert d["--reservation"] == "hpo" and d["--signal"] == "B:USR1@120"
    assert "--gpus-per-worker 1" in script and script.count("--interface ib0") == 2
    assert "export OMP_NUM_THREADS=20" in script
    check_shell(script, tmp_path)


def test_dask_script_quotes_awkward_paths(hpo, tmp_path):
    odd = tmp_path / "my study's dir"
    odd.mkdir()
    space = odd / "toy.json"
    space.write_text(json.dumps(toy_space("toy")))
    script = dask_script(hpo, space, "--time", "5", "--runs-dir", odd / "runs $HOME")
    check_shell(script, tmp_path, severity="warning")  # SC2016 (info) flags the literal $HOME
    # What bash makes of the study's command line is the paths themselves.
    line = next(x for x in script.splitlines() if "-m hpo run" in x)
    words = shlex.split(line.replace('"$python"', "PY").replace('"$scheduler_file"', "F").rstrip("&"))
    assert words[4] == str(space) and words[6] == str(odd / "runs $HOME")


def test_dry_run_submits_and_writes_nothing(hpo, space, monkeypatch, tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("sbatch", "enqueue_compss"):  # would record any call
        (fake / tool).write_text(f"#!/bin/sh\necho {tool} >> {calls}\necho 99\n")
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    assert hpo("submit", space, "--time", "5", "--dry-run")[0] == 0
    assert hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "5", "--sc-cfg",
               "x.cfg", "--dry-run")[0] == 0
    assert not calls.exists() and not (tmp_path / "runs").exists()


def test_submit_without_sbatch_is_a_usage_error(hpo, space, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    status, _, err = hpo("submit", space, "--time", "5")
    assert status == 2 and "sbatch: not found on PATH" in err


def test_submit_records_the_job(hpo, space, monkeypatch, tmp_path):
    """With a stand-in sbatch: the script is written, the id parsed and recorded."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\necho '4242;cluster'\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, out, err = hpo("submit", space, "--time", "5", "--after", "4241")
    assert status == 0, err
    run_dir = tmp_path / "runs" / "toy"
    [job] = read_jobs(run_dir)
    assert job["job_id"] == "4242" and job["engine"] == "dask" and job["after"] == "4241"
    assert job["stdout"] == str(run_dir / "jobs" / "slurm-4242.out")
    assert Path(job["script"]).read_text().startswith("#!/bin/bash\n#SBATCH")
    assert (tmp_path / "argv").read_text().split() == [
        "--parsable", "--dependency=afterany:4241", job["script"]]
    assert "submitted SLURM job 4242" in out and str(run_dir) in out


def test_compss_submit_records_the_job(hpo, space, monkeypatch, tmp_path):
    """With a stand-in enqueue_compss: the id is read from sbatch's line and recorded."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "enqueue_compss").write_text(
        f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\necho 'SC Configuration: x.cfg'\n"
        "echo 'Submitted batch job 515'\n")
    (fake / "enqueue_compss").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, out, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "30",
                           "--sc-cfg", "x.cfg")
    assert status == 0, err
    run_dir = tmp_path / "runs" / "toy"
    [job] = read_jobs(run_dir)
    assert job["job_id"] == "515" and job["engine"] == "compss"
    assert job["command"][0] == "enqueue_compss" and (run_dir / "jobs" / "compss-logs").is_dir()
    assert (tmp_path / "argv").read_text().split() == job["command"][1:]
    assert "submitted SLURM job 515" in out


def fake_slurm(bin_dir: Path, jobs: dict[str, str]) -> None:
    """Stand-ins for squeue and scontrol answering about ``jobs`` (id: the
    ``scontrol -o show job`` line); any other id is one SLURM has forgotten."""
    answers = bin_dir / "answers"
    shutil.rmtree(answers, ignore_errors=True)
    answers.mkdir(parents=True)
    for job_id, line in jobs.items():
        (answers / job_id).write_text(line + "\n")
    live = [f"{i}|{line.split('JobState=')[1].split()[0]}" for i, line in jobs.items()
            if "JobState=RUNNING" in line or "JobState=PENDING" in line]
    (answers / "squeue").write_text("".join(f"{x}\n" for x in live))
    scripts = {"squeue": f"cat {answers}/squeue\n",
               "scontrol": f'[ -f "{answers}/$4" ] && exec cat "{answers}/$4"\n'
                           "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n",
               "sbatch": "echo 4243\n"}
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    """fake_slurm in a folder put first on PATH; call it with the jobs SLURM knows."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return lambda jobs: fake_slurm(bin_dir, jobs)


def job_line(job_id: str, state: str, exit_code: str = "0:0", run_time: str = "00:10:00") -> str:
    return (f"JobId={job_id} JobName=hpo-toy JobState={state} Reason=None ExitCode={exit_code} "
            f"RunTime={run_time} TimeLimit=00:30:00 NodeList=n1 StdOut=/runs/toy/jobs/slurm-{job_id}.out")


def ending(status: int, left_running: int = 0, suspended: int = 0) -> dict:
    clean = left_running == 0
    return {"exit_status": status, "reported_exit": 0 if clean else status, "clean": clean,
            "signal": {138: "SIGUSR1", 143: "SIGTERM"}.get(status), "left_running": left_running,
            "suspended": suspended, "stop": {"reason": "SIGTERM", "resume": True}, "at": "t"}


def notes_of(out: str, job_id: str) -> str:
    """The row of ``job_id`` in hpo jobs' table and the notes under it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{job_id} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return "\n".join(lines[start:end])


def test_jobs_tell_a_clean_stop_from_one_that_left_trials_running(hpo, slurm, tmp_path):
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    for job_id in ("11", "12", "13"):
        append_job(run_dir, {"job_id": job_id, "engine": "dask", "stdout": None})
    write_ending(run_dir, "11", ending(138, suspended=3))
    write_ending(run_dir, "12", ending(143, left_running=1, suspended=1))  # the grace ran out
    slurm({"11": job_line("11", "COMPLETED"), "12": job_line("12", "TIMEOUT", "143:0"),
           "13": job_line("13", "TIMEOUT", "0:9")})  # 13: killed before it could record anything
    status, out, err = hpo("jobs", run_dir)
    assert status == 0, err
    clean, grace_ran_out, killed = (notes_of(out, j) for j in ("11", "12", "13"))
    assert "stopped cleanly on SIGUSR1 before the walltime: 3 trials suspended" in clean
    assert "reported to SLURM as 0" in clean
    assert "cleanly" not in grace_ran_out and "1 trial still ran when the stop grace ran out" in grace_ran_out
    assert "killed at the walltime before the study stopped cleanly" in killed
    assert "may be left RUNNING" in killed


def test_jobs_remember_what_slurm_forgot(hpo, slurm, tmp_path):
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    append_job(run_dir, {"job_id": "21", "engine": "dask", "stdout": None})
    write_ending(run_dir, "21", ending(143, suspended=2))
    slurm({"21": job_line("21", "CANCELLED", run_time="00:03:00")})
    assert "CANCELLED" in notes_of(hpo("jobs", run_dir)[1], "21")
    slurm({})  # purged after MinJobAge
    status, out, err = hpo("jobs", run_dir)
    row = notes_of(out, "21")
    assert status == 0 and row.split()[:5] == ["21", "dask", "CANCELLED", "CANCELLED", "0:0"], out
    assert "no longer known to SLURM" in row and "stopped cleanly on SIGTERM" in row
    [job] = json.loads(hpo("jobs", run_dir, "--json")[1])["jobs"]
    assert job["state"] == "CANCELLED" and job["ended"]["suspended"] == 2


def test_submit_refuses_a_study_that_already_runs(hpo, space, slurm, tmp_path):
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    append_job(run_dir, {"job_id": "4242", "engine": "dask", "stdout": None})
    slurm({"4242": job_line("4242", "RUNNING")})
    status, out, err = hpo("submit", space, "--time", "5")
    assert status == 2 and "SLURM job 4242 (RUNNING) already runs this study" in err, err
    assert "fix:" in err and "--after 4242" in err and len(read_jobs(run_dir)) == 1
    # Queued behind it, the continuation is what hpo submit is for.
    status, out, err = hpo("submit", space, "--time", "5", "--after", "4242")
    assert status == 0 and "submitted SLURM job 4243" in out, err
    # A live master holds the study (an hpo run outside SLURM): refused too.
    slurm({"4242": job_line("4242", "COMPLETED"), "4243": job_line("4243", "COMPLETED")})
    with MasterLease(run_dir):
        status, _, err = hpo("submit", space, "--time", "5")
    assert status == 2 and f"pid {os.getpid()}" in err and "fix:" in err
    assert hpo("submit", space, "--time", "5")[0] == 0  # free again


def test_refused_submission_exits_2_with_what_sbatch_said(hpo, space, monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid qos specification' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, _, err = hpo("submit", space, "--time", "5", "--qos", "nope")
    assert status == 2 and "Invalid qos specification" in err and "fix:" in err
    assert read_jobs(tmp_path / "runs" / "toy") == []


def test_a_requeued_job_still_runs_the_study(hpo, space, slurm, tmp_path):
    """SLURM requeued a job that had ended (its record written): it is queued
    again under its id and will run the study itself. A second job would run
    the study twice, and resubmitting is no advice to give."""
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    append_job(run_dir, {"job_id": "31", "engine": "dask", "stdout": None, "resubmit": "hpo submit again"})
    write_ending(run_dir, "31", ending(143, suspended=2))  # its first run stopped on SIGTERM
    slurm({"31": job_line("31", "PENDING").replace("Reason=None", "Reason=BeginTime Restarts=1")})
    status, _, err = hpo("submit", space, "--time", "5")
    assert status == 2 and "SLURM job 31 (PENDING) already runs this study" in err, err
    assert len(read_jobs(run_dir)) == 1
    status, out, err = hpo("jobs", run_dir)
    row = notes_of(out, "31")
    assert status == 0 and "requeued by SLURM (restarts: 1)" in row and "waiting: BeginTime" in row, out
    assert "submit the same command" not in row and "resume:" not in row, row


def test_a_requeued_run_keeps_the_earlier_record_and_its_own_lease_goes(tmp_path, monkeypatch):
    """The batch script's first step in a run of a requeued job: the earlier
    run's record is kept aside, not overwritten; its scheduler file (a dead
    address) and the lease it left (its master is dead, though the lease
    looks live) are removed. Another job's lease is left alone."""
    from hpo.launchers import dask_node
    from hpo.launchers.records import earlier_endings, read_ending

    run_dir, scheduler_file = tmp_path / "study", tmp_path / "study" / "jobs" / "77" / "scheduler.json"
    write_ending(run_dir, "77", {**ending(0), "restart": 0})
    scheduler_file.write_text("{}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    earlier = MasterLease(run_dir, beat_s=3600).acquire()  # as the dead run left it: live-looking
    try:
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        assert dask_node.main(["begin", "--run-dir", str(run_dir), "--job", "77",
                               "--scheduler-file", str(scheduler_file)]) == 0
        assert MasterLease(run_dir).holder() is None and not scheduler_file.exists()
        assert read_ending(run_dir, "77") is None
        assert [e["restart"] for e in earlier_endings(run_dir, "77")] == [0]
    finally:
        earlier.release()
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    with MasterLease(run_dir, beat_s=3600):
        assert not dask_node.release_own_lease(run_dir, "77")
        assert MasterLease(run_dir).holder()["slurm_job"] == "78"


def test_jobs_show_how_jobs_slurm_forgot_unseen_ended(hpo, slurm, tmp_path):
    """Nobody ran hpo jobs before SLURM purged these jobs: their own records
    of their end say how they ended, not MISSING."""
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    for job_id in ("41", "42", "43", "44"):
        append_job(run_dir, {"job_id": job_id, "engine": "dask", "stdout": None})
    write_ending(run_dir, "41", ending(0))
    write_ending(run_dir, "42", ending(143, suspended=1))
    write_ending(run_dir, "43", {**ending(1), "reported_exit": 1, "clean": False})
    slurm({})  # all purged after MinJobAge; 44 recorded nothing
    status, out, err = hpo("jobs", run_dir)
    assert status == 0, err
    rows = {j: notes_of(out, j) for j in ("41", "42", "43", "44")}
    assert rows["41"].split()[2:5] == ["COMPLETED", "MISSING", "0:0"], out
    assert rows["42"].split()[2:5] == ["CANCELLED", "MISSING", "0:0"], out
    assert rows["43"].split()[2:5] == ["FAILED", "MISSING", "1:0"], out
    assert "as the job recorded at its end" in rows["43"] and "exited with status 1" in rows["43"]
    assert rows["44"].split()[2] == "MISSING"


def test_jobs_show_the_output_of_a_job_that_ended_before_its_study(hpo, slurm, tmp_path):
    run_dir = tmp_path / "runs" / "toy"
    (run_dir / "jobs").mkdir(parents=True)
    out_file = run_dir / "jobs" / "slurm-51.out"
    out_file.write_text("".join(f"line {i}\n" for i in range(40)) + "env.sh: No such file or directory\n")
    append_job(run_dir, {"job_id": "51", "engine": "dask", "stdout": str(out_file)})
    slurm({"51": job_line("51", "FAILED", "1:0", "00:00:00").replace(
        "StdOut=/runs/toy/jobs/slurm-51.out", f"StdOut={out_file}")})
    status, out, err = hpo("jobs", run_dir)
    assert status == 0, err
    assert "study: not started yet" in out
    assert f"job 51 ended (FAILED 1:0) before the study started; the end of its output ({out_file})" in out
    assert "  | env.sh: No such file or directory" in out and "  | line 39" in out
    assert "  | line 1\n" not in out  # only the end


def test_a_refused_partition_of_the_profile_is_named(hpo, space, monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: "
                                 "compute' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    generic = ROOT / "launchers" / "sites" / "generic.toml"
    status, _, err = hpo("submit", space, "--time", "5", "--site", generic)
    assert status == 2 and "invalid partition specified: compute" in err
    assert f"--partition compute: from the site profile {generic}" in err, err
    assert "override with --partition NAME" in err and "--site none" in err
    status, _, err = hpo("submit", space, "--time", "5", "--site", generic, "--partition", "x")
    assert status == 2 and "from the site profile" not in err  # the command line's own


def test_python_that_cannot_run_the_job_is_refused(hpo, space, tmp_path):
    status, out, err = hpo("submit", space, "--time", "5", "--dry-run", "--python", "/nonexistent/python")
    assert status == 2 and out == "" and "--python /nonexistent/python: no such file" in err
    assert "fix:" in err and "leave --python out" in err
    plain = tmp_path / "not-a-program"
    plain.write_text("")
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run", "--python", plain)
    assert status == 2 and "not executable" in err
    base = Path(sys.base_prefix) / "bin" / "python3"  # outside the project's environment
    if subprocess.run([base, "-c", "import hpo"], capture_output=True).returncode == 0:
        pytest.skip(f"{base} imports hpo here")
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run", "--python", base)
    assert status == 2 and f"--python {base} cannot import hpo" in err, err
    assert "No module named 'hpo'" in err and "pip install -e" in err
    # Under COMPSs the project is on the job's path: hpo's own requirements are missing.
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run", "--engine", "compss",
                         "--nodes", "2", "--sc-cfg", "x.cfg", "--python", base)
    assert status == 2 and f"--python {base} cannot import hpo" in err and "No module named" in err


def test_python_that_needs_the_setup_lines_is_accepted(hpo, space, tmp_path):
    python = tmp_path / "module-python"
    python.write_text('#!/bin/sh\n[ -n "$HPO_TEST_MODULE" ] || { echo "python: error while loading '
                      'shared libraries: libpython3.11.so.1.0" >&2; exit 127; }\n'
                      f'exec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run", "--python", python)
    assert status == 2 and "libpython3.11.so.1.0" in err
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run", "--python", python,
                         "--setup", "export HPO_TEST_MODULE=loaded")
    assert status == 0, err


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("options, words", [
    (["--nodes", "0", "--time", "5"], ["--nodes 0", "at least 1"]),
    (["--time", "0"], ["--time 0", "minutes"]),
    (["--time", "1", "--stop-before", "60"], ["--stop-before 60", "longer --time"]),
    (["--time", "5", "--cpus-per-node", "0"], ["--cpus-per-node 0"]),
    (["--time", "5", "--gpus-per-node", "-1"], ["--gpus-per-node -1"]),
    (["--time", "5", "--extra", "reservation=x"], ["--extra", "--extra=--reservation"]),
    (["--time", "5", "--env", "1X=2"], ["--env '1X=2'", "NAME=VALUE"]),
])
def test_bad_options_exit_2(hpo, space, options, words):
    status, out, err = hpo("submit", space, "--dry-run", *options)
    assert status == 2 and out == "", err
    for word in words:
        assert word in err


def test_study_that_cannot_fit_a_worker(hpo, gpu_space, space):
    status, _, err = hpo("submit", gpu_space, "--time", "5", "--dry-run")
    assert status == 2 and "needs 1 GPU(s) per trial" in err and "--gpus-per-node 1" in err
    status, _, err = hpo("submit", space, "--time", "5", "--cpus-per-node", "4", "--dry-run")
    assert status == 0
    big = json.loads(space.read_text())
    big["resources"] = {"cpus": 8}
    space.write_text(json.dumps(big))
    status, _, err = hpo("submit", space, "--time", "5", "--cpus-per-node", "4", "--dry-run")
    assert status == 2 and "needs 8" in err and "--cpus-per-node 8" in err


def test_bad_space_fails_at_submission(hpo, tmp_path):
    status, _, err = hpo("submit", ROOT / "tests" / "bad_spaces" / "typo_top_key.json",
                         "--time", "5", "--dry-run")
    assert status == 2 and "unknown key 'serach'" in err and 'did you mean "search"' in err
    status, _, err = hpo("submit", tmp_path / "nope.json", "--time", "5", "--dry-run")
    assert status == 2 and "nope.json: no such file" in err


def test_run_dir_with_another_space_is_refused(hpo, space, tmp_path):
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    (run_dir / "study.json").write_text(json.dumps(
        {"spec": {"name": "toy", "space": {"other": [1]}, "metric": {"name": "value"}},
         "storage": "journal.log"}))
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run")
    assert status == 2 and "different" in err and "space" in err, err


def test_cli_exit_status_in_a_subprocess(space, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hpo", "submit", str(space), "--nodes", "0",
                           "--time", "5"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("hpo: error: --nodes 0")
    assert "Traceback" not in proc.stderr


# ------------------------------------------------ provider, launcher, states


class Recorded:
    """A command runner answering from a table of argv prefixes."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, argv):
        self.calls.append(list(argv))
        for prefix, (code, out, err) in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return subprocess.CompletedProcess(argv, code, out, err)
        raise AssertionError(f"unexpected command {argv}")


SCONTROL_DONE = ("JobId=7 JobName=hpo-toy UserId=root(0) JobState=COMPLETED Reason=None "
                 "Dependency=(null) ExitCode=0:0 RunTime=00:00:41 TimeLimit=00:05:00 "
                 "NodeList=vm StdErr=/runs/my toy/slurm-7.out StdOut=/runs/my toy/slurm-7.out Power=\n")


def test_provider_status_squeue_then_scontrol():
    runner = Recorded({
        "squeue": (0, "8|PENDING\n9|RUNNING\n", ""),
        "scontrol -o show job 7": (0, SCONTROL_DONE, ""),
        "scontrol -o show job 8": (0, "JobId=8 JobState=PENDING Reason=Dependency ExitCode=0:0\n", ""),
        "scontrol -o show job 9": (0, "JobId=9 JobState=WEIRD_NEW Reason=None\n", ""),
        "scontrol -o show job 6": (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
    })
    states = SlurmProvider(runner).status(["6", "7", "8", "9"])
    assert runner.calls[0] == ["squeue", "-h", "-j", "6,7,8,9", "-o", "%i|%T"]
    assert states["6"].state is JobState.MISSING
    done = states["7"]
    assert (done.state, done.exit_code, done.run_time, done.nodes) == (JobState.COMPLETED, "0:0", "00:00:41", "vm")
    assert done.stdout == "/runs/my toy/slurm-7.out" and done.reason is None
    assert states["8"].state is JobState.PENDING and states["8"].reason == "Dependency"
    assert states["9"].state is JobState.RUNNING  # squeue's live answer wins


def test_provider_unreachable_is_unknown_not_missing():
    runner = Recorded({"squeue": (1, "", "fatal"), "scontrol": (1, "", "scontrol: fatal: Unable to process configuration file\n")})
    status = SlurmProvider(runner).status(["5"])["5"]
    assert status.state is JobState.UNKNOWN and "configuration" in status.reason


def test_provider_submit_parses_ids_and_keeps_errors(tmp_path):
    runner = Recorded({"sbatch --parsable": (0, "123;cluster\n", "")})
    assert SlurmProvider(runner).submit(tmp_path / "s.sbatch") == "123"
    compss = Recorded({"enqueue_compss": (0, "SC Configuration: default.cfg\nSubmitted batch job 77\n", "")})
    assert SlurmProvider(compss).submit_command(["enqueue_compss", "x.py"]) == "77"
    refused = Recorded({"sbatch": (1, "", "sbatch: error: Invalid qos specification\n")})
    with pytest.raises(SubmitError) as info:
        SlurmProvider(refused).submit(tmp_path / "s.sbatch")
    assert info.value.returncode == 1 and "Invalid qos" in str(info.value)


@pytest.mark.parametrize("code, state", [
    ("PENDING", JobState.PENDING), ("COMPLETING", JobState.RUNNING), ("TIMEOUT", JobState.TIMEOUT),
    ("CANCELLED by 0", JobState.CANCELLED), ("NODE_FAIL", JobState.FAILED),
    ("OUT_OF_MEMORY", JobState.FAILED), ("SUSPENDED", JobState.HELD), ("PREEMPTED", JobState.CANCELLED),
    ("SOMETHING_NEW", JobState.UNKNOWN), ("", JobState.UNKNOWN),
])
def test_state_table(code, state):
    assert from_slurm(code) is state


def test_srun_launcher_is_a_string_transform():
    line = SrunLauncher("--mpi=none")("dask worker", nodes=2, tasks_per_node="$w")
    assert line == "srun --nodes=2 --ntasks-per-node=$w --kill-on-bad-exit=0 --mpi=none dask worker"


def test_worker_gets_its_own_gpus_and_cpus():
    env = {"SLURM_LOCALID": "1", "SLURM_CPUS_PER_TASK": "20", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
           "SLURMD_NODENAME": "n1"}
    options, changes = worker_settings(env, workers_per_node=2, gpus_per_worker=2)
    assert changes == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert options == {"nthreads": 20, "resources": {"CPU": 20, "GPU": 2}, "name": "n1-1"}
    cpu_only, cpu_changes = worker_settings({"SLURM_CPUS_ON_NODE": "48"}, 1, 0)
    assert cpu_only["resources"] == {"CPU": 48} and cpu_changes == {}
    with pytest.raises(SystemExit, match="needs 2 GPU"):
        worker_settings({**env, "CUDA_VISIBLE_DEVICES": "0,1,2"}, 2, 2)


def test_default_stop_margin():
    assert [BatchRequest(1, t).stop_before for t in (1, 2, 10, 60, 600)] == [30, 30, 60, 300, 300]


def test_jobs_without_submissions_is_a_usage_error(hpo, tmp_path):
    status, _, err = hpo("jobs", tmp_path)
    assert status == 2 and "nothing was submitted" in err


def test_jobs_json_appends(tmp_path):
    append_job(tmp_path, {"job_id": "1"})
    append_job(tmp_path, {"job_id": "2"})
    jobs = read_jobs(tmp_path)
    assert [j["job_id"] for j in jobs] == ["1", "2"] and all("submitted_at" in j for j in jobs)


def test_the_allocation_is_sized_for_the_widest_trial(hpo, tmp_path):
    space = tmp_path / "wide.json"
    space.write_text(json.dumps(toy_space("wide", "hpo.examples.toy:sleep",
                                          resources={"gpus": 2, "nodes": "n"}, space={"n": [1, 3]})))
    status, out, err = hpo("submit", space, "--time", "30", "--gpus-per-node", "4", "--dry-run")
    assert status == 0, err
    assert "#SBATCH --nodes=3" in out  # the widest trial's nodes
    assert "--workers-per-node \"$workers_per_node\" --gpus-per-worker 4" in out  # a worker holds them
    flags = flags_of(compss_argv(hpo, space, "--time", "30", "--gpus-per-node", "4", "--cpus-per-node", "8",
                                 "--sc-cfg", "mn5.cfg"))
    assert flags["--num_nodes"] == "4"  # and the COMPSs master's node
    status, _, err = hpo("submit", space, "--time", "30", "--gpus-per-node", "4", "--nodes", "2", "--dry-run")
    assert status == 2 and "trials on 3 nodes" in err and "--nodes 3" in err


# ------------------------------------------- what a user reads after a job ended


def test_submit_with_an_unreachable_controller_says_so(hpo, space, monkeypatch, tmp_path):
    """No partition, QOS or account is at fault when sbatch never reached the
    controller: the fix names the controller, not the request, nor the profile."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                 "Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", "/etc/other/slurm.conf")
    site = tmp_path / "site.toml"
    site.write_text('partition = "compute"\n')
    status, _, err = hpo("submit", space, "--time", "5", "--site", site)
    assert status == 2 and "Unable to contact slurm controller" in err, err
    assert "the SLURM controller cannot be reached from this host" in err
    assert "slurmctld" in err and "/etc/other/slurm.conf" in err and "login node" in err
    assert "--partition" not in err and "from the site profile" not in err, err


def test_jobs_show_what_a_study_that_failed_said(hpo, slurm, tmp_path):
    """Exit 75 (the store stopped taking writes, a fenced master): the
    study's message and fix, kept from the job's output, not "see the
    job's output"; the resume command, to run once it is fixed."""
    run_dir = tmp_path / "runs" / "toy"
    run_dir.mkdir(parents=True)
    append_job(run_dir, {"job_id": "61", "engine": "dask", "stdout": None, "resubmit": "hpo submit again"})
    said = ["hpo: /runs/toy/journal.log: cannot be written any more (No space left on device).",
            "  fix: free space on /runs, then run the same command again"]
    write_ending(run_dir, "61", {**ending(75, left_running=2), "said": said})
    slurm({"61": job_line("61", "FAILED", "75:0")})
    status, out, err = hpo("jobs", run_dir)
    row = notes_of(out, "61")
    assert status == 0, err
    assert ("the study exited with status 75: /runs/toy/journal.log: cannot be written any more "
            "(No space left on device).") in row, row
    assert "  fix: free space on /runs" in row and "see the job's output" not in row
    assert "resume: hpo submit again" in row


def test_study_message_is_the_last_thing_the_study_said():
    from hpo.launchers.outcome import study_message

    earlier = ("hpo: starting the study\nhpo: error: an earlier run's message\n"
               "hpo: job 7 on n1, 1 worker(s), logs in x\nhpo: 1 Dask worker(s) joined\n")
    output = (earlier + "hpo: starting the study\nstudy toy: grid search, engine dask\n\n"
              "hpo: /j.log: another master took this study over (epoch 3 against 2).\n"
              "  fix: nothing to do here: the other master runs the study\n")
    assert study_message(output) == [
        "hpo: /j.log: another master took this study over (epoch 3 against 2).",
        "  fix: nothing to do here: the other master runs the study"]
    crashed = earlier + "hpo: starting the study\nTraceback (most recent call last):\nKeyError: 'x'\n"
    assert study_message(crashed) == ["Traceback (most recent call last):", "KeyError: 'x'"]
    assert study_message("no study started here\n") == []


def test_a_requeued_run_says_nothing_is_to_resubmit():
    from hpo.launchers.outcome import exit_line

    stopped = {**ending(143, suspended=2), "requeued": True}
    line = exit_line(stopped, "hpo submit again")
    assert "SLURM requeued this job" in line and "nothing to resubmit" in line, line
    assert "resume it with" not in line and "scancel" not in line
    assert "resume it with: hpo submit again" in exit_line(ending(143, suspended=2), "hpo submit again")


def test_a_clean_stop_counts_the_trials_that_saved_no_checkpoint():
    from hpo.launchers.outcome import explain

    some = explain({**ending(143, suspended=2), "no_checkpoint": 1})
    assert "2 trials suspended, 1 of them without a checkpoint" in some, some
    assert "with checkpoints" not in some
    none = explain({**ending(138, suspended=1), "no_checkpoint": 1})
    assert "1 trial suspended without a checkpoint" in none, none
    assert "3 trials suspended with checkpoints" in explain(ending(138, suspended=3))


def test_jobs_count_one_trial_as_one():
    from hpo.launchers.commands import _progress_line

    summary = {"study": "toy", "trials": 1, "counts": {"COMPLETE": 1, "RUNNING": 0},
               "best": None, "metric": "value"}
    assert _progress_line(summary) == "study toy: 1 trial (1 complete)"
    lost = {**summary, "trials": 3, "counts": {"PENDING": 1, "RUNNING": 2}, "interrupted": 2}
    line = _progress_line(lost)
    assert line.startswith("study toy: 3 trials (1 pending, 2 interrupted: ") and "running" not in \
        line.split("interrupted")[0], line
