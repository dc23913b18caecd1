"""What a new user meets in the first hour: the README's example run as a
script, the command line's help, what ``hpo run`` and ``hpo status`` print,
one trial in full, exporting learning curves, and names of dict spaces.

Everything runs as a user runs it: scripts and commands in subprocesses,
studies on the inline engine or a real Dask LocalCluster.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.cli import _parser
from test_cli import ENV, HPO, ROOT, ok, run

README = ROOT / "README.md"


def _python(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=180)


def _readme_python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    runnable = [b for b in blocks if "hpo.run(" in b and '__name__ == "__main__"' in b]
    assert len(runnable) == 1, "the README has one runnable hpo.run example"
    return runnable[0]


# ------------------------------------------------------------ item 1: the README's snippet


def test_readme_python_example_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_readme_python_example())
    proc = _python(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Nanny failed" not in proc.stderr and "Traceback" not in proc.stderr
    assert "{'lr': 0.01}" in proc.stdout  # the best configuration, printed by the example
    assert "'COMPLETE': 3" in proc.stdout
    assert (tmp_path / "runs" / "readme-example" / "study.json").is_file()


def test_a_script_without_the_main_guard_stops_at_once_saying_what_to_add(tmp_path):
    body = _readme_python_example().replace('if __name__ == "__main__":', "if True:")
    script = tmp_path / "unguarded.py"
    script.write_text(body)
    proc = _python(script, tmp_path)  # one that hangs instead runs into its timeout and fails
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()
    assert any('if __name__ == "__main__":' in line and "fix:" in line for line in last), proc.stderr
    assert f"{script}, line " in proc.stderr
    assert "Nanny failed" not in proc.stderr and proc.stderr.count("Traceback") == 1
    assert not (tmp_path / "runs").exists()  # nothing recorded


def test_the_inline_engine_needs_no_guard(tmp_path):
    body = _readme_python_example().replace('if __name__ == "__main__":', "if True:")
    script = tmp_path / "inline.py"
    script.write_text(body.replace("hpo.run(space, train)", 'hpo.run(space, train, engine="inline")'))
    proc = _python(script, tmp_path)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------ item 8: the command line's help


def test_bare_hpo_lists_the_commands_and_version_answers():
    proc = run()
    assert proc.returncode == 2
    for command in ("run", "validate", "status", "export", "dashboard", "report", "submit", "jobs",
                    "repair"):
        assert re.search(rf"^\s+{command}\s", proc.stderr, flags=re.M), command
    assert "``" not in proc.stderr and "run, validate, status, export" not in proc.stderr
    assert ok(run("--version")).stdout.strip() == "hpo 0.1.0"


@pytest.mark.parametrize("command", ["run", "validate", "status", "export", "repair", "dashboard",
                                     "report", "submit", "jobs"])
def test_every_option_and_argument_has_help(command):
    parser = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in parser.choices[command]._actions:
        assert action.help and len(action.help) > 8, action.dest


def test_defaults_and_choices_are_shown():
    assert "(default: csv)" in ok(run("export", "--help")).stdout
    run_help = ok(run("run", "--help")).stdout
    assert "grid, random, bayesian" in run_help and "(default: runs)" in run_help


# ------------------------------------------------------------ items 2, 4, 5, 24: status


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A study with completed, failed and printed-to trials (inline engine)."""
    tmp = tmp_path_factory.mktemp("mixed")
    (tmp / "talky.py").write_text(
        "def train(config, trial):\n"
        "    for step in range(3):\n"
        "        print(f'epoch {step} of trial {trial.number}')\n"
        "        trial.report(step, score=config['x'] * (step + 1), loss=1.0 / (step + 1))\n"
        "    if config['x'] == 7:\n"
        "        raise ValueError('diverged at x=7')\n"
        "    return {'score': config['x'] * 3.0 + 12000.5}\n")
    space = tmp / "mixed.json"
    space.write_text(json.dumps({"name": "mixed", "objective": "talky:train",
                                 "metric": {"name": "score", "direction": "maximize"},
                                 "space": {"x": list(range(25))}}))
    proc = subprocess.run([*HPO, "run", str(space), "--engine", "inline", "--runs-dir",
                           str(tmp / "runs"), "--quiet"], cwd=tmp, env={**ENV, "PYTHONPATH": str(tmp)},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return {"run_dir": tmp / "runs" / "mixed", "proc": proc}


def test_run_shows_numbers_without_exponents_and_says_what_was_left_out(mixed):
    out = mixed["proc"].stdout
    assert "e+" not in out
    assert "12072" in out  # 24 * 3 + 12000.5, as a plain number
    assert "... 5 more trials not shown" in out
    assert f"hpo status {mixed['run_dir']} (--all, --trial N)" in out
    assert f"hpo status {mixed['run_dir']} --trial 7" in out  # where the failure's traceback is


def test_status_leaves_out_rows_only_saying_so(mixed):
    out = ok(run("status", mixed["run_dir"])).stdout
    assert "... 5 more trials not shown" in out and "--all for every trial" in out
    assert "details: hpo status" not in out  # it does not point at itself
    assert f"hpo status {mixed['run_dir']} --trial N" in out
    everything = ok(run("status", mixed["run_dir"], "--all")).stdout
    assert "more trials not shown" not in everything and everything.count("COMPLETE") == 24
    assert ok(run("status", mixed["run_dir"], "--limit", "3")).stdout.count("COMPLETE") == 3


def test_failed_trials_have_no_rank(mixed):
    rows = [line.split() for line in ok(run("status", mixed["run_dir"], "--all")).stdout.splitlines()]
    failed = [r for r in rows if len(r) > 2 and r[2] == "FAILED"]
    # rank, trial, state, score, time_s, x, then the error column
    assert failed == [["-", "7", "FAILED", "-", failed[0][4], "7", "ValueError:", "diverged", "at", "x=7"]]
    ranks = [r[0] for r in rows if len(r) > 2 and r[2] == "COMPLETE"]
    assert ranks == [str(i) for i in range(1, 25)]


def test_one_trial_in_full_shows_its_traceback_reports_and_log(mixed):
    out = ok(run("status", mixed["run_dir"], "--trial", "7")).stdout
    assert out.startswith("trial 7: FAILED")
    assert "Traceback (most recent call last)" in out and "ValueError: diverged at x=7" in out
    assert 'talky.py", line 6, in train' in out
    assert re.search(r"^\s+2\s+0\.333333\s+21$", out, flags=re.M)  # step, loss, score
    assert "epoch 2 of trial 7" in out  # what the objective printed, from its log
    log = mixed["run_dir"] / "trials" / "000007" / "output.log"
    assert str(log) in out and "epoch 0 of trial 7" in log.read_text()
    assert "epoch 0 of trial 8" not in log.read_text()  # each trial's own output only
    proc = run("status", mixed["run_dir"], "--trial", "99")
    assert proc.returncode == 2 and "no trial 99" in proc.stderr


# ------------------------------------------------------------ item 6: learning curves


def test_export_learning_curves_as_json_and_long_csv(mixed):
    data = json.loads(ok(run("export", mixed["run_dir"], "--format", "json")).stdout)
    trial = next(t for t in data["trials"] if t["number"] == 4)
    assert [r["step"] for r in trial["reports"]] == [0, 1, 2]
    assert trial["reports"][2]["metrics"] == {"score": 12.0, "loss": pytest.approx(1 / 3)}
    failed = next(t for t in data["trials"] if t["number"] == 7)
    assert "ValueError: diverged" in failed["traceback"]
    rows = list(csv.DictReader(io.StringIO(ok(run("export", mixed["run_dir"], "--curves")).stdout)))
    assert len(rows) == 25 * 3 * 2  # trials x steps x metrics
    assert {"number": "4", "state": "COMPLETE", "step": "2", "metric": "score", "value": "12.0"} in rows
    proc = run("export", mixed["run_dir"], "--curves", "--format", "json")
    assert proc.returncode == 2 and "fix:" in proc.stderr


# ------------------------------------------------------------ item 9: dict spaces


def test_dict_spaces_are_named_by_content(tmp_path):
    import hpo

    def train(config, trial):
        return {"v": float(config["x"])}

    a = {"space": {"x": [1, 2]}, "metric": {"name": "v"}}
    b = {"space": {"x": [3, 4]}, "metric": {"name": "v"}}
    kwargs = dict(engine="inline", runs_dir=tmp_path, progress=False)
    first, second = hpo.run(a, train, **kwargs), hpo.run(b, train, **kwargs)
    assert first.name != second.name and first.name.startswith("study-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])
    assert hpo.run(dict(a), train, **kwargs).name == first.name  # the same dict resumes it
    named = hpo.run({**b, "name": "mine"}, train, **kwargs)
    assert named.name == "mine"
    with pytest.raises(hpo.UsageError) as err:
        hpo.run({**a, "name": "mine"}, train, **kwargs)  # another space under a used name
    assert "hpo.run(name=...)" in str(err.value) and "allow_changes=True" in str(err.value)
