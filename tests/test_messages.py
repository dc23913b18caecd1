"""What a user reads where they slip: `hpo status` given the folder of all
studies lists each one; given a misspelt study name it says which one was
meant; the dashboard's leaderboard shows an inactive parameter as `-`, as
`hpo status` does."""

from __future__ import annotations

import json

import pytest

import hpo
from hpo.dashboards import leaderboard
from hpo.dashboards.data import load_snapshot
from test_cli import ok, run


def _space(name: str, x: list[int]) -> dict:
    return {"name": name, "objective": "hpo.examples.toy:quadratic", "metric": {"name": "value"},
            "search": {"algorithm": "grid"}, "space": {"x": x, "y": [-1]}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A runs folder with two small finished studies, `noise` and `signal`."""
    runs = tmp_path_factory.mktemp("messages") / "runs"
    for name, x in (("noise", [0, 1, 2]), ("signal", [2, 3])):
        hpo.run(_space(name, x), engine="inline", runs_dir=runs, progress=False)
    return runs


def test_status_of_a_folder_of_studies_lists_each_one(runs):
    out = ok(run("status", runs)).stdout
    lines = out.strip().splitlines()
    noise = next(line for line in lines if "noise" in line)
    signal = next(line for line in lines if "signal" in line)
    assert "3 trials: 3 complete" in noise and "best value=0" in noise
    assert "2 trials: 2 complete" in signal
    assert f"hpo status {runs / 'noise'}" in out  # how to see one in full
    summaries = json.loads(ok(run("status", runs, "--json")).stdout)
    assert [s["study"] for s in summaries] == ["noise", "signal"]
    assert summaries[0]["run_dir"] == str(runs / "noise") and summaries[0]["trials"] == 3


def test_status_of_a_folder_with_trial_names_the_study_to_pick(runs):
    proc = run("status", runs, "--trial", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hpo: error:" in proc.stderr and "fix:" in proc.stderr
    assert f"hpo status {runs / 'noise'} --trial 0" in proc.stderr


def test_status_of_a_misspelt_study_says_which_was_meant(runs):
    proc = run("status", runs / "noisy")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{runs / 'noisy'}: no such directory" in proc.stderr
    assert f"did you mean {runs / 'noise'}?" in proc.stderr
    proc = run("status", runs / "noisy", "--trial", "1")
    assert proc.returncode == 2 and f"did you mean {runs / 'noise'}?" in proc.stderr
    # Nothing like it: the usual fix, no guess.
    proc = run("status", runs / "zzzzzz")
    assert proc.returncode == 2 and "did you mean" not in proc.stderr and "fix:" in proc.stderr


def test_the_leaderboard_shows_an_inactive_parameter_as_a_dash(tmp_path):
    space = {"name": "cells", "metric": {"name": "loss", "direction": "minimize"},
             "search": {"algorithm": "grid", "parallel": 1},
             "space": {"solver": [{"value": "sgd", "space": {"momentum": [0.0, 0.9]}}, "adam"]}}
    hpo.run(space, lambda config, trial: config.get("momentum", 1.0), engine="inline",
            runs_dir=tmp_path, progress=False)
    snap = load_snapshot(tmp_path / "cells")
    column = next(c for c in leaderboard.columns(snap) if c["name"] == "momentum")
    assert column["type"] == "numeric"
    assert column["format"]["nully"] == "-"  # what DataTable shows for an empty number cell
    # The data stays empty: sorting puts it last, "is blank" finds it, the CSV leaves it empty.
    adam = next(r for r in leaderboard.rows(snap) if r[f"param_{snap.param_names.index('solver')}"] == "adam")
    assert adam[column["id"]] is None
    csv_row = leaderboard.to_csv([adam], leaderboard.columns(snap)).splitlines()[1].split(",")
    names = [c["name"] for c in leaderboard.columns(snap)]
    assert csv_row[names.index("momentum")] == ""


@pytest.mark.parametrize("objective, fix", [
    ("noisy_obj.py:train", 'name the module, not its file: "noisy_obj:train" (without .py)'),
    ("noisy_obj:trian", "did you mean noisy_obj:train?"),
])
def test_an_objective_named_with_a_slip_gets_the_fix(tmp_path, objective, fix):
    (tmp_path / "noisy_obj.py").write_text("def train(config, trial):\n    return 1.0\n")
    space = tmp_path / "space.json"
    space.write_text(json.dumps({**_space("slip", [0]), "objective": objective}))
    done = run("validate", space)
    assert done.returncode == 2 and f"fix: {fix}" in done.stderr, done.stderr


def test_a_resumed_run_says_what_it_takes_up_and_what_is_left(tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps(_space("again", [0, 1, 2])))
    ok(run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs", "--max-trials", "1"))
    done = ok(run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs"))
    assert "resuming: 1 of up to 3 trials done (0 failed)" in done.stderr and "up to 2 new" in done.stderr


def test_a_changed_space_is_refused_naming_the_parameter_that_changed(tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps(_space("changed", [0, 1])))
    ok(run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs"))
    space.write_text(json.dumps({**_space("changed", [0, 1]), "space": {"x": [0, 1, 2], "z": [1]}}))
    done = run("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs")
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert '"z" added' in said and '"y" removed' in said and '"x": {"choices": [0, 1],' in said, said
