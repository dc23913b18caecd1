"""One table per extension point: every name builds, and the command line,
the space file's validation and the error messages all offer the same names."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest

from hpo import registry
from hpo.engines import Engine
from hpo.errors import SpaceError
from hpo.master import Policy
from hpo.space import parse_spec
from hpo.store import Pruning


def test_every_registered_name_builds_what_it_names():
    for name in registry.PRUNERS.names:
        pruner = registry.PRUNERS.make(name, min_steps=1)
        assert pruner is None if name == "none" else isinstance(pruner, Pruning) and pruner.name == name
    for name in registry.POLICIES.names:
        policy = registry.POLICIES.make(name)
        assert isinstance(policy, Policy) and policy.name == name
    for name in registry.ENGINES.names:
        assert issubclass(registry.ENGINES.factory(name), Engine)
        assert registry.ENGINES.factory(name).name == name
    tpe = registry.SAMPLERS.make("tpe", seed=1, max_trials=30)
    assert isinstance(tpe, optuna.samplers.TPESampler)
    assert isinstance(registry.ALGORITHMS.make("random", seed=1), optuna.samplers.RandomSampler)


def test_an_unknown_name_is_refused_with_the_choices_and_a_guess():
    with pytest.raises(ValueError, match=r"unknown pruner 'medain' \(did you mean 'median'\?\); "
                                         r"expected one of none, median, asha, hyperband"):
        registry.PRUNERS.make("medain")


@pytest.mark.parametrize("section, key, table", [
    ("early_stopping", "pruner", registry.PRUNERS), ("scheduling", "policy", registry.POLICIES),
    ("search", "algorithm", registry.ALGORITHMS),
])
def test_the_space_file_accepts_exactly_the_registered_names(section, key, table):
    for name in table.names:
        extra = {"max_trials": 2} if section == "search" else {}
        parse_spec({"space": {"x": [1, 2]}, section: {key: name, **extra}})
    with pytest.raises(SpaceError) as refused:
        parse_spec({"space": {"x": [1, 2]}, section: {key: "nope"}})
    assert all(f'"{name}"' in str(refused.value) for name in table.names)


def test_the_command_line_offers_the_registered_names():
    out = subprocess.run([sys.executable, "-m", "hpo", "run", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "{auto," + ",".join(registry.ENGINES.names) + "}" in out.replace("\n", "").replace(" ", "")
    assert "one of: " + ", ".join(registry.ALGORITHMS.names) in " ".join(out.split())
