"""``hpo check-resume``, run as a user runs it: in a subprocess.

The scikit-learn example checkpoints its model and random state, so its
curves after a suspend/resume match a straight run exactly. An objective that
draws a fresh random state when it resumes is caught with a non-zero
difference. Bad input exits 2 naming the place.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = "search_spaces/sklearn_digits_bayesian.json"
CONFIG = {"alpha": 0.001, "l1_ratio": 0.1, "loss": "hinge", "max_epochs": 4}


def check_resume(*args: str, cwd: Path = ROOT, pythonpath: str | None = None
                 ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        pythonpath, str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "hpo", "check-resume", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def rows(stdout: str) -> dict[int, tuple[float, float]]:
    """The table's rows: step -> (metric A, metric B)."""
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\s*(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", line)
        if match:
            found[int(match[1])] = (float(match[2]), float(match[3]))
    return found


def test_sklearn_example_resumes_identically():
    proc = check_resume(SPACE, "--config", json.dumps(CONFIG), "--suspend-at", "2")
    assert proc.returncode == 0, proc.stderr
    table = rows(proc.stdout)
    assert sorted(table) == [0, 1, 2, 3]
    assert all(a == b for a, b in table.values())
    assert "verdict: identical after resume" in proc.stdout
    assert re.search(r"checkpoint: [\d.]+ (bytes|KiB|MiB) on disk; last save [\d.]+ ms", proc.stdout)
    # Progress: each run's start and end.
    assert "run B (suspended after step 2): done" in proc.stderr
    assert "run B (resumed from its checkpoint): done" in proc.stderr


# Checkpoints the step but not the random state: a resumed run draws from a
# fresh generator, as a loop that reseeds from the clock would.
_FORGETFUL = '''
import random

def train(config, trial):
    state = trial.load_checkpoint() or {"step": 0, "value": 0.0}
    rng = random.Random(None if state["step"] else 0)
    for step in range(state["step"], config["steps"]):
        state["value"] += rng.random()
        trial.report(step, score=state["value"])
        state["step"] = step + 1
        trial.save_checkpoint(state)
        if trial.should_stop():
            break
    return {"score": state["value"]}
'''


def test_an_objective_that_forgets_its_random_state_is_reported(tmp_path):
    (tmp_path / "forgetful.py").write_text(_FORGETFUL)
    space = tmp_path / "space.json"
    space.write_text(json.dumps({
        "objective": "forgetful:train", "metric": {"name": "score", "direction": "maximize"},
        "fixed": {"steps": 5}, "space": {"width": [1]}}))
    proc = check_resume(str(space), "--config", "{}", "--suspend-at", "1",
                        pythonpath=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    table = rows(proc.stdout)
    assert all(table[s][0] == table[s][1] for s in (0, 1))  # before the suspend
    assert all(table[s][0] != table[s][1] for s in (2, 3, 4))
    assert re.search(r"max \|difference\| = \S+ at step [234]; this objective does not resume "
                     "deterministically", proc.stdout)
    assert "two straight runs (A, A') are identical" in proc.stdout


def test_bad_input_exits_2_naming_the_place():
    cases = [
        ({**CONFIG, "alhpa": 1}, "2", ["--config", "unknown parameter 'alhpa'", 'did you mean "alpha"']),
        ({"alpha": 0.001}, "2", ["--config", "missing l1_ratio, loss"]),
        (CONFIG, "3", ["--suspend-at 3", "steps 0 to 3", "0 to 2"]),
        (CONFIG, "-1", ["--suspend-at -1", "steps start at 0"]),
    ]
    for config, step, expected in cases:
        proc = check_resume(SPACE, "--config", json.dumps(config), "--suspend-at", step)
        assert proc.returncode == 2, (config, step, proc.stderr)
        assert "Traceback" not in proc.stderr
        for text in expected:
            assert text in proc.stderr, (text, proc.stderr)
    proc = check_resume(SPACE, "--config", "{'alpha': 1}", "--suspend-at", "1")
    assert proc.returncode == 2 and "--config: invalid JSON" in proc.stderr


def test_an_objective_that_never_reports_exits_2(tmp_path):
    (tmp_path / "silent.py").write_text("def train(config, trial):\n    return {'score': 1.0}\n")
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"objective": "silent:train", "metric": {"name": "score"},
                                 "space": {"width": [1]}}))
    proc = check_resume(str(space), "--config", "{}", "--suspend-at", "0",
                        pythonpath=str(tmp_path))
    assert proc.returncode == 2
    assert "never called trial.report" in proc.stderr


def test_every_option_has_help():
    import argparse

    from hpo.cli import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in commands.choices["check-resume"]._actions:
        assert action.help and len(action.help) > 8, action.dest
