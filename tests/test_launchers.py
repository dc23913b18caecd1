"""hpo submit / hpo jobs without SLURM: the enqueue_compss command line, the
Dask batch script (bash -n, shellcheck), --dry-run, bad options, and the
provider's text handling against a recorded command runner.

The same code runs against a real SLURM controller in test_slurm.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, toy_space
from hpo.cli import main
from hpo.launchers import JobState, SlurmProvider, SrunLauncher, SubmitError
from hpo.launchers.dask_node import worker_argv
from hpo.launchers.records import append_job, read_jobs
from hpo.launchers.request import BatchRequest
from hpo.launchers.states import from_slurm

# The enqueue_compss flags DESIGN.md lists (COMPSs 3.3 sources).
ENQUEUE_FLAGS = {"--num_nodes", "--exec_time", "--qos", "--queue", "--project_name",
                 "--cpus_per_node", "--gpus_per_node", "--worker_in_master_cpus",
                 "--worker_in_master_memory", "--worker_working_dir", "--master_working_dir",
                 "--log_dir", "--job_dependency", "--sc_cfg", "--pythonpath", "--node_memory",
                 "--python_interpreter", "--wall_clock_limit"}


@pytest.fixture
def hpo(monkeypatch, capsys, tmp_path):
    """Run ``hpo ARGS`` in this process from tmp_path; returns (status, stdout, stderr)."""
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    monkeypatch.chdir(tmp_path)

    def call(*args):
        status = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err
    return call


@pytest.fixture
def space(tmp_path) -> Path:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(toy_space("toy")))
    return path


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


def test_compss_four_gpu_nodes_flag_by_flag(hpo, tmp_path):
    space = tmp_path / "gpus.json"
    spec = toy_space("gpus", "hpo.examples.toy:sleep", resources={"cpus": 8, "gpus": 1})
    del spec["search"]["parallel"]  # chosen from the allocation
    space.write_text(json.dumps(spec))
    argv = compss_argv(hpo, space, "--nodes", "4", "--time", "120", "--cpus-per-node", "80",
                       "--gpus-per-node", "4", "--mem-per-node-gb", "300", "--qos", "acc_debug",
                       "--partition", "acc", "--account", "bsc99", "--sc-cfg", "mn5.cfg",
                       "--stop-before", "600", "--after", "1234", "--max-trials", "6",
                       "--timeout-s", "3600", "--python", "/gpfs/env/bin/python")
    flags = flags_of(argv)
    run_dir = tmp_path / "runs" / "gpus"
    assert flags == {
        "--num_nodes": "4", "--exec_time": "120", "--cpus_per_node": "80", "--gpus_per_node": "4",
        "--node_memory": str(300 * 1024), "--queue": "acc", "--qos": "acc_debug",
        "--project_name": "bsc99",
        "--worker_working_dir": str(run_dir / "jobs" / "compss-work"),
        "--log_dir": str(run_dir / "jobs" / "compss-logs"),
        "--pythonpath": f"{ROOT}:{tmp_path}", "--python_interpreter": "/gpfs/env/bin/python",
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
    assert "drops --account (--project_name)" in err


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
    assert "--port 0 --dashboard-address :0" in script
    assert f"-m hpo run {space.resolve()} --runs-dir {tmp_path / 'runs'} --engine dask" in script
    assert "trap stop_cluster EXIT" in script and "on_signal USR1" in script and "kill -\"$1\" \"$study\"" in script
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


def test_refused_submission_exits_2_with_what_sbatch_said(hpo, space, monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid qos specification' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, _, err = hpo("submit", space, "--time", "5", "--qos", "nope")
    assert status == 2 and "Invalid qos specification" in err and "fix:" in err
    assert read_jobs(tmp_path / "runs" / "toy") == []


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
        {"spec": {"name": "toy", "space": {"other": [1]}}, "storage": "journal.log"}))
    status, _, err = hpo("submit", space, "--time", "5", "--dry-run")
    assert status == 2 and "different search space" in err


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
    argv, new_env = worker_argv(env, "/s.json", workers_per_node=2, gpus_per_worker=2)
    assert new_env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert argv[argv.index("--resources") + 1] == "CPU=20,GPU=2"
    assert argv[argv.index("--nthreads") + 1] == "20" and argv[argv.index("--name") + 1] == "n1-1"
    cpu_only, cpu_env = worker_argv({"SLURM_CPUS_ON_NODE": "48"}, "/s.json", 1, 0, interface="ib0")
    assert cpu_only[cpu_only.index("--resources") + 1] == "CPU=48" and "CUDA_VISIBLE_DEVICES" not in cpu_env
    assert cpu_only[-2:] == ["--interface", "ib0"]
    with pytest.raises(SystemExit, match="needs 2 GPU"):
        worker_argv({**env, "CUDA_VISIBLE_DEVICES": "0,1,2"}, "/s.json", 2, 2)


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
