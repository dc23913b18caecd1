"""Hermes as published: time quanta that grow, preemption only when a waiting
trial ranks higher, percentage milestones, a sign-aware first quantum, SLAQ,
and search that learns from suspended trials."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import optuna
import pytest

import hpo
from hpo.master import QuantumRule, Slaq, Waiting, convergence, milestones_passed
from hpo.search._paused import paused_view
from hpo.trial import TrialStatus, run_trial
from hpo.trial import log_path
from conftest import served_study, toy_space


def processes_of(trial: hpo.TrialRecord, runs_dir, study: str) -> int:
    """How many processes ran the trial's objective (its log has a header,
    naming the pid, for each)."""
    log = log_path(hpo.store.RunDir(runs_dir / study).checkpoint_dir(trial.number))
    return len(re.findall(r"^--- trial \d+, pid (\d+)", log.read_text(), flags=re.M))


def test_a_trial_nobody_waits_for_keeps_its_process(tmp_path):
    # A time limit runs the objective in a child process. One slot, one trial:
    # at every quantum end nothing waits, so it never checkpoints and restarts.
    space = toy_space("alone", "hpo.examples.toy:curve", fixed={"steps": 8},
                      search={"parallel": 1}, resources={"time_limit_s": 60},
                      scheduling={"policy": "convergence", "segment_steps": 2},
                      space={"rate": [0.3]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    (trial,) = result.trials
    assert trial.state is TrialStatus.COMPLETE and trial.steps == 8
    assert [e["kind"] for e in trial.events] == []  # never suspended, never resumed
    assert [s["quanta"] for s in trial.segments] == [3]  # quanta 0-1, 2-3, 4-5 kept the slot
    assert processes_of(trial, tmp_path, "alone") == 1


def test_a_trial_converging_faster_than_the_waiting_ones_is_not_preempted(tmp_path):
    space = toy_space("faster", "hpo.examples.toy:curve", fixed={"steps": 8},
                      search={"parallel": 1}, resources={"time_limit_s": 60},
                      scheduling={"policy": "convergence", "segment_steps": 2},
                      space={"rate": [0.02, 0.9]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    slow, fast = sorted(result.trials, key=lambda t: t.params["rate"])
    # The slow one yields to the new trial; the fast one, ahead of the
    # waiting slow one at every quantum end, runs to its end in one process.
    assert [e["kind"] for e in fast.events] == []
    assert processes_of(fast, tmp_path, "faster") == 1
    assert [e["kind"] for e in slow.events][:2] == ["suspended", "resumed"]
    assert "goes first" in slow.events[0]["reason"]


def test_round_robin_yields_at_every_quantum_and_quanta_grow_with_preemptions(tmp_path):
    space = toy_space("growing", "hpo.examples.toy:curve", fixed={"steps": 14, "step_s": 0.05},
                      search={"parallel": 1},
                      scheduling={"policy": "round_robin", "quantum_s": 0.12, "quantum_growth": 1.0},
                      space={"rate": [0.1, 0.2]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    for trial in result.trials:
        assert trial.state is TrialStatus.COMPLETE and trial.steps == 14
        suspended = [s for s in trial.segments if s["outcome"] == "SUSPENDED"]
        assert len(suspended) >= 2
        # The k-th preemption's quantum is (1 + k) x 0.12 s.
        assert [s["quantum_s"] for s in suspended] == pytest.approx(
            [0.12 * (1 + k) for k in range(len(suspended))])
        for segment in suspended:  # a time quantum holds the reports made within it
            took = segment["ended_at"] - segment["started_at"]
            assert took >= segment["quantum_s"]
            assert segment["checkpoint_bytes"] == 0 and segment["save_s"] == 0  # curve keeps no state


def test_checkpoint_cost_is_measured_and_bounds_the_quantum(tmp_path):
    space = toy_space("ckpt", "hpo.examples.sklearn_digits:train_mlp",
                      metric={"name": "val_loss", "direction": "minimize"},
                      fixed={"max_epochs": 4, "units": 16}, search={"parallel": 1},
                      scheduling={"policy": "round_robin", "segment_steps": 1},
                      space={"learning_rate": [0.01, 0.001]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    segments = [s for t in result.trials for s in t.segments if s["outcome"] == "SUSPENDED"]
    assert segments and all(s["checkpoint_bytes"] > 1000 and s["save_s"] > 0 for s in segments)
    assert any(s["restore_s"] > 0 for s in segments)  # resumed, then suspended again
    shown = subprocess.run([sys.executable, "-m", "hpo", "status", str(tmp_path / "ckpt"), "--trial", "0"],
                           capture_output=True, text=True, check=True).stdout
    assert re.search(r"segment 0: .*SUSPENDED; 1 quanta, last C=.*checkpoint [\d,]+ B, saved in", shown)
    # A quantum is never so short that checkpoints take more than their share.
    rule = QuantumRule(seconds=0.01, max_checkpoint_share=0.05)
    assert rule.length(0, [], checkpoint_s=0.2) == (None, pytest.approx(4.0))


def test_milestones_as_percentage_decreases_of_the_loss():
    assert milestones_passed(["10%", "50%"], [2.0, 1.9], maximize=False) == 0
    assert milestones_passed(["10%", "50%"], [2.0, 1.5, 1.7], maximize=False) == 1  # best so far
    assert milestones_passed(["10%", "50%"], [2.0, 0.9], maximize=False) == 2
    # A maximised metric: accuracy 0.4 -> 0.5 is a 25% decrease of its negation.
    assert milestones_passed(["20%", "30%"], [-0.4, -0.5], maximize=True) == 1
    assert QuantumRule(seconds=10, milestones=("10%",)).length(0, [2.0, 1.0]) == (None, 20.0)


@pytest.mark.parametrize("milestones, place", [(["150%"], "scheduling.milestones[0]"),
                                                (["fast"], "scheduling.milestones[0]")])
def test_bad_milestones_name_the_place(tmp_path, milestones, place):
    path = tmp_path / "space.json"
    path.write_text(__import__("json").dumps(toy_space(
        "bad", scheduling={"policy": "convergence", "milestones": milestones})))
    done = subprocess.run([sys.executable, "-m", "hpo", "validate", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert place.split("[")[0] in done.stderr and "fix" in done.stderr.lower()


def test_both_kinds_of_quantum_are_refused():
    with pytest.raises(hpo.SpaceError, match=r"(?s)scheduling.segment_steps.*quantum_s"):
        hpo.parse_spec({"space": {"x": [1]},
                        "scheduling": {"policy": "convergence", "segment_steps": 2, "quantum_s": 5}})
    assert hpo.parse_spec({"space": {"x": [1]}, "scheduling": {"policy": "slaq"}}).scheduling.quantum_s == 10


def test_the_first_quantum_is_sign_aware():
    # Hermes' (max - min) / n ranks a diverging curve as high as a converging one.
    assert convergence([1.0, 0.5], None) == pytest.approx(0.25)
    assert convergence([0.5, 1.0], None) == pytest.approx(-0.25)


def test_slaq_runs_the_trial_with_most_loss_left():
    queue = [Waiting(0, 0, since=1.0, convergence=0.9, loss_left=0.2),
             Waiting(1, 1, since=2.0, convergence=0.1, loss_left=0.8)]
    assert Slaq().pick(queue).number == 1
    assert Slaq().contender(queue) == math.inf and Slaq().contender([]) is None


def test_samplers_see_suspended_trials_as_pruned_at_their_last_value(tmp_path):
    with served_study(tmp_path / "s.log", "s", "minimize") as served:
        served.store.set_contender(math.inf)
        task = served.task(*served.new_trial(), config={"rate": 0.5, "steps": 6},
                           objective="hpo.examples.toy:curve", metric="value", direction="minimize",
                           checkpoint_dir=str(tmp_path / "c"), quantum=QuantumRule(steps=2))
        assert run_trial(task).state is TrialStatus.SUSPENDED
        study = served.store.study()
    assert study.trials[0].state == optuna.trial.TrialState.WAITING  # suspended: the view writes nothing
    (seen,) = paused_view(study)._get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
    assert seen.last_step == 1 and seen.intermediate_values[1] == pytest.approx(1 - math.exp(-1.0))


def test_bayesian_search_with_convergence_completes_trials_before_the_budget_is_out(tmp_path):
    # Before, every new trial started before any suspended one resumed: nothing
    # finished until the budget was handed out, and TPE learnt from nothing.
    space = toy_space("learns", "hpo.examples.toy:curve", fixed={"steps": 6},
                      search={"algorithm": "bayesian", "max_trials": 16, "parallel": 1, "seed": 1},
                      scheduling={"policy": "round_robin", "segment_steps": 2},
                      space={"rate": {"type": "float", "low": 0.01, "high": 1.0}})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    assert len(result.trials) == 16 and all(t.state is TrialStatus.COMPLETE for t in result.trials)
    first_done = min(t.ended_at for t in result.trials)
    last_opened = max(t.started_at for t in result.trials)
    assert first_done < last_opened
    # At most twice the slots open at once after TPE's start-up (16 // 3 = 5 trials).
    opened_before = sum(t.started_at < first_done for t in result.trials)
    assert opened_before <= 5 + 2
