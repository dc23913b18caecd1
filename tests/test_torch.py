"""PyTorch and Lightning trials, trained for real on the CPU: reports, the
master's decisions (pruned, target, suspended), exact resume from the trial's
checkpoint, a retry after the worker died, and DDP with one decision for all
ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import hpo  # noqa: E402
from hpo.trial import Trial, TrialStatus  # noqa: E402
from conftest import (  # noqa: E402
    ROOT, curve, hpo_run_on, run_in_segments, running_pid, toy_space, wait_for,
)

TORCH = "hpo.examples.torch_digits:train"
LIGHTNING = "hpo.examples.lightning_digits:train"


@pytest.mark.parametrize("objective", [TORCH, LIGHTNING])
def test_a_trial_suspended_every_two_epochs_has_the_curve_of_a_straight_run(tmp_path, objective):
    config = {"learning_rate": 0.03, "max_epochs": 5, "dropout": 0.2, "seed": 4}
    whole = run_in_segments(tmp_path, objective, config, None, "whole", "val_accuracy", "maximize")
    pieces = run_in_segments(tmp_path, objective, config, 2, "pieces", "val_accuracy", "maximize")
    assert list(curve(pieces)) == [0, 1, 2, 3, 4]  # the epoch counter went on
    assert curve(pieces) == curve(whole)  # exactly: weights, optimizer, LR, data order, dropout
    assert pieces.value == whole.value and pieces.state.name == "COMPLETE"


def test_check_resume_on_the_pytorch_example_shows_identical_curves():
    config = {"optimizer": "sgd", "learning_rate": 0.05, "channels": 8, "dropout": 0.1,
              "max_epochs": 4}
    proc = subprocess.run(
        [sys.executable, "-m", "hpo", "check-resume", "search_spaces/torch_digits.json",
         "--config", json.dumps(config), "--suspend-at", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "verdict: identical after resume" in proc.stdout


def test_the_checkpoint_holds_what_an_exact_resume_needs(tmp_path):
    from hpo.examples import torch_digits
    from hpo.torch import CHECKPOINT_NAME

    trial = Trial(0, {}, tmp_path)
    torch_digits.train({"max_epochs": 1, "lr_decay": 0.5}, trial)
    state = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)  # no pickled code
    assert {"model", "optimizer", "scheduler", "epoch", "step", "rng", "sampler_generator"} <= set(state)
    assert state["epoch"] == 1 and state["step"] > 0
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert state["scheduler"]["last_epoch"] == 1


def test_torch_study_on_dask_prunes_the_hopeless_trial(dask_address, tmp_path):
    # A learning rate of 1e-6 leaves the network at chance; the median pruner
    # stops it against the curves of the trials that learn. One at a time: the
    # pruner judges only once two trials completed, and with two slots Dask may
    # start the last trial while only one has.
    space = toy_space("torch-prune", TORCH, metric={"name": "val_accuracy", "direction": "maximize"},
                      search={"parallel": 1}, fixed={"max_epochs": 6, "channels": 8},
                      early_stopping={"pruner": "median", "min_steps": 1},
                      space={"learning_rate": [0.05, 0.04, 0.03, 1e-6]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    by_rate = {t.params["learning_rate"]: t for t in result.trials}
    assert by_rate[0.05].state is TrialStatus.COMPLETE and by_rate[0.05].steps == 6
    hopeless = by_rate[1e-6]
    assert hopeless.state is TrialStatus.PRUNED and hopeless.steps < 6
    assert [e["kind"] for e in hopeless.events] == ["pruned"]


@pytest.mark.parametrize("objective", [TORCH, LIGHTNING])
def test_a_study_target_stops_running_torch_and_lightning_trials(dask_address, tmp_path, objective):
    # The 3-epoch trial ends past 50% validation accuracy: the study's target;
    # the 2,000-epoch one running beside it (minutes, were it not stopped) is
    # told to stop and returns early.
    space = toy_space("target", objective, metric={"name": "val_accuracy", "direction": "maximize",
                                                   "target": 0.5},
                      fixed={"learning_rate": 0.05}, space={"max_epochs": [2000, 3]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "target"
    long = next(t for t in result.trials if t.params["max_epochs"] == 2000)
    assert long.state is TrialStatus.STOPPED and long.steps < 2000 and long.value is not None
    assert [e["kind"] for e in long.events] == ["stopped"]


def test_lightning_ddp_on_cpus_ranks_share_one_decision(tmp_path):
    # Two gloo ranks in the trial's process group. Rank 0 reports and asks;
    # patience stops it at its second epoch (no gain of 1.0), and rank 1 stops
    # at the same epoch (else it would wait at its next collective and the
    # trial never end).
    space = toy_space("ddp", LIGHTNING, metric={"name": "val_accuracy", "direction": "maximize"},
                      search={"parallel": 1}, early_stopping={"patience": 1, "min_delta": 1.0},
                      fixed={"max_epochs": 30, "strategy": "ddp", "devices": 2},
                      resources={"cpus": 2, "time_limit_s": 600},  # a process of its own
                      space={"learning_rate": [0.05]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    (trial,) = result.trials
    assert trial.state is TrialStatus.COMPLETE and trial.steps == 2
    assert trial.events[0]["kind"] == "stopped" and "patience" in trial.events[0]["reason"]
    stored = hpo.store.RunDir(tmp_path / "ddp").load_study().trials[0]
    assert sorted(stored.intermediate_values) == list(range(trial.steps))  # one report per epoch
    log = (tmp_path / "ddp" / "trials").glob("*/output.log")
    text = "".join(p.read_text() for p in log)
    assert "trial 0, rank 1, pid" in text  # the second rank trained too, as a follower


def test_a_torch_trial_on_a_killed_worker_resumes_from_its_checkpoint(tmp_path):
    from distributed import LocalCluster

    space = toy_space("workerloss", TORCH, metric={"name": "val_accuracy", "direction": "maximize"},
                      fixed={"max_epochs": 16, "channels": 8}, search={"parallel": 1},
                      space={"learning_rate": [0.05]})
    run_dir = tmp_path / "workerloss"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        study = hpo_run_on(cluster.scheduler_address, space, tmp_path)
        pid = wait_for(lambda: running_pid(run_dir, 3), timeout=180, what="the trial's third epoch")
        os.kill(pid, signal.SIGKILL)  # the worker process dies mid-trial
        assert study.wait(timeout=300) == 0
    (trial,) = hpo.StudyResult.load(run_dir).trials
    assert trial.state is TrialStatus.COMPLETE and trial.attempt == 2
    stored = hpo.store.RunDir(run_dir).load_study().trials[0]
    assert sorted(stored.intermediate_values) == list(range(16))
    log = next((run_dir / "trials").glob("*/output.log")).read_text()
    assert ", from step " in log  # the second attempt went on from the checkpoint


def test_the_fashion_mnist_cnn_trains_on_debians_data(tmp_path):
    from hpo.examples import datasets, torch_digits

    try:
        datasets.locate_mnist(None)
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    trial = Trial(0, {}, tmp_path)
    best = torch_digits.train_fashion({"max_epochs": 2, "train_samples": 600, "val_samples": 200},
                                      trial)
    assert [step for step, _ in trial.reports] == [0, 1]
    assert set(best) == {"val_loss", "val_accuracy"}
