"""Conditional spaces: parameters that exist only for some values of others.

The grid holds every active combination exactly once (checked against the
full product reduced to its active parameters), samplers draw only active
parameters, the objective and the store see only those, and the leaderboard,
the export and the dashboard leave the others blank.
"""

from __future__ import annotations

import csv
import io
import itertools
import json

import pytest

import hpo
from hpo.dashboards import figures, leaderboard
from hpo.dashboards.data import load_snapshot
from hpo.dashboards.views import VIEWS
from hpo.errors import SpaceError
from hpo.space import parse_spec
from test_cli import run
from test_e2e import stored_trials

# SGD has a momentum, and Nesterov only with a momentum; Adam has a beta_1.
NESTED = {
    "lr": [0.01, 0.1],
    "solver": [
        {"value": "adam", "space": {"beta_1": [0.8, 0.9]}},
        {"value": "sgd", "space": {
            "momentum": [0.0, 0.5, 0.9],
            "nesterov": {"type": "categorical", "choices": [True, False], "when": {"momentum": [0.5, 0.9]}},
        }},
        "rmsprop",
    ],
}
# Units for each layer a network has: conditions on an int, the rest of its range one class.
LAYERS = {
    "layers": {"type": "int", "low": 1, "high": 6},
    "units_2": {"type": "categorical", "choices": [32, 64], "when": {"layers": [2, 3]}},
    "units_3": {"type": "categorical", "choices": [16, 32, 64], "when": {"layers": 3}},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5, "num": 3, "when": {"units_3": 64}},
}


def active_by_brute_force(spec) -> set[tuple]:
    """Every combination of every parameter, reduced to its active ones."""
    names = list(spec.params)
    axes = [list(spec.params[n].grid_values()) for n in names]
    return {tuple(sorted(spec.active(dict(zip(names, values))).items())) for values in itertools.product(*axes)}


@pytest.mark.parametrize("space", [NESTED, LAYERS], ids=["nested", "int_condition_chain"])
def test_grid_holds_each_active_combination_once(space):
    spec = parse_spec({"space": space})
    grid = spec.grid()
    points = list(grid)
    keys = [tuple(sorted(p.items())) for p in points]
    assert len(set(keys)) == len(points) == grid.size == spec.grid_size == spec.max_trials
    assert set(keys) == active_by_brute_force(spec)
    assert all(spec.active(p) == p for p in points)
    assert [grid.index(p) for p in points] == list(range(len(points)))


def test_nested_grid_size_and_order():
    grid = parse_spec({"space": NESTED}).grid()
    # lr 2 x (adam 2 + sgd (momentum 0 + 2 x nesterov 2 = 5) + rmsprop 1) = 16
    assert grid.size == 16
    assert grid[0] == {"beta_1": 0.8, "lr": 0.01, "solver": "adam"}
    assert grid[-1] == {"lr": 0.1, "solver": "rmsprop"}
    assert {"lr": 0.01, "momentum": 0.0, "solver": "sgd"} in grid
    assert {"lr": 0.01, "momentum": 0.0, "nesterov": True, "solver": "sgd"} not in grid


def test_huge_conditional_grid_is_counted_and_indexed_lazily():
    wide = {f"p{i:02d}": list(range(10)) for i in range(20)}
    spec = parse_spec({"space": {"model": ["linear", {"value": "deep", "space": wide}]}})
    grid = spec.grid()
    assert grid.size == 10**20 + 1  # linear alone, then every deep combination
    assert grid[0] == {"model": "linear"}
    assert grid[-1] == {"model": "deep", **{name: 9 for name in wide}}
    assert grid.index(grid[10**19]) == 10**19


def test_the_normalised_form_round_trips():
    spec = parse_spec({"space": NESTED})
    assert spec.params["momentum"].when == (("solver", ("sgd",)),)
    assert spec.params["nesterov"].when == (("momentum", (0.5, 0.9)), ("solver", ("sgd",)))
    assert parse_spec(spec.to_dict()) == spec
    assert "when momentum in [0.5, 0.9], solver='sgd'" in spec.describe()


@pytest.mark.parametrize(("space", "path", "words"), [
    ({"x": [1, 2], "y": {"type": "categorical", "choices": [1], "when": {"z": 1}}},
     "$.space.y.when.z", ["unknown parameter 'z'"]),
    ({"opt": ["adam", "sgd"], "m": {"type": "categorical", "choices": [1], "when": {"opt": "sdg"}}},
     "$.space.m.when.opt", ["'sdg' is not a value of 'opt'", "['adam', 'sgd']"]),
    ({"a": {"type": "categorical", "choices": [1, 2], "when": {"b": 1}},
      "b": {"type": "categorical", "choices": [1, 2], "when": {"a": 1}}},
     "$.space.a", ["cycle among ['a', 'b']"]),
    ({"lr": {"type": "float", "low": 0.1, "high": 1.0},
      "m": {"type": "categorical", "choices": [1], "when": {"lr": 0.5}}},
     "$.space.m.when.lr", ["a float range"]),
    ({"opt": [{"value": "sgd", "space": {"m": [1]}}, {"value": "rms", "space": {"m": [2]}}]},
     "$.space.opt[1].space.m", ["defined twice"]),
    ({"opt": [{"value": "sgd", "spaces": {}}]}, "$.space.opt[0]", ['"value" and "space"']),
    ({"opt": [{"value": "sgd", "space": {"m": {"type": "categorical", "choices": [1],
                                               "when": {"opt": "sgd"}}}}]},
     "$.space.opt[0].space.m.when.opt", ["already set by where the parameter is nested"]),
])
def test_bad_conditions_name_the_place(space, path, words):
    with pytest.raises(SpaceError) as error:
        parse_spec({"space": space})
    message = str(error.value)
    assert f"{path}: " in message and "fix:" in message, message
    for word in words:
        assert word in message, message


def test_validate_refuses_an_unknown_condition_value_with_exit_status_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"space": {
        "opt": ["adam", "sgd"], "m": {"type": "categorical", "choices": [0.9], "when": {"opt": "SGD"}}}}))
    proc = run("validate", bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "$.space.m.when.opt: 'SGD' is not a value of 'opt'" in proc.stderr
    assert "fix: use values of 'opt'" in proc.stderr


def seen_by(calls: list[dict]):
    """An objective that records the configuration it receives; SGD with
    Nesterov momentum is best, as the curves of real training often are."""
    def objective(config: dict, trial) -> float:
        calls.append(dict(config))
        loss = {"adam": 0.3, "sgd": 0.2, "rmsprop": 0.5}[config["solver"]] + abs(config["lr"] - 0.05)
        loss -= 0.1 * config.get("momentum", 0) + (0.05 if config.get("nesterov") else 0.0)
        loss += 0.1 * abs(config.get("beta_1", 0.9) - 0.9)
        return loss
    return objective


def study(name: str, space: dict, **search) -> dict:
    return {"name": name, "metric": {"name": "loss", "direction": "minimize"},
            "search": {"parallel": 1, **search}, "fixed": {"epochs": 1}, "space": space}


CONTINUOUS = {**NESTED, "lr": {"type": "float", "low": 1e-3, "high": 0.3, "log": True},
              "solver": [NESTED["solver"][0] | {"space": {"beta_1": {"type": "float", "low": 0.5, "high": 0.99}}},
                         *NESTED["solver"][1:]]}


def check_active_only(run_dir, calls: list[dict], spec) -> None:
    """Each trial stored and run with exactly its active parameters (and the fixed ones)."""
    trials = stored_trials(run_dir)
    assert trials and all(t.params == spec.active(t.params) for t in trials)
    assert all(set(t.distributions) == set(t.params) for t in trials)
    assert sorted(json.dumps(c, sort_keys=True) for c in calls) == \
        sorted(json.dumps({**t.params, "epochs": 1}, sort_keys=True) for t in trials)


def test_grid_study_runs_each_active_combination_once(tmp_path):
    calls: list[dict] = []
    space = study("cond_grid", NESTED, algorithm="grid")
    result = hpo.run(space, seen_by(calls), engine="inline", runs_dir=tmp_path, progress=False)
    spec = parse_spec(space)
    assert [{k: v for k, v in c.items() if k != "epochs"} for c in calls] == list(spec.grid())
    check_active_only(tmp_path / space["name"], calls, spec)


@pytest.mark.parametrize("algorithm", ["random", "bayesian"])
def test_sampled_studies_draw_only_active_parameters(tmp_path, algorithm):
    calls: list[dict] = []
    space = study(f"cond_{algorithm}", CONTINUOUS, algorithm=algorithm, max_trials=24, seed=2)
    result = hpo.run(space, seen_by(calls), engine="inline", runs_dir=tmp_path, progress=False)
    spec = parse_spec(space)
    check_active_only(tmp_path / space["name"], calls, spec)
    assert len(calls) == 24 and {c["solver"] for c in calls} == {"adam", "sgd", "rmsprop"}
    assert any("nesterov" in c for c in calls) and any(c.get("momentum") == 0.0 for c in calls)
    if algorithm == "bayesian":
        # Grouped TPE models each set of parameters that occur together: once it
        # learns, its joint proposals include the sub-spaces' parameters.
        learnt = [json.loads(v) for t in stored_trials(tmp_path / space["name"])
                  for k, v in t.system_attrs.items() if k.startswith("tpe:relative_params")]
        assert any({"momentum", "beta_1"} & set(params) for params in learnt), learnt


def test_leaderboard_export_and_dashboard_mark_inactive_parameters(tmp_path):
    space = study("cond_views", NESTED, algorithm="grid")
    result = hpo.run(space, seen_by([]), engine="inline", runs_dir=tmp_path, progress=False)

    # Tables show "-" for a value a trial lacks, an inactive parameter too; CSV an empty cell.
    header, _, *rows = result.table().splitlines()
    momentum = header.split().index("momentum")
    assert len(rows) == 16 and {row.split()[momentum] for row in rows if " adam" in row} == {"-"}
    exported = list(csv.DictReader(io.StringIO(result.to_csv())))
    adam = [row for row in exported if row["params.solver"] == "adam"]
    assert adam and all(row["params.momentum"] == "" and row["params.beta_1"] for row in adam)

    snap = load_snapshot(tmp_path / space["name"])
    names = snap.param_names
    for row in leaderboard.rows(snap):
        trial = snap.by_number[row["trial"]]
        assert all((row[f"param_{i}"] is None) == (name not in trial.params) for i, name in enumerate(names))
    (parcoords,) = [t for t in figures.parallel(snap).data if t.visible is not False]
    momentum = next(d for d in parcoords.dimensions if d.label == "momentum")
    blank = momentum.tickvals[list(momentum.ticktext).index("")]
    lines = [t for t in snap.trials if t.state.name == "COMPLETE"]
    assert sum(v == blank for v in momentum.values) == sum("momentum" not in t.params for t in lines) > 0
    beta = next(d for d in parcoords.dimensions if d.label == "beta_1")
    assert beta.ticktext[0] == "" and min(beta.values) == beta.tickvals[0] < 0.8
    for view in VIEWS:
        view.figure(snap)  # every view draws a conditional study
