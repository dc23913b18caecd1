"""hpo submit from wherever the user stands: the objective imported with the
job's own PYTHONPATH, a resume command that repeats the submission from any
directory, the warning for a stop margin that eats the walltime, and the
help of every option. No SLURM needed (--dry-run)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import toy_space
from hpo.cli import _parser
from hpo.registry import ALGORITHMS

# hpo, space: tests/conftest.py; no site profile of this machine's user leaks in.
pytestmark = pytest.mark.usefixtures("no_user_site")

OBJECTIVE = "def train(config, trial):\n    return {'value': float(config['x'])}\n"


def run_hpo(cwd: Path, *args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m hpo ARGS`` in ``cwd`` with no PYTHONPATH and no site profile."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HPO_SITE")}
    clean["XDG_CONFIG_HOME"] = str(cwd / ".config")
    return subprocess.run([sys.executable, "-m", "hpo", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**clean, **(env or {})})


def study_beside(tmp_path: Path, objective: str) -> Path:
    folder = tmp_path / "study"
    folder.mkdir(exist_ok=True)
    (folder / "beside_objective.py").write_text(OBJECTIVE)
    space = folder / "beside.json"
    space.write_text(json.dumps(toy_space("beside", objective)))
    return space


def script_value(script: str, name: str) -> str:
    """The value a ``name=...`` line of the batch script assigns."""
    line = next(line for line in script.splitlines() if line.startswith(f"{name}="))
    return shlex.split(line[len(name) + 1:])[0]


# -- item 25: the objective beside the space -------------------------------------


def test_objective_beside_the_space_submits_from_another_directory(tmp_path):
    space = study_beside(tmp_path, "beside_objective:train")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_hpo(elsewhere, "submit", space, "--time", "5", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    export = next(line for line in proc.stdout.splitlines() if line.startswith("export PYTHONPATH="))
    assert export.startswith(f"export PYTHONPATH={space.parent}:{elsewhere}"), export
    # What was checked is what the job has: its PYTHONPATH line imports the objective.
    probe = "from hpo.trial import resolve_objective as r; print(r('beside_objective:train')({'x': 2}, None))"
    job = subprocess.run(["bash", "-c", f"{export}\n{shlex.quote(sys.executable)} -c {shlex.quote(probe)}"],
                         cwd=elsewhere, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert job.stdout.strip() == "{'value': 2.0}", job.stderr


def test_objective_nowhere_on_the_jobs_path_is_refused(tmp_path):
    space = study_beside(tmp_path, "nowhere_objective:train")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_hpo(elsewhere, "submit", space, "--time", "5", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert "cannot import module 'nowhere_objective'" in proc.stderr
    assert f"fix: the job imports 'nowhere_objective' with {space.parent}:{elsewhere}" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- item 26: the resume command -------------------------------------------------


def test_resume_command_repeats_the_submission_from_any_directory(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    space = study_beside(tmp_path, "beside_objective:train")
    options = ["--time", "5", "--runs-dir", "my runs", "--algorithm", "random", "--max-trials", "3",
               "--seed", "7", "--setup", "export A='1 2'", "--extra=--reservation=r", "--nodes", "1"]
    first = run_hpo(here, "submit", os.path.relpath(space, here), *options, "--dry-run")
    assert first.returncode == 0, first.stderr
    line = script_value(first.stdout, "resubmit")
    words = shlex.split(line)
    assert words[:3] == ["cd", str(here), "&&"] and words[3:7] == [sys.executable, "-m", "hpo", "submit"]
    assert words[7] == str(space) and f"--runs-dir={here / 'my runs'}" in words
    for option in ("--algorithm=random", "--max-trials=3", "--seed=7", "--setup=export A='1 2'",
                   "--extra=--reservation=r", "--time=5"):
        assert option in words, words
    # Run from another directory, it submits exactly the same job.
    again = subprocess.run(["bash", "-c", f"{line} --dry-run"], cwd=there, capture_output=True,
                           text=True, timeout=120,
                           env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                                "XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


def test_resume_command_names_the_profile_found_in_the_environment(tmp_path, space):
    site = tmp_path / "site.toml"
    site.write_text('partition = "acc"\n')
    proc = run_hpo(tmp_path, "submit", space, "--time", "5", "--dry-run", env={"HPO_SITE": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert f"--site={site}" in shlex.split(script_value(proc.stdout, "resubmit"))
    proc = run_hpo(tmp_path, "submit", space, "--time", "5", "--site", "none", "--dry-run",
                   env={"HPO_SITE": str(site)})
    assert "--site=none" in shlex.split(script_value(proc.stdout, "resubmit"))


def test_jobs_prints_the_resume_command_after_a_stop(hpo, space, monkeypatch, tmp_path):
    """A submission records its resume command; hpo jobs shows it once the job stopped."""
    from hpo.launchers.records import read_jobs, write_ending

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho '31;cluster'\n")
    (fake / "squeue").write_text("#!/bin/sh\n")  # the job has left the queue
    (fake / "scontrol").write_text(
        "#!/bin/sh\necho 'JobId=31 JobState=COMPLETED Reason=None ExitCode=0:0 RunTime=00:01:00'\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, _, err = hpo("submit", space, "--time", "5", "--runs-dir", "elsewhere")
    assert status == 0, err
    run_dir = tmp_path / "elsewhere" / "toy"
    [record] = read_jobs(run_dir)
    write_ending(run_dir, "31", {"exit_status": 138, "reported_exit": 0, "signal": "SIGUSR1",
                                 "clean": True, "left_running": 0, "suspended": 1, "stop": None})
    status, out, err = hpo("jobs", run_dir)
    assert status == 0, err
    assert f"resume: {record['resubmit']}" in out and f"--runs-dir={tmp_path / 'elsewhere'}" in out


# -- item 27: a stop margin that eats the walltime -------------------------------


@pytest.mark.parametrize("options, warned", [
    (["--time", "1"], ["--time 1 (60 s) with the default stop margin of 30 s", "after only 0 s",
                       "at most 15 s"]),
    (["--time", "2", "--stop-before", "40"], ["--stop-before of 40 s", "after only 50 s"]),
    (["--time", "1", "--stop-before", "15"], None),
    (["--time", "120"], None),
])
def test_a_large_stop_margin_is_warned_about(hpo, space, options, warned):
    status, out, err = hpo("submit", space, *options, "--dry-run")
    assert status == 0 and out.startswith("#!/bin/bash"), err
    if warned is None:
        assert "warning" not in err, err
    else:
        assert "hpo: warning:" in err and "fix: a smaller --stop-before" in err, err
        for words in warned:
            assert words in err, err


def test_compss_margin_warning_has_no_signal_slack(hpo, space):
    status, _, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "1",
                         "--sc-cfg", "x.cfg", "--dry-run")
    assert status == 0 and "may stop after only 30 s" in err and "SLURM may signal" not in err, err


# -- item 8: help ----------------------------------------------------------------


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def squeezed(text: str) -> str:
    """``text`` without its whitespace: argparse wraps help lines at hyphens
    and inside words longer than a line (a path), wherever the terminal's width puts them."""
    return "".join(text.split())


def test_submit_help_lists_algorithms_and_defaults(capsys, monkeypatch):
    # A checkout whose path has hyphens and is longer than a help line.
    python = "/home/a-user/checkouts/hyper-parameter-optimisation-with-a-long-name/.venv/bin/python3"
    monkeypatch.setattr(sys, "executable", python)
    with pytest.raises(SystemExit):
        subcommand("submit").parse_args(["--help"])
    text = squeezed(capsys.readouterr().out)
    assert squeezed("search algorithm, one of: " + ", ".join(ALGORITHMS.names)) in text
    for shown in ("--nodes N nodes (default: as many as the space's widest trial needs", "--engine {dask,compss}", "(default: dask)",
                  "--runs-dir DIR parent of run directories (default: runs)",
                  f"(default: this one, {python})", "--gpus-per-node G GPUs per node (default: 0)"):
        assert squeezed(shown) in text, shown
    assert "(default:[])" not in text and "(default:None)" not in text
