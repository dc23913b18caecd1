"""Early stopping and scheduling on real engines: pruners, patience, the study's
stop, and trials run in resumable segments (round-robin, convergence-aware)."""

from __future__ import annotations


import optuna
import pytest

import hpo
from hpo.master import (
    ConvergenceAware, QuantumRule, RoundRobin, Waiting, convergence,
)
from hpo.trial import TrialStatus
from hpo.store.records import EVENT_ATTR, SEGMENT_ATTR
from conftest import curve, run_in_segments, toy_space


def events(trial: optuna.trial.FrozenTrial) -> list[dict]:
    return [v for k, v in sorted(trial.system_attrs.items()) if k.startswith(EVENT_ATTR)]


def stored(tmp_path, name: str) -> list[optuna.trial.FrozenTrial]:
    return hpo.store.RunDir(tmp_path / name).load_study().get_trials()


# ------------------------------------------------------------------ pruning


@pytest.mark.parametrize("pruner, qualities, worse", [
    ("median", [1.0, 0.95, 0.9, 0.2], [0.2]),
    ("asha", [1.0, 0.95, 0.9, 0.2], [0.2]),
    # Hyperband splits trials into brackets that compete only among
    # themselves, so it needs more of them to find competitors.
    ("hyperband", [1.0, 0.98, 0.96, 0.94, 0.92, 0.2, 0.21, 0.22], [0.2, 0.21, 0.22]),
])
def test_each_pruner_stops_clearly_worse_curves_on_dask(dask_address, tmp_path, pruner, qualities, worse):
    space = toy_space(f"prune-{pruner}", "hpo.examples.toy:curve", fixed={"steps": 9, "step_s": 0.05},
                      early_stopping={"pruner": pruner, "min_steps": 1}, space={"quality": qualities})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    by_quality = {t.params["quality"]: t for t in result.trials}
    assert by_quality[1.0].state is TrialStatus.COMPLETE and by_quality[1.0].steps == 9
    pruned = [q for q in worse if by_quality[q].state is TrialStatus.PRUNED]
    assert len(pruned) >= (1 if pruner == "hyperband" else len(worse))
    for quality in pruned:
        trial = by_quality[quality]
        assert trial.steps < 9  # stopped early, on a worker, from the curves in the store
        (event,) = trial.events
        assert event["kind"] == "pruned" and event["step"] == trial.steps - 1
        assert pruner in event["reason"]
    assert all(t.value is not None and t.value <= by_quality[1.0].value for t in result.trials)


def test_patience_stops_a_trial_that_no_longer_improves(dask_address, tmp_path):
    # A curve that flattens fast: after a few steps it gains less than 0.01 a step.
    space = toy_space("patience", "hpo.examples.toy:curve", fixed={"steps": 30, "rate": 1.0},
                      early_stopping={"patience": 2, "min_delta": 0.01}, space={"quality": [1.0]})
    (trial,) = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path,
                       progress=False).trials
    assert trial.state is TrialStatus.COMPLETE  # an ordinary end of training
    assert 4 <= trial.steps < 10
    (event,) = trial.events
    assert event["kind"] == "stopped" and event["reason"].startswith("patience")


def test_target_stop_reaches_running_trials_under_compss(compss, tmp_path):
    compss.start(nodes=2, cpus_per_node=1)
    # Trial 0 is slow (60 steps); trial 1 reaches the target (-1) at its third step.
    space = toy_space("target", metric={"target": -1}, fixed={"step_s": 0.05, "y": 0},
                      search={"parallel": 2}, space={"steps": [60, 3], "x": [2]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "target"
    slow = next(t for t in result.trials if t.params["steps"] == 60)
    assert slow.state is TrialStatus.STOPPED and slow.steps < 60 and slow.value is not None
    assert [e["kind"] for e in slow.events] == ["stopped"]
    assert "target reached by trial" in slow.events[0]["reason"]


# ------------------------------------------------------- resumable segments


def test_sklearn_trial_resumes_exactly_where_its_segment_stopped(tmp_path):
    config = {"learning_rate": 0.01, "units": 32, "max_epochs": 7}
    objective = "hpo.examples.sklearn_digits:train_mlp"
    whole = run_in_segments(tmp_path, objective, config, None, "whole")
    pieces = run_in_segments(tmp_path, objective, config, 3, "pieces")
    # Same epochs, same losses: model, optimizer and random state came back.
    assert list(curve(pieces)) == list(range(7))
    assert curve(pieces) == curve(whole)
    assert pieces.value == whole.value and pieces.state == optuna.trial.TrialState.COMPLETE
    segments = [v for k, v in sorted(pieces.system_attrs.items()) if k.startswith(SEGMENT_ATTR)]
    assert [(s["first_step"], s["last_step"], s["outcome"]) for s in segments] == [
        (0, 2, "SUSPENDED"), (3, 5, "SUSPENDED"), (6, 6, "COMPLETE")]
    assert [(e["kind"], e["step"]) for e in events(pieces)] == [("suspended", 2), ("suspended", 5)]
    record = hpo.TrialRecord.from_frozen(pieces)
    assert record.attempt == 1 and record.steps == 7


def test_keras_trial_resumes_from_its_checkpoint(tmp_path):
    config = {"units": 32, "num_epochs": 4, "learning_rate": 0.01, "seed": 3}
    objective = "hpo.examples.keras_digits:train"
    whole = run_in_segments(tmp_path, objective, config, None, "whole")
    pieces = run_in_segments(tmp_path, objective, config, 2, "pieces")
    assert list(curve(pieces)) == [0, 1, 2, 3]  # the epoch counter continued
    assert (tmp_path / "pieces" / "ckpt" / "keras" / "latest.weights.h5").is_file()
    # Epoch 2 starts from epoch 1's weights and optimizer state, not from
    # scratch: its loss follows the uninterrupted run's, far below epoch 0's.
    for step in (2, 3):
        assert abs(curve(pieces)[step] - curve(whole)[step]) < 0.25 * curve(whole)[step]
        assert curve(pieces)[step] < 0.6 * curve(pieces)[0]


@pytest.mark.parametrize("policy, first_resumed, segments", [
    ("convergence", 0.8, 2),  # resumed, each converges faster than those waiting: runs to its end
    ("round_robin", 0.05, 3),  # time-sharing: yields at every quantum while anyone waits
])
def test_policy_chooses_which_suspended_trial_goes_on(dask_address, tmp_path, policy, first_resumed,
                                                      segments):
    # One slot; three trials whose curves rise at different speeds.
    space = toy_space(f"policy-{policy}", "hpo.examples.toy:curve", fixed={"steps": 6},
                      search={"parallel": 1},
                      scheduling={"policy": policy, "segment_steps": 2},
                      space={"rate": [0.05, 0.8, 0.2]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert all(t.state is TrialStatus.COMPLETE and t.steps == 6 for t in result.trials)
    resumed = sorted((e["time"], t.params["rate"], e["reason"])
                     for t in result.trials for e in t.events if e["kind"] == "resumed")
    assert resumed[0][1] == first_resumed
    assert [len(t.segments) for t in result.trials] == [segments] * 3
    if policy == "convergence":
        assert resumed[0][2].startswith("convergence: C=")


def test_target_stop_ends_suspended_trials_as_stopped(dask_address, tmp_path):
    # The short, fast-rising trial reaches the target after its second segment.
    space = toy_space("stop-suspended", "hpo.examples.toy:curve", metric={"target": 0.9},
                      search={"parallel": 1},
                      scheduling={"policy": "convergence", "segment_steps": 2},
                      space={"rate": [0.01, 1.5], "steps": [20, 4]})
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "target"
    (fast,) = [t for t in result.trials if t.params == {"rate": 1.5, "steps": 4}]
    assert fast.state is TrialStatus.COMPLETE and fast.steps == 4
    for other in (t for t in result.trials if t is not fast):
        assert other.state is TrialStatus.STOPPED and other.steps < other.params["steps"]
        assert other.value is not None and other.events[-1]["kind"] == "stopped"


# ---------------------------------------------------------------- policies


def waiting(number: int, since: float, c: float) -> Waiting:
    return Waiting(number=number, trial_id=number, since=since, convergence=c)


def test_convergence_follows_hermes():
    assert convergence([2.0, 1.0], None) == pytest.approx(0.5)  # first segment: (max - min) / n
    # Representative losses 1.5 then 0.75, over 3 reports.
    assert convergence([1.0, 0.5, 0.75], [2.0, 1.0]) == pytest.approx(0.25)
    assert convergence([1.0, 1.2], [1.0, 0.9]) < 0  # got worse


def test_policies_pick_the_fastest_or_the_longest_waiting():
    queue = [waiting(0, since=1.0, c=0.1), waiting(1, since=3.0, c=0.9), waiting(2, since=2.0, c=0.5)]
    assert ConvergenceAware().pick(queue).number == 1
    assert RoundRobin().pick(queue).number == 0


def test_segments_lengthen_past_each_milestone():
    rule = QuantumRule(steps=2, milestones=(0.5, 0.9), maximize=True)
    assert rule.length(0, []) == (2, None)
    assert rule.length(0, [-0.2, -0.6]) == (4, None)  # losses are the negated accuracy
    assert rule.length(0, [-0.2, -0.95]) == (8, None)
    assert QuantumRule(steps=3, milestones=(1.0, 0.1)).length(0, [2.0, 0.5]) == (6, None)


def test_unknown_policy_is_a_space_error():
    with pytest.raises(hpo.SpaceError, match=r"scheduling.policy.*round_robin"):
        hpo.parse_spec({"space": {"x": [1]}, "scheduling": {"policy": "round-robin"}})


def test_compss_submits_the_chosen_segment_with_the_priority_flag(compss, tmp_path):
    compss.start(nodes=1, cpus_per_node=1)
    space = toy_space("priority", "hpo.examples.toy:curve", fixed={"steps": 4},
                      search={"parallel": 1}, scheduling={"policy": "convergence", "segment_steps": 2},
                      space={"rate": [0.1, 0.9]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    # The slow trial yields to the new one, which converges faster than it
    # and so keeps its slot to the end; then the slow one resumes.
    assert [(t.state, len(t.segments)) for t in result.trials] == [
        (TrialStatus.COMPLETE, 2), (TrialStatus.COMPLETE, 1)]
    plain, first = (f"compss_trial__cpus1_gpus0_mem0mb_timeout0s{s}" for s in ("", "_first"))
    assert compss.declared[first]["task"]["priority"] is True
    calls = [(s["function"], s["priority"]) for s in compss.submitted]
    # Two first segments as ordinary tasks, then the resumed one prioritised.
    assert calls == [(plain, False)] * 2 + [(first, True)]


def test_objective_that_restarts_instead_of_resuming_still_ends(tmp_path):
    # quadratic always starts at step 0: each segment would repeat the first.
    space = toy_space("restarts", fixed={"steps": 6}, search={"parallel": 1},
                      scheduling={"policy": "round_robin", "segment_steps": 3}, space={"x": [1, 2]})
    result = hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    assert all(t.state is TrialStatus.COMPLETE and t.steps == 6 for t in result.trials)
    for trial in result.trials:
        kinds = [e["kind"] for e in trial.events]
        assert kinds == ["suspended", "resumed", "unresumable"]
        assert "instead of resuming" in trial.events[-1]["reason"]
