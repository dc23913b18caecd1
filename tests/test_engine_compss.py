"""The compss engine against the PyCOMPSs test double (real signatures, runtime checks)."""

from __future__ import annotations

import os

import pytest

import hpo
from hpo.engines import default_engine_name
from hpo.engines import CompssEngine
from hpo.store.records import RUN_ATTR
from conftest import toy_space

_ENV = ("HPO_TRIAL_CPUS", "HPO_TRIAL_GPUS", "HPO_TRIAL_MEMORY_GB", "HPO_TRIAL_TIME_LIMIT_S")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in _ENV:  # the engine exports these; monkeypatch restores them
        monkeypatch.setenv(name, "")


def test_gpu_study_declares_constraints_the_runtime_accepts(compss):
    CompssEngine(cpus=4, gpus=1, memory_gb=2.5, time_limit_s=100).start()
    declared = compss.declared["compss_trial"]
    assert declared["task"] == {"returns": 1, "on_failure": "RETRY", "time_out": 160}
    assert declared["constraint"] == {
        "computing_units": "$HPO_TRIAL_CPUS",
        "processors": [{"processorType": "CPU", "computingUnits": "$HPO_TRIAL_CPUS"},
                       {"processorType": "GPU", "computingUnits": "$HPO_TRIAL_GPUS"}],
        "memory_size": "$HPO_TRIAL_MEMORY_GB",
    }
    assert (os.environ["HPO_TRIAL_CPUS"], os.environ["HPO_TRIAL_GPUS"],
            os.environ["HPO_TRIAL_MEMORY_GB"]) == ("4", "1", "2.5")


def test_cpu_study_declares_only_computing_units(compss):
    CompssEngine(cpus=2).start()
    declared = compss.declared["compss_trial"]
    assert declared["constraint"] == {"computing_units": "$HPO_TRIAL_CPUS"}
    assert declared["task"]["time_out"] == 0 and declared["task"]["on_failure"] == "RETRY"


def test_sequential_mode_runs_the_study_with_values_unchanged(compss, tmp_path):
    # pycompss importable, program run with plain python: tasks run at once.
    from pycompss.api.api import compss_wait_on

    assert default_engine_name() == "dask"
    result = hpo.run(toy_space("seq"), engine="compss", runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8 and result.best.params == {"x": 2, "y": -1}
    marker = object()
    assert compss_wait_on(marker) is marker
    assert compss.submitted == []  # nothing went through the (absent) runtime


def test_under_the_runtime_trials_run_asynchronously(compss, tmp_path):
    compss.start(n_workers=2)
    assert default_engine_name() == "compss"
    space = toy_space("async", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.3},
                      resources={"cpus": 2}, space={"x": [0, 1, 2, 3, 4, 5]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)  # engine auto -> compss
    assert result.counts["COMPLETE"] == 6
    assert compss.waited_unfinished == 0  # completion came from the store
    assert all(s["constraints"] == {"computing_units": "2"} for s in compss.submitted)
    spans = sorted((t.started_at, t.ended_at) for t in result.trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # two trials overlapped


def test_target_stop_cancels_the_queued_groups(compss, tmp_path):
    compss.start(n_workers=1)
    space = toy_space("target", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.5},
                      metric={"target": 9}, search={"parallel": 1},
                      space={"x": [9, 1, 2, 3, 4, 5, 6, 7]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "target" and result.stop["trial"] == 0
    assert result.counts["COMPLETE"] + result.counts["CANCELLED"] == len(result.trials) < 8
    study = hpo.store.RunDir(tmp_path / "target").load_study()
    assert all(RUN_ATTR not in t.user_attrs for t in study.trials if t.number > 1)


def test_compss_engine_without_pycompss_is_a_clear_error(tmp_path):
    with pytest.raises(hpo.UsageError, match="runcompss"):
        hpo.run(toy_space("nocompss"), engine="compss", runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "nocompss").exists()  # rejected before anything was created

