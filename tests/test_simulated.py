"""The simulated engine: the real master and store on simulated time.

Times here are simulated seconds, exact by construction: the assertions are
on the arithmetic of the simulation, never on the machine's clock.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import hpo
from hpo.engines import SimulatedCosts, SimulatedEngine
from hpo.errors import UsageError
from conftest import ROOT, toy_space

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

NO_COSTS = SimulatedCosts(dispatch_s=0, start_s=0, save_s=0, restore_s=0)


def curves(name: str, count: int, steps: int = 10, step_s: float = 60.0, search: dict | None = None,
           **extra) -> dict:
    """``count`` learning curves of ``steps`` steps costing ``step_s`` each,
    on every slot of the engine."""
    return {"name": name, "objective": "hpo.examples.toy:curve", "metric": {"name": "value"},
            "search": {"algorithm": "grid", **(search or {})},
            "fixed": {"steps": steps, "step_s": step_s},
            "space": {"rate": [round(0.1 * (i + 1), 1) for i in range(count)]}, **extra}


def test_trials_take_the_slots_in_turn_on_simulated_time(tmp_path):
    engine = SimulatedEngine(slots=4, costs=SimulatedCosts(dispatch_s=0.5, start_s=0, save_s=0, restore_s=0))
    result = hpo.run(curves("turns", 10), engine=engine, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 10 and all(t.steps == 10 for t in result.trials)
    # 10 trials on 4 slots: three rounds of (dispatch + 10 steps of 60 s).
    assert engine.clock.now() == pytest.approx(3 * (0.5 + 600.0))


def test_the_study_time_budget_is_simulated_time(tmp_path):
    engine = SimulatedEngine(slots=2, costs=NO_COSTS)
    space = curves("budget", 8, search={"timeout_s": 900})
    result = hpo.run(space, engine=engine, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "timeout_s"
    # The master looks at its deadline as it passes; trials then running stop
    # at their next report, and those queued never start.
    assert 900 <= engine.clock.now() <= 960
    assert result.counts["COMPLETE"] == 2 and result.counts["STOPPED"] == 2
    assert result.counts["CANCELLED"] + result.counts["COMPLETE"] + result.counts["STOPPED"] == len(result.trials)


def test_a_trial_past_its_simulated_time_limit_times_out(tmp_path):
    engine = SimulatedEngine(slots=1, costs=NO_COSTS)
    space = toy_space("limit", "hpo.examples.toy:curve", resources={"time_limit_s": 250},
                      search={"parallel": 1}, fixed={"steps": 10},
                      space={"step_s": [20.0, 60.0]})
    result = hpo.run(space, engine=engine, runs_dir=tmp_path, progress=False)
    by_step = {t.params["step_s"]: t for t in result.trials}
    assert by_step[20.0].state is hpo.TrialStatus.COMPLETE
    assert by_step[60.0].state is hpo.TrialStatus.TIMEOUT and by_step[60.0].steps == 4
    assert "time_limit_s=250" in by_step[60.0].error
    assert engine.clock.now() == pytest.approx(200 + 250)


def test_suspended_segments_pay_hpos_costs_of_save_start_and_restore(tmp_path):
    costs = SimulatedCosts(dispatch_s=1.0, start_s=10.0, save_s=100.0, restore_s=1000.0)
    engine = SimulatedEngine(slots=1, costs=costs)
    space = curves("segments", 2, scheduling={"policy": "round_robin", "segment_steps": 5})
    result = hpo.run(space, engine=engine, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 2 and all(t.steps == 10 for t in result.trials)
    suspended = sum(e["kind"] == "suspended" for t in result.trials for e in t.events)
    resumed = sum(e["kind"] == "resumed" for t in result.trials for e in t.events)
    tasks = 2 + resumed
    assert suspended >= 1 and resumed == suspended  # on one slot: everything in a row
    assert engine.clock.now() == pytest.approx(2 * 600 + tasks * 1.0 + suspended * 100.0 + resumed * 1010.0)


def test_the_same_study_takes_the_same_decisions_every_run(tmp_path):
    """Events run one at a time in order of simulated time: the pruner sees
    the same reports in the same order, whatever the machine is doing."""
    space = toy_space("again", "hpo.examples.toy:curve", fixed={"steps": 12, "step_s": 30},
                      search={"algorithm": "random", "max_trials": 40, "parallel": 8, "seed": 7},
                      early_stopping={"pruner": "median", "min_steps": 2},
                      space={"rate": {"type": "float", "low": 0.01, "high": 1.0},
                             "quality": {"type": "float", "low": 0.2, "high": 1.0}})
    runs = []
    for attempt in range(2):
        engine = SimulatedEngine(slots=8)
        result = hpo.run(space, engine=engine, runs_dir=tmp_path / str(attempt), progress=False)
        runs.append(({t.number: (t.state, t.steps) for t in result.trials}, engine.clock.now()))
    assert runs[0] == runs[1]
    assert any(state is hpo.TrialStatus.PRUNED for state, _ in runs[0][0].values())


def test_slots_and_costs_are_checked_with_the_fix():
    with pytest.raises(UsageError, match="1 to 4096"):
        SimulatedEngine(slots=0)
    with pytest.raises(UsageError, match="1 to 4096"):
        SimulatedEngine(slots=5000)
    assert SimulatedCosts.parse("start=7,save=1.5") == SimulatedCosts(start_s=7, save_s=1.5)
    with pytest.raises(UsageError, match="(?s)unknown cost 'boot'.*fix: use dispatch, start, save, restore"):
        SimulatedCosts.parse("boot=3")
    with pytest.raises(UsageError, match="fix"):
        SimulatedCosts.parse("start=-1")


def test_hpo_run_on_the_command_line_says_the_simulated_time_and_costs(tmp_path):
    space = tmp_path / "space.json"
    space.write_text(__import__("json").dumps(curves("cli", 4)))
    done = subprocess.run([sys.executable, "-m", "hpo", "run", str(space), "--engine", "simulated",
                           "--workers", "2", "--simulated-costs", "dispatch=0,start=7", "--quiet",
                           "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "simulated time: 1,200 s on 2 slots" in done.stderr and "process start 7000 ms" in done.stderr
    refused = subprocess.run([sys.executable, "-m", "hpo", "run", str(space), "--simulated-costs", "start=7",
                              "--runs-dir", str(tmp_path / "runs")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert refused.returncode == 2 and "--simulated-costs is for the simulated engine" in refused.stderr


def test_an_earlier_studys_curves_replay_as_the_objective(tmp_path):
    recorded = hpo.run(toy_space("rec", "hpo.examples.toy:curve", fixed={"steps": 6},
                                 search={"parallel": 1}, space={"rate": [0.2, 0.5, 1.0]}),
                       engine="inline", runs_dir=tmp_path, progress=False)
    replay = {"name": "replayed", "objective": "hpo.replay:curves", "metric": {"name": "value"},
              "fixed": {"replay": str(tmp_path / "rec")}, "search": {"algorithm": "grid"},
              "scheduling": {"policy": "round_robin", "segment_steps": 2},
              "space": {"rate": [0.2, 0.5, 1.0]}}
    replayed = hpo.run(replay, engine=SimulatedEngine(slots=2), runs_dir=tmp_path, progress=False)
    assert replayed.counts["COMPLETE"] == 3
    by_rate = {t.params["rate"]: t.number for t in recorded.trials}
    for trial in replayed.trials:  # suspended and resumed, every step once, as recorded
        assert replayed.curves[trial.number] == recorded.curves[by_rate[trial.params["rate"]]]

    unseen = {**replay, "name": "unseen", "scheduling": {"policy": "fifo"}, "space": {"rate": [0.7]}}
    (failed,) = hpo.run(unseen, engine=SimulatedEngine(), runs_dir=tmp_path, progress=False).trials
    assert failed.state is hpo.TrialStatus.FAILED and "replay_nearest" in failed.error
    nearest = {**unseen, "name": "nearest", "fixed": {**unseen["fixed"], "replay_nearest": True}}
    (stand_in,) = hpo.run(nearest, engine=SimulatedEngine(), runs_dir=tmp_path, progress=False).trials
    assert stand_in.state is hpo.TrialStatus.COMPLETE
    assert hpo.StudyResult.load(tmp_path / "nearest").curves[0] == recorded.curves[by_rate[0.5]]
