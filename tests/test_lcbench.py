"""The LCBench objective (a YAHPO Gym surrogate replayed) and bench/lcbench.py.

Both need the surrogate's data folder (``$HPO_YAHPO_DATA``, by default
``/work/shared/data/yahpo``) and onnxruntime; without them they are skipped.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from hpo.examples import lcbench

DATA = Path(os.environ.get("HPO_YAHPO_DATA", "/work/shared/data/yahpo"))
ROOT = Path(__file__).resolve().parents[1]

needs_data = pytest.mark.skipif(not (DATA / "lcbench" / "model.onnx").is_file(),
                                reason=f"no YAHPO surrogate data in {DATA} (set HPO_YAHPO_DATA)")
pytest.importorskip("onnxruntime", reason="reading the surrogate needs onnxruntime")

DEFAULT = {"batch_size": 91, "learning_rate": 0.0031622777, "momentum": 0.545,
           "weight_decay": 0.050005, "num_layers": 3, "max_units": 256, "max_dropout": 0.5}
EDGE = {"batch_size": 512, "learning_rate": 0.1, "momentum": 0.1, "weight_decay": 1e-05,
        "num_layers": 1, "max_units": 1024, "max_dropout": 0.0}
# (task, config) -> {epoch: (time, val_accuracy)} as yahpo_gym 1.0.2's
# BenchmarkSet("lcbench").objective_function returned them (numpy 1.26,
# ConfigSpace 0.6.1, onnxruntime 1.32), rounded to 4 decimals.
YAHPO_GYM = {
    ("3945", "DEFAULT"): {1: (15.9236, 38.195), 26: (102.431, 92.3536), 52: (165.6897, 93.3988)},
    ("189909", "EDGE"): {1: (2.4851, 42.4648), 26: (46.0986, 56.1641), 52: (82.3841, 55.8902)},
}


class StandIn:
    """The trial contract the objective uses: ``elapse`` records the cost,
    ``should_stop`` turns True after ``stop_after`` reports of this attempt."""

    def __init__(self, reports=None, stop_after=None):
        self.reports = list(reports or [])
        self.elapsed: list[float] = []
        self.stop_after = stop_after
        self._made = 0

    @property
    def next_step(self) -> int:
        return self.reports[-1][0] + 1 if self.reports else 0

    def elapse(self, seconds: float) -> None:
        assert seconds >= 0
        self.elapsed.append(seconds)

    def report(self, step: int, **metrics: float) -> None:
        self.reports.append((step, metrics))
        self._made += 1

    def should_stop(self) -> bool:
        return self.stop_after is not None and self._made >= self.stop_after


def config(params=DEFAULT, task="3945"):
    return {**params, "task": task, "scenario": "lcbench", "data": str(DATA)}


@needs_data
def test_reader_gives_yahpo_gyms_values():
    surrogate = lcbench.open_surrogate(DATA)
    for (task, which), expected in YAHPO_GYM.items():
        y = surrogate.predict(task, [DEFAULT if which == "DEFAULT" else EDGE], levels=list(expected))
        for (epoch, (time_s, accuracy)), row in zip(expected.items(), y[0]):
            assert row[0] == pytest.approx(time_s, abs=1e-3), (task, epoch)
            assert row[1] == pytest.approx(accuracy, abs=1e-3), (task, epoch)


@needs_data
def test_replay_reports_every_epoch_and_costs_sum_to_the_training_time():
    trial = StandIn()
    out = lcbench.train(config(), trial)
    curve = lcbench.open_surrogate(DATA).curve("3945", DEFAULT)
    assert [s for s, _ in trial.reports] == list(range(52))
    assert out == {"val_error": pytest.approx(1 - 93.3988 / 100, abs=1e-5)}
    assert trial.reports[-1][1]["val_error"] == out["val_error"]
    assert all(0 <= m["val_error"] <= 1 for _, m in trial.reports)
    assert len(trial.elapsed) == 52 and min(trial.elapsed) >= 0
    assert math.fsum(trial.elapsed) == pytest.approx(curve.times[-1])
    assert curve.times[-1] == pytest.approx(165.6897, abs=1e-3)  # the surrogate's cumulative time at epoch 52


@needs_data
def test_a_stopped_replay_resumes_at_next_step_as_if_never_stopped():
    straight = StandIn()
    lcbench.train(config(EDGE, "189909"), straight)
    first = StandIn(stop_after=10)
    cut = lcbench.train(config(EDGE, "189909"), first)
    assert first.next_step == 10 and cut["val_error"] == first.reports[-1][1]["val_error"]
    second = StandIn(reports=first.reports)  # as hpo resumes it: the earlier reports, a fresh attempt
    out = lcbench.train(config(EDGE, "189909"), second)
    assert [s for s, _ in second.reports] == list(range(52))
    assert second.reports == straight.reports
    assert first.elapsed + second.elapsed == pytest.approx(straight.elapsed)
    assert out == lcbench.train(config(EDGE, "189909"), StandIn())
    done = StandIn(reports=straight.reports)  # resumed after its last step: nothing to train
    assert lcbench.train(config(EDGE, "189909"), done) == out and done.elapsed == []


@needs_data
def test_space_is_a_valid_hpo_space_and_the_preflight_names_what_is_missing(tmp_path):
    from hpo.api import prepare

    spec = prepare(lcbench.space("3945", DATA, search={"algorithm": "random", "max_trials": 4}))
    assert set(spec.params) == set(DEFAULT) and spec.metric.direction == "minimize"
    assert spec.fixed == {"task": "3945", "scenario": "lcbench", "data": str(DATA)}
    lcbench.train.preflight({"task": "3945", "data": str(DATA)})
    with pytest.raises(lcbench.DataMissing, match="yahpo_data"):
        lcbench.train.preflight({"task": "3945", "data": str(tmp_path)})
    with pytest.raises(ValueError, match="not a lcbench task"):
        lcbench.train.preflight({"task": "1", "data": str(DATA)})


@needs_data
def test_the_space_file_printed_by_the_module_is_the_space(capsys):
    import json

    lcbench.main(["--task", "7593", "--data", str(DATA), "--max-trials", "20"])
    study = json.loads(capsys.readouterr().out)
    assert study["space"] == lcbench.space("7593", DATA)["space"] and study["search"]["max_trials"] == 20
    with pytest.raises(SystemExit) as stop:
        lcbench.main(["--task", "1", "--data", str(DATA)])
    assert stop.value.code == 2


# ------------------------------------------------------------ the benchmark

ROW = r"^(hpo|optuna|dehb):\S+((\s+\d\.\d{4}){4})\s+\d+$"


def _bench(*args, timeout=240):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "lcbench.py"), *args], check=False,
                          capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


@needs_data
def test_bench_three_tasks_one_seed(tmp_path):
    import json
    import re

    done = _bench("--data", str(DATA), "--tasks", "3", "--seeds", "1", "--workers", "4", "--budget", "5",
                  "--jobs", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    tasks = lcbench.open_surrogate(DATA).tasks[:3]
    starts = [i for i, line in enumerate(lines) if line.startswith("task ")]
    assert [lines[i].split(":")[0] for i in starts] == [f"task {t}" for t in tasks]
    for i in starts:  # a header, then a row per contender with 4 regrets in [0, 1] and the trials
        rows = []
        for line in lines[i + 2:]:
            if not (m := re.match(ROW, line)):
                break
            rows.append([float(v) for v in m.group(2).split()])
        assert len(rows) >= 4 and all(0 <= v <= 1 for row in rows for v in row)
        assert any(row[-1] == 0 for row in rows)  # someone found the task's best
    assert re.fullmatch(r"tasks_won=[0-3] of 3", lines[-2])
    p = float(re.fullmatch(r"wilcoxon_p=(\S+)", lines[-1]).group(1))
    assert 0 <= p <= 1
    runs = 3 * _contenders()  # 3 tasks x 1 seed x every contender
    assert f"[{runs}/{runs}]" in done.stderr  # the progress lines
    record = json.loads((tmp_path / "lcbench.json").read_text())
    assert set(record["tasks"]) == set(tasks) and len(record["runs"]) == runs
    assert all(r["points"] == sorted(r["points"]) for r in record["runs"].values())
    assert (tmp_path / "lcbench.html").stat().st_size > 0


def test_bench_without_data_says_how_to_get_it(tmp_path):
    done = _bench("--data", str(tmp_path), "--tasks", "1", timeout=60)
    assert done.returncode == 2
    assert "yahpo_data" in done.stderr and "Traceback" not in done.stderr


@needs_data
def test_optuna_on_the_simulated_clock_is_repeatable_and_stays_in_its_budget():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import _lcbench_runs as runs

    surrogate = lcbench.open_surrogate(DATA)
    budget_s = 600.0
    first, again = (runs.run("optuna:tpe+hyperband", surrogate, "3945", 4, budget_s, 0, 10) for _ in range(2))
    assert first.points == again.points and first.trials == again.trials > 4
    assert all(0 < t <= budget_s for t, _ in first.points)
    assert [v for _, v in first.points] == sorted((v for _, v in first.points), reverse=True)


def test_a_scenario_whose_fidelity_is_a_fraction_steps_through_fractions_each_a_training(tmp_path, monkeypatch):
    """iaml_glmnet's layout (no data for it here: the surrogate's outputs are made up)."""
    import json

    import numpy as np

    folder = tmp_path / "iaml_glmnet"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    (folder / "encoding.json").write_text(json.dumps({"task_id": {"40981": 1, "1489": 2}}))
    (folder / "config_space.json").write_text(json.dumps({"hyperparameters": [
        {"name": "task_id", "type": "categorical", "choices": ["40981", "1489"]},
        {"name": "alpha", "type": "uniform_float", "lower": 0.0, "upper": 1.0, "log": False},
        {"name": "s", "type": "uniform_float", "lower": 1e-4, "upper": 1e3, "log": True},
        {"name": "trainsize", "type": "uniform_float", "lower": 0.03, "upper": 1.0, "log": False}],
        "conditions": []}))
    surrogate = lcbench.Surrogate(tmp_path, "iaml_glmnet")
    assert surrogate.tasks == ("40981", "1489") and [h.name for h in surrogate.hyperparameters] == ["alpha", "s"]
    assert surrogate.steps == 16 and surrogate.levels[0] == pytest.approx(0.03) and surrogate.levels[-1] == 1.0
    assert np.all(np.diff(surrogate.levels) > 0)

    def predict(task, configs, levels=None):  # mmce falls and training time grows with the fraction
        y = np.zeros((len(configs), surrogate.steps, len(surrogate.scenario.y_names)))
        y[:, :, 0] = 0.5 - 0.2 * surrogate.levels
        y[:, :, 7] = 10 * surrogate.levels
        return y

    monkeypatch.setattr(surrogate, "predict", predict)
    curve = surrogate.curve("40981", {"alpha": 0.5, "s": 1.0})
    assert curve.errors == pytest.approx(0.5 - 0.2 * surrogate.levels)
    assert curve.costs == pytest.approx(10 * surrogate.levels)  # each fraction trained anew
    assert curve.times[-1] == pytest.approx(10 * surrogate.levels.sum())
    monkeypatch.setitem(lcbench._OPEN, (str(tmp_path.resolve()), "iaml_glmnet"), surrogate)
    trial = StandIn(stop_after=3)
    config = {"alpha": 0.5, "s": 1.0, "task": "40981", "scenario": "iaml_glmnet", "data": str(tmp_path)}
    assert lcbench.train(config, trial) == {"val_error": pytest.approx(0.5 - 0.2 * surrogate.levels[2])}
    assert trial.elapsed == pytest.approx(list(10 * surrogate.levels[:3]))
    study = lcbench.space("1489", tmp_path, "iaml_glmnet")
    assert study["space"] == {"alpha": {"type": "float", "low": 0.0, "high": 1.0},
                              "s": {"type": "float", "low": 1e-4, "high": 1e3, "log": True}}


def _contenders() -> int:
    """How many contenders the bench runs (hpo's and Optuna's)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import _lcbench_runs as runs

    return len(runs.HPO) + len(runs.OPTUNA)
