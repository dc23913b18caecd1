"""Search spaces: parameter kinds, the lazy grid and the study file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hpo.space import (
    CategoricalParam,
    FloatParam,
    Grid,
    IntParam,
    Retries,
    SpaceError,
    load_spec,
    parse_spec,
)

SPACES = Path(__file__).resolve().parent.parent / "search_spaces"
MNIST = {"optimizer": ["Adam", "SGD", "RMSprop"], "num_epochs": [20, 50, 100], "batch_size": [32, 64, 128]}


def full(space: dict, **top) -> dict:
    return {**top, "space": space}


# --- the original study's flat form ------------------------------------------


def test_flat_form_of_the_original_study():
    spec = load_spec(SPACES / "mnist_grid.json")
    grid = spec.grid()
    assert spec.name == "mnist_grid"
    assert spec.search.algorithm == "grid"
    assert spec.grid_size == len(grid) == spec.max_trials == 27
    assert grid.keys == ("batch_size", "num_epochs", "optimizer")
    assert grid[0] == {"batch_size": 32, "num_epochs": 20, "optimizer": "Adam"}
    assert grid[1] == {"batch_size": 32, "num_epochs": 20, "optimizer": "SGD"}
    assert grid[3] == {"batch_size": 32, "num_epochs": 50, "optimizer": "Adam"}
    assert grid[26] == {"batch_size": 128, "num_epochs": 100, "optimizer": "RMSprop"}
    assert list(grid)[26] == grid[-1] == grid[26]
    assert len({json.dumps(c, sort_keys=True) for c in grid}) == 27
    with pytest.raises(IndexError):
        grid[27]


def test_dict_without_file_is_named_study():
    assert parse_spec(MNIST).name == "study"
    assert parse_spec(MNIST, default_name="my study").name == "my-study"


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.json")), ids=lambda p: p.name)
def test_example_spaces_parse_and_round_trip(path):
    spec = load_spec(path)
    assert parse_spec(spec.to_dict(), default_name="other") == spec
    assert spec.max_trials >= 1
    assert spec.describe()


def test_example_spaces_contents():
    quick = load_spec(SPACES / "digits_quick.json")
    assert (quick.name, quick.grid_size, quick.search.parallel) == ("digits-quick", 12, 2)
    assert quick.fixed == {"num_epochs": 8, "batch_size": 64}
    assert load_spec(SPACES / "cifar10_grid.json").resources.gpus == 1
    assert load_spec(SPACES / "mnist_cnn_grid.json").grid()[0] == parse_spec(MNIST).grid()[0]
    bayes = load_spec(SPACES / "digits_bayesian.json")
    assert (bayes.search.sampler, bayes.metric.target, bayes.early_stopping.pruner) == ("tpe", 0.97, "median")
    assert bayes.grid_size is None and bayes.max_trials == 16


# --- the full form -------------------------------------------------------------


FULL = {
    "name": "digits",
    "objective": "hpo.examples.keras_digits:train",
    "metric": {"name": "val_loss", "direction": "minimize", "target": 0.1},
    "search": {"algorithm": "bayesian", "sampler": "gp", "max_trials": 30, "parallel": 4, "seed": 1,
               "timeout_s": 3600},
    "resources": {"cpus": 2, "gpus": 1, "memory_gb": 8, "time_limit_s": 600},
    "retries": 2,
    "early_stopping": {"pruner": "asha", "min_steps": 2},
    "fixed": {"num_epochs": 8, "extra": {"nested": [1, 2]}},
    "space": {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "dropout": {"type": "float", "low": 0, "high": 0.5, "step": 0.1},
        "units": {"type": "int", "low": 16, "high": 128, "step": 16},
        "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
        "act": ["relu", None],
    },
}


def test_full_form_fields_and_round_trip():
    spec = parse_spec(FULL)
    assert spec.metric.direction == "minimize" and spec.metric.target == 0.1
    assert spec.search.timeout_s == 3600.0 and spec.resources.memory_gb == 8.0
    assert (spec.retries, spec.early_stopping.min_steps) == (Retries(objective=2, engine=2), 2)
    assert list(spec.params) == sorted(FULL["space"])
    assert spec.grid_size is None and spec.max_trials == 30
    data = spec.to_dict()
    assert data["space"]["act"] == {"type": "categorical", "choices": ["relu", None]}
    assert data["space"]["units"] == {"type": "int", "low": 16, "high": 128, "step": 16, "log": False}
    assert json.loads(json.dumps(data)) == data
    assert parse_spec(data) == spec


def test_defaults_are_filled():
    spec = parse_spec(full({"x": [1, 2]}))
    assert spec.objective == "hpo.examples.keras_mnist:train"
    assert (spec.metric.name, spec.metric.direction, spec.metric.target) == ("val_accuracy", "maximize", None)
    assert (spec.search.algorithm, spec.search.sampler, spec.search.parallel) == ("grid", None, None)
    assert (spec.resources.cpus, spec.resources.gpus, spec.retries) == (1, 0, Retries(0, 0))
    assert spec.early_stopping.pruner == "none" and spec.fixed == {}
    assert parse_spec(full({"x": [1]}, search={"algorithm": "bayesian"})).search.sampler == "tpe"


def test_fixed_is_copied():
    fixed = {"layers": [64, 64]}
    spec = parse_spec(full({"x": [1]}, fixed=fixed))
    fixed["layers"].append(1)
    assert spec.fixed == {"layers": [64, 64]}


# --- parameter kinds -----------------------------------------------------------


def test_categorical():
    param = CategoricalParam("opt", ["adam", 2, 2.5, True, None])
    assert param.choices == ("adam", 2, 2.5, True, None)
    assert list(param.grid_values()) == ["adam", 2, 2.5, True, None]
    assert param.describe() == "categorical ['adam', 2, 2.5, True, None]"


def test_int_by_step_and_log():
    assert IntParam("u", 16, 128, step=16).grid_values() == range(16, 129, 16)
    assert list(IntParam("u", 1, 10, step=4).grid_values()) == [1, 5, 9]
    assert IntParam("u", 1, 5, log=True).grid_values() == range(1, 6)
    assert list(IntParam("n", 1, 1000, log=True, num=4).grid_values()) == [1, 10, 100, 1000]
    assert list(IntParam("n", 1, 4, log=True, num=10).grid_values()) == [1, 2, 3, 4]  # rounding merges


def test_float_by_step_num_and_log():
    assert list(FloatParam("d", 0, 0.5, step=0.1).grid_values()) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert list(FloatParam("d", 0, 0.55, step=0.25).grid_values()) == [0.0, 0.25, 0.5]
    assert list(FloatParam("d", 0, 1, num=5).grid_values()) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert list(FloatParam("lr", 1e-4, 1e-1, log=True, num=4).grid_values()) == [1e-4, 1e-3, 1e-2, 1e-1]
    assert FloatParam("d", 0, 1, num=3).is_finite and not FloatParam("d", 0, 1).is_finite
    assert FloatParam("lr", 1e-4, 0.1, log=True).describe() == "float [0.0001, 0.1] log"


def test_grid_values_are_plain_python_types():
    params = {
        "f": FloatParam("f", 0, 1, num=3), "g": FloatParam("g", 1, 100, log=True, num=3),
        "i": IntParam("i", 1, 100, log=True, num=3), "s": FloatParam("s", 0, 1, step=0.5),
    }
    for config in Grid(params):
        assert all(type(v) in (int, float) for v in config.values()), config


def test_distributions():
    dists = parse_spec(FULL).distributions()
    assert dists["lr"] == FloatDistribution(1e-4, 0.1, log=True)
    assert dists["dropout"] == FloatDistribution(0.0, 0.5, step=0.1)
    assert dists["units"] == IntDistribution(16, 128, step=16)
    assert dists["optimizer"] == CategoricalDistribution(["adam", "sgd"])
    assert isinstance(dists["act"], CategoricalDistribution)
    assert FloatParam("x", 0, 1, num=5).distribution() == FloatDistribution(0.0, 1.0)


def test_distributions_fit_stepped_ranges_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert IntParam("u", 1, 10, step=4).distribution() == IntDistribution(1, 9, step=4)
        assert FloatParam("d", 0.1, 1.0, step=0.2).distribution().high == 0.9


# --- the lazy grid -------------------------------------------------------------


def test_billion_point_grid_is_lazy_and_exact():
    params = {f"p{k}": IntParam(f"p{k}", 0, 9) for k in range(9)}
    grid = Grid(params)  # a billion dicts made eagerly would never fit: lazy or this fails
    assert len(grid) == grid.size == 10**9
    assert grid[123456789] == {f"p{k}": int(d) for k, d in enumerate("123456789")}
    assert grid[10**9 - 1] == {f"p{k}": 9 for k in range(9)}
    assert grid.index(grid[987654321]) == 987654321 and grid[5] in grid
    with pytest.raises(IndexError):
        grid[10**9]


def test_grid_counts_beyond_maxsize():
    grid = Grid({f"p{k}": IntParam(f"p{k}", 1, 1000) for k in range(8)})
    assert grid.size == 1000**8
    assert grid[grid.size - 1] == {f"p{k}": 1000 for k in range(8)}


def test_grid_over_continuous_float_names_the_parameter():
    with pytest.raises(SpaceError) as info:
        Grid({"lr": FloatParam("lr", 1e-4, 0.1, log=True)})
    assert info.value.path == "$.space.lr" and '"num"' in info.value.fix and '"step"' in info.value.fix


# --- bad input -----------------------------------------------------------------


def space(**params) -> dict:
    return {"space": params}


BAD = [
    # (data, path, words in the message)
    ([1, 2], "$", ["JSON object"]),
    ({}, "$", ["no parameters"]),
    ({"optimizer": "Adam"}, "$.optimizer", ["list of choices", "'Adam'", '"space"', '"fixed"']),
    ({"serach": {}, "space": {"x": [1]}}, "$.serach", ["'serach'", '"search"']),
    (space(x=[]), "$.space.x", ["non-empty list"]),
    (space(x=["a", "b", "a"]), "$.space.x[2]", ["duplicate", "'a'"]),
    (space(x=[1, True]), "$.space.x[1]", ["duplicate"]),
    (space(x=[[1]]), "$.space.x[0]", ["string, number, boolean or null"]),
    (space(x=5), "$.space.x", ["5", '"fixed"', "[5]"]),
    (space(x={"type": "categorical", "choices": []}), "$.space.x.choices", ["non-empty"]),
    (space(x={"low": 1, "high": 2}), "$.space.x.type", ["type"]),
    (space(x={"type": "integer", "low": 1, "high": 2}), "$.space.x.type", ["'integer'", '"int"']),
    (space(x={"type": "int", "low": 1, "hgih": 2}), "$.space.x.hgih", ["'hgih'", '"high"']),
    (space(x={"type": "int", "low": 1}), "$.space.x.high", ["missing"]),
    (space(x={"type": "int", "low": 5, "high": 5}), "$.space.x", ["low >= high", "5"]),
    (space(x={"type": "float", "low": 1.0, "high": 0.5}), "$.space.x", ["low >= high"]),
    (space(x={"type": "float", "low": 0, "high": 1, "log": True}), "$.space.x.low", ["low > 0", "0.0"]),
    (space(x={"type": "int", "low": -1, "high": 8, "log": True}), "$.space.x.low", ["low > 0"]),
    (space(x={"type": "int", "low": 1.5, "high": 8}), "$.space.x.low", ["integer", "1.5"]),
    (space(x={"type": "float", "low": True, "high": 8}), "$.space.x.low", ["number", "True", "boolean"]),
    (space(x={"type": "float", "low": "0", "high": 8}), "$.space.x.low", ["number", "'0'", "string"]),
    (space(x={"type": "float", "low": 1, "high": 8, "log": "yes"}), "$.space.x.log", ["true or false"]),
    (space(x={"type": "float", "low": 1, "high": 8, "log": True, "step": 1}), "$.space.x.step", ['"log"']),
    (space(x={"type": "float", "low": 1, "high": 8, "step": 0}), "$.space.x.step", ["> 0"]),
    (space(x={"type": "float", "low": 1, "high": 8, "step": 1, "num": 3}), "$.space.x.num", ['"step"']),
    (space(x={"type": "float", "low": 1, "high": 8, "num": 1}), "$.space.x.num", [">= 2"]),
    (space(x={"type": "int", "low": 1, "high": 8, "log": True, "step": 2}), "$.space.x.step", ["step 1"]),
    (space(x={"type": "int", "low": 1, "high": 8, "num": 3}), "$.space.x.num", ['"log"']),
    (space(**{"a b": {"type": "int", "low": 3, "high": 1}}), '$.space["a b"]', ["low >= high"]),
    ({"space": {}}, "$.space", ["non-empty object"]),
    ({"space": [1, 2]}, "$.space", ["object", "array"]),
    ({**space(x=[1]), "search": {"algorithm": "bayes"}}, "$.search.algorithm", ["'bayes'", '"bayesian"']),
    ({**space(x=[1]), "search": {"sampler": "gp"}}, "$.search.sampler", ["bayesian"]),
    ({**space(x=[1]), "search": {"algorithm": "bayesian", "sampler": "cma"}}, "$.search.sampler", ["'cma'"]),
    ({**space(x=[1]), "search": {"max_trials": 0}}, "$.search.max_trials", [">= 1", "0"]),
    ({**space(x=[1]), "search": {"parallel": "2"}}, "$.search.parallel", ["integer", "'2'"]),
    ({**space(x=[1]), "search": {"timeout_s": -5}}, "$.search.timeout_s", ["> 0"]),
    ({**space(x=[1]), "search": {"maxtrials": 5}}, "$.search.maxtrials", ['"max_trials"']),
    ({**space(x=[1]), "search": []}, "$.search", ["object"]),
    ({**space(x=[1]), "metric": {"direction": "max"}}, "$.metric.direction", ['"maximize"']),
    ({**space(x=[1]), "metric": {"target": "high"}}, "$.metric.target", ["number"]),
    ({**space(x=[1]), "resources": {"gpus": -1}}, "$.resources.gpus", [">= 0"]),
    ({**space(x=[1]), "resources": {"cpus": 0}}, "$.resources.cpus", [">= 1"]),
    ({**space(x=[1]), "retries": True}, "$.retries", ["integer", "True"]),
    ({**space(x=[1]), "retries": {"engine": -1}}, "$.retries.engine", [">= 0"]),
    ({**space(x=[1]), "retries": {"objectives": 1}}, "$.retries.objectives", ['"objective"']),
    ({**space(x=[1]), "early_stopping": {"pruner": "hyper"}}, "$.early_stopping.pruner", ['"hyperband"']),
    ({**space(x=[1]), "name": "../evil"}, "$.name", ["directory name"]),
    ({**space(x=[1]), "name": ""}, "$.name", ["name"]),
    ({**space(x=[1]), "objective": "mymodule.train"}, "$.objective", ["package.module:function"]),
    ({**space(x=[1]), "objective": "my-module:train"}, "$.objective", ["package.module:function"]),
    ({**space(x=[1]), "objective": 3}, "$.objective", ["package.module:function"]),
    ({**space(x=[1]), "fixed": {"x": 2}}, "$.fixed.x", ["'x'", "space"]),
    ({**space(x=[1]), "fixed": [1]}, "$.fixed", ["object"]),
    (space(lr={"type": "float", "low": 0.1, "high": 1}), "$.space.lr", ["no grid points"]),
    ({**space(lr={"type": "float", "low": 0.1, "high": 1}), "search": {"algorithm": "random"}},
     "$.search.max_trials", ["random search over a continuous range", "lr", "budget"]),
    ({**space(lr={"type": "float", "low": 0.1, "high": 1}), "search": {"algorithm": "bayesian"}},
     "$.search.max_trials", ["bayesian search", "budget"]),
]


@pytest.mark.parametrize("data, path, words", BAD, ids=[f"{p}:{w[0]}" for _, p, w in BAD])
def test_bad_input_is_reported_where_it_is(data, path, words):
    with pytest.raises(SpaceError) as info:
        parse_spec(data, "s.json")
    error = info.value
    assert error.source == "s.json" and error.path == path, str(error)
    assert error.fix, str(error)
    for word in words:
        assert word in str(error), (word, str(error))
    assert str(error).startswith(f"s.json: {path}: ")


def test_fix_for_a_continuous_grid_says_num_or_step():
    with pytest.raises(SpaceError) as info:
        parse_spec(space(lr={"type": "float", "low": 0.1, "high": 1}))
    assert '"num"' in info.value.fix and '"step"' in info.value.fix
    with pytest.raises(SpaceError) as info:
        parse_spec({**space(lr={"type": "float", "low": 0.1, "high": 1}), "search": {"algorithm": "random"}})
    assert '"max_trials"' in info.value.fix


@pytest.mark.parametrize("text, line, column", [
    ('{"x": [1, 2,]}', 1, 13),
    ('{\n  "x": [1, 2]\n  "y": [3]\n}', 3, 3),
    ("", 1, 1),
])
def test_invalid_json_names_line_and_column(tmp_path, text, line, column):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_spec(path)
    where = f"line {line}, column {column}"
    assert info.value.path == "$" and where in info.value.problem, str(info.value)
    assert info.value.fix == f"check the JSON syntax near {where}"


def test_duplicate_json_keys_are_rejected(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"x": [1], "x": [2]}')
    with pytest.raises(SpaceError, match="duplicate key 'x'"):
        load_spec(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpaceError) as info:
        load_spec(tmp_path / "nope.json")
    assert "no such file" in info.value.problem and info.value.fix


def test_constructed_params_are_validated_too():
    with pytest.raises(SpaceError, match=r"\$\.space\.u: low >= high"):
        IntParam("u", 3, 3)
    with pytest.raises(SpaceError, match=r"\$\.space\.opt\.choices"):
        CategoricalParam("opt", [])


# --- overrides -----------------------------------------------------------------


def test_with_overrides_revalidates():
    spec = load_spec(SPACES / "mnist_grid.json")
    random = spec.with_overrides(algorithm="random", max_trials=5, seed=3, parallel=None)
    assert (random.search.algorithm, random.max_trials, random.search.seed) == ("random", 5, 3)
    assert random.search.parallel is None and random.params == spec.params
    with pytest.raises(SpaceError) as info:
        spec.with_overrides(max_trials=0)
    assert info.value.path == "$.search.max_trials" and info.value.source == spec.source
    with pytest.raises(SpaceError, match=r"\$\.search\.algorithm"):
        spec.with_overrides(algorithm="annealing")
    with pytest.raises(TypeError, match="trials"):
        spec.with_overrides(trials=5)


def test_with_overrides_between_algorithms():
    bayes = load_spec(SPACES / "digits_bayesian.json")
    assert bayes.with_overrides(algorithm="random").search.sampler is None
    assert bayes.with_overrides(sampler="gp").search.sampler == "gp"
    with pytest.raises(SpaceError, match=r"\$\.space\.learning_rate"):
        bayes.with_overrides(algorithm="grid")  # a continuous range has no grid
    grid = parse_spec(MNIST)
    assert grid.with_overrides(algorithm="bayesian").search.sampler == "tpe"
    with pytest.raises(SpaceError, match=r"\$\.search\.sampler"):
        grid.with_overrides(sampler="gp")


# --- describe ------------------------------------------------------------------


def test_describe():
    text = parse_spec(FULL).describe()
    for line in ["lr         float [0.0001, 0.1] log", "optimizer  categorical ['adam', 'sgd']",
                 "units      int [16, 128] step 16", "dropout    float [0.0, 0.5] step 0.1",
                 "infinite (continuous ranges)", "bayesian (gp)", "max_trials 30", "target 0.1",
                 "hpo.examples.keras_digits:train", "2 cpu(s), 1 gpu(s)"]:
        assert line in text, (line, text)
    big = parse_spec({f"p{k}": list(range(10)) for k in range(7)}).describe()
    assert "grid size   10,000,000" in big


def test_spec_is_a_frozen_value():
    spec = parse_spec(MNIST)
    with pytest.raises(AttributeError):
        spec.name = "other"
    changed = spec.with_overrides(max_trials=3)
    assert changed.max_trials == 3 and spec.max_trials == parse_spec(MNIST).max_trials != 3
