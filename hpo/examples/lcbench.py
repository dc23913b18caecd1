"""LCBench learning curves, replayed from a YAHPO Gym surrogate, as an hpo objective.

LCBench (Zimmer et al., 2021) trained 2,000 funnel-shaped MLPs for 52 epochs
on each of 34 OpenML tasks; YAHPO Gym (Pfisterer et al., AutoML 2022) fits an
ONNX surrogate to those curves. For a task, 7 hyperparameters and an epoch it
predicts the validation accuracy (in percent) and ``time``, the cumulative
training time in seconds up to that epoch. This is the benchmark DyHPO, DPL
and ifBO report on.

- ``hpo.examples.lcbench:train``: replays a configuration's curve. Config keys:
  the scenario's hyperparameters (LCBench: ``batch_size``, ``learning_rate``,
  ``momentum``, ``weight_decay``, ``num_layers``, ``max_units``,
  ``max_dropout``) and the fixed ``task`` (the OpenML task id, a string),
  ``scenario`` (``"lcbench"``) and ``data`` (the folder holding
  ``lcbench/model.onnx``). Step ``e`` (0 to 51) is epoch ``e + 1``: the
  objective first calls ``trial.elapse(cost)`` with that epoch's training
  time (``time[e+1] - time[e]``; a real run sleeps it, the simulated engine
  advances its clock), then reports ``val_error = 1 - val_accuracy / 100``.
  The curve depends on (configuration, step) alone, so a suspended trial
  resumes exactly at ``trial.next_step``. Returns ``{"val_error": last}``.
- :func:`space`: the scenario's space as an hpo space dict (metric
  ``val_error``, minimised), from the data folder's ``config_space.json``;
  as a file: ``python -m hpo.examples.lcbench --task 3945 --data FOLDER >
  lcbench.json``, then ``hpo run lcbench.json --engine simulated --workers 32``
  (add a ``search.timeout_s`` of simulated seconds, or a ``max_trials``).
- :class:`Surrogate`: the reader. One ONNX call predicts a configuration's
  whole curve (all 52 epochs in a batch, about 1 ms against 52 calls of
  0.3 ms through ``yahpo_gym``); curves are cached, so replaying one again
  costs nothing.

Other YAHPO scenarios work the same way where :data:`SCENARIOS` describes
them (the ``iaml_*`` and ``rbv2_*`` scenarios without conditional
parameters, whose fidelity is the training-set fraction ``trainsize``): their
steps are :attr:`Scenario.levels` fractions from the smallest to 1, and as
each fraction is a training of its own, a step costs its whole training time
(an epoch scenario's cost is the difference of cumulative times).

The reader is ``yahpo_gym``'s ``BenchmarkSet.objective_function`` without
``yahpo_gym`` (whose pins, ``numpy<2`` and ``ConfigSpace<=0.6.1``, conflict
with this project's): the categorical inputs integer-encoded from
``encoding.json``, the numeric ones in the scenario's ``cont_names`` order,
one ONNX session run. ``tests/test_lcbench.py`` holds values read through
``yahpo_gym`` 1.0.2 and checks that the reader gives the same. It needs
``onnxruntime`` (``pip install onnxruntime``); nothing is downloaded.

Two details of the surrogate: its cumulative ``time`` is not always
increasing (a few epochs of a few configurations step back by a fraction of
a second), so the reader takes its running maximum, and an epoch's cost is
never negative; and its accuracy can leave [0, 100] by a little, so errors
are clipped to [0, 1].
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DATA_HINT",
    "FIXED_KEYS",
    "SCENARIOS",
    "Curve",
    "DataMissing",
    "Hyperparameter",
    "Scenario",
    "Surrogate",
    "open_surrogate",
    "space",
    "train",
]

FIXED_KEYS = ("task", "scenario", "data")
"""Config keys that are not hyperparameters: which surrogate, which task."""

DATA_HINT = ("the YAHPO Gym surrogate data (yahpo_data v1.0.2, Apache 2.0): "
             "https://github.com/slds-lmu/yahpo_data; pass the folder that holds "
             "<scenario>/model.onnx, config_space.json and encoding.json")


class DataMissing(FileNotFoundError):
    """The surrogate's files are not where the config says; the message says how to get them."""


@dataclass(frozen=True)
class Scenario:
    """What ``yahpo_gym`` knows about a scenario that its files do not say.

    ``cont_names`` and ``cat_names`` are the surrogate's inputs in its order
    (``yahpo_gym/benchmarks/<family>.py``); ``metric`` is the output turned
    into an error to minimise: ``1 - y / scale`` for an accuracy, ``y /
    scale`` for an error; ``runtime`` the output holding training time,
    cumulative over the fidelity when ``cumulative``. ``constants`` are inputs
    held fixed (``repl``: rbv2's replication, 10 as YAHPO's own benchmarks
    set it). ``levels`` is the number of steps of a fractional fidelity.
    """

    name: str
    cont_names: tuple[str, ...]
    cat_names: tuple[str, ...]
    y_names: tuple[str, ...]
    instance: str
    fidelity: str
    runtime: str
    metric: str
    accuracy: bool
    scale: float = 1.0
    cumulative: bool = True
    constants: dict[str, Any] = field(default_factory=dict)
    levels: int = 16

    def error(self, y: np.ndarray) -> np.ndarray:
        """The metric output as an error in [0, 1]."""
        value = y / self.scale
        return np.clip(1.0 - value if self.accuracy else value, 0.0, 1.0)


_IAML_Y = ("mmce", "f1", "auc", "logloss", "ramtrain", "rammodel", "rampredict", "timetrain",
           "timepredict", "mec", "ias", "nf")
_RBV2_Y = ("acc", "bac", "auc", "brier", "f1", "logloss", "timetrain", "timepredict", "memory")


def _iaml(name: str, cont: tuple[str, ...]) -> Scenario:
    return Scenario(name, cont, ("task_id",), _IAML_Y, "task_id", "trainsize", "timetrain",
                    "mmce", accuracy=False, cumulative=False)


def _rbv2(name: str, cont: tuple[str, ...], cat: tuple[str, ...]) -> Scenario:
    return Scenario(name, cont, ("task_id",) + cat, _RBV2_Y, "task_id", "trainsize", "timetrain",
                    "acc", accuracy=True, cumulative=False, constants={"repl": 10})


SCENARIOS: dict[str, Scenario] = {
    "lcbench": Scenario(
        "lcbench",
        ("epoch", "batch_size", "learning_rate", "momentum", "weight_decay", "num_layers",
         "max_units", "max_dropout"),
        ("OpenML_task_id",),
        ("time", "val_accuracy", "val_cross_entropy", "val_balanced_accuracy",
         "test_cross_entropy", "test_balanced_accuracy"),
        "OpenML_task_id", "epoch", "time", "val_accuracy", accuracy=True, scale=100.0),
    "iaml_glmnet": _iaml("iaml_glmnet", ("alpha", "s", "trainsize")),
    "iaml_rpart": _iaml("iaml_rpart", ("cp", "maxdepth", "minbucket", "minsplit", "trainsize")),
    "rbv2_glmnet": _rbv2("rbv2_glmnet", ("alpha", "s", "trainsize", "repl"),
                         ("num.impute.selected.cpo",)),
    "rbv2_rpart": _rbv2("rbv2_rpart", ("cp", "maxdepth", "minbucket", "minsplit", "trainsize", "repl"),
                        ("num.impute.selected.cpo",)),
}
"""The scenarios this reader knows, after ``yahpo_gym`` 1.0.2's own tables.
Only LCBench has been read from its real files here (the project's data
folder holds no other); the ``iaml_*``/``rbv2_*`` rows follow yahpo_gym's
tables and are tested on a made-up surrogate.
Scenarios with conditional parameters (``*_super``, ``*_ranger``, ``*_xgboost``,
``rbv2_svm``, ``nb301``) are not among them: their inactive inputs need
``yahpo_gym``'s missing-value encoding, which nothing here checks."""


class Hyperparameter(NamedTuple):
    """One searched parameter of a scenario, from its ``config_space.json``."""

    name: str
    kind: str  # "int", "float" or "categorical"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()

    def as_space(self) -> Any:
        """The parameter in hpo's space format.

        >>> Hyperparameter("batch_size", "int", 16, 512, True).as_space()
        {'type': 'int', 'low': 16, 'high': 512, 'log': True}
        >>> Hyperparameter("kernel", "categorical", choices=("linear", "radial")).as_space()
        ['linear', 'radial']
        """
        if self.kind == "categorical":
            return list(self.choices)
        low, high = (int(self.low), int(self.high)) if self.kind == "int" else (self.low, self.high)
        form: dict[str, Any] = {"type": self.kind, "low": low, "high": high}
        if self.log:
            form["log"] = True
        return form


class Curve(NamedTuple):
    """A configuration's learning curve on one task: per step, the validation
    error, the step's training cost in seconds (never negative) and the
    cumulative training time at its end (``np.cumsum(costs)``)."""

    errors: np.ndarray
    costs: np.ndarray
    times: np.ndarray

    def __len__(self) -> int:
        return len(self.errors)


class Surrogate:
    """A YAHPO scenario read from its data folder: the tasks, the searched
    hyperparameters, the fidelity's steps and, per configuration, its curve.

    ``folder`` holds ``<scenario>/model.onnx``, ``config_space.json`` and
    ``encoding.json``; :class:`DataMissing` otherwise, saying how to get them.
    The ONNX session runs on one thread (a simulation runs many in parallel);
    curves are kept, least recently used first out, up to ``cache`` of them.
    """

    def __init__(self, folder: str | Path, scenario: str = "lcbench", cache: int = 200_000) -> None:
        if scenario not in SCENARIOS:
            known = ", ".join(sorted(SCENARIOS))
            raise ValueError(f"unknown YAHPO scenario {scenario!r}: this reader knows {known}")
        self.scenario = SCENARIOS[scenario]
        self.folder = Path(folder)
        here = self.folder / scenario
        paths = {name: here / name for name in ("model.onnx", "config_space.json", "encoding.json")}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise DataMissing(f"{', '.join(missing)}: not found; {DATA_HINT}")
        self._space = json.loads(paths["config_space.json"].read_text())
        if self._space.get("conditions"):
            raise ValueError(f"{paths['config_space.json']}: a conditional space; this reader "
                             "only handles scenarios without conditions")
        self._encoding = json.loads(paths["encoding.json"].read_text())
        self._model_path = paths["model.onnx"]
        self._session: Any = None
        self._lock = threading.Lock()
        self._curves: OrderedDict[tuple, Curve] = OrderedDict()
        self._cache = cache
        self._by_name = {h["name"]: h for h in self._space["hyperparameters"]}
        self.tasks: tuple[str, ...] = tuple(str(c) for c in self._by_name[self.scenario.instance]["choices"])
        self.hyperparameters: tuple[Hyperparameter, ...] = tuple(
            _hyperparameter(h) for h in self._space["hyperparameters"]
            if h["name"] not in (self.scenario.instance, self.scenario.fidelity)
            and h["name"] not in self.scenario.constants)
        self.levels = self._levels()

    def _levels(self) -> np.ndarray:
        fidelity = self._by_name[self.scenario.fidelity]
        low, high = float(fidelity["lower"]), float(fidelity["upper"])
        if fidelity["type"] == "uniform_int":
            return np.arange(int(low), int(high) + 1, dtype=np.float64)
        k = self.scenario.levels  # fractions, geometric from the smallest to the largest
        return np.array([low * (high / low) ** (i / (k - 1)) for i in range(k)])

    @property
    def steps(self) -> int:
        """Steps of a whole curve (LCBench: 52 epochs)."""
        return len(self.levels)

    def session(self) -> Any:
        """The ONNX inference session, opened on first use (on one thread)."""
        if self._session is None:
            try:
                import onnxruntime  # type: ignore[import-untyped]
            except ImportError as exc:
                raise ImportError("reading a YAHPO surrogate needs onnxruntime: "
                                  "pip install onnxruntime (or pip install 'hpo[test]')") from exc
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            self._session = onnxruntime.InferenceSession(str(self._model_path), options,
                                                         providers=["CPUExecutionProvider"])
        return self._session

    def check_task(self, task: str) -> str:
        """``task`` as a string, or ValueError naming the scenario's tasks."""
        task = str(task)
        if task not in self.tasks:
            raise ValueError(f"task {task!r} is not a {self.scenario.name} task "
                             f"(tasks: {', '.join(self.tasks)})")
        return task

    def predict(self, task: str, configs: list[dict[str, Any]], levels: np.ndarray | None = None) -> np.ndarray:
        """The surrogate's outputs, shape (configs, levels, y_names), in one
        ONNX call; ``levels`` defaults to the whole curve's."""
        levels = self.levels if levels is None else np.asarray(levels, dtype=np.float64)
        sc = self.scenario
        task = self.check_task(task)
        rows_cont, rows_cat = [], []
        for config in configs:
            values = {**config, **sc.constants, sc.instance: task}
            try:
                cat = [self._encoding[name][str(values[name])] for name in sc.cat_names]
            except KeyError as exc:
                raise ValueError(f"{sc.name}: no encoding for {exc.args[0]!r} in {config}") from None
            for level in levels:
                values[sc.fidelity] = level
                rows_cont.append([float(values[name]) for name in sc.cont_names])
                rows_cat.append(cat)
        session = self.session()
        names = [i.name for i in session.get_inputs()]  # x_cat, x_cont, as yahpo_gym passes them
        out = session.run(None, {names[0]: np.array(rows_cat, dtype=np.int32),
                                 names[1]: np.array(rows_cont, dtype=np.float32)})[0]
        return np.asarray(out, dtype=np.float64).reshape(len(configs), len(levels), len(sc.y_names))

    def curves(self, task: str, configs: list[dict[str, Any]]) -> list[Curve]:
        """The curves of ``configs`` on ``task``, those not cached yet read in one call."""
        keys = [(str(task), tuple(sorted((k, _plain(config[k])) for k in self._names()))) for config in configs]
        with self._lock:  # trials of a threaded engine share the cache
            todo = [i for i, key in enumerate(keys) if key not in self._curves]
            if todo:
                y = self.predict(task, [configs[i] for i in todo])
                for j, i in enumerate(todo):
                    self._curves[keys[i]] = self._curve(y[j])
            out = []
            for key in keys:
                self._curves.move_to_end(key)
                out.append(self._curves[key])
            while len(self._curves) > self._cache:
                self._curves.popitem(last=False)
        return out

    def curve(self, task: str, config: dict[str, Any]) -> Curve:
        """One configuration's curve on ``task`` (cached)."""
        return self.curves(task, [config])[0]

    def _names(self) -> list[str]:
        return [h.name for h in self.hyperparameters]

    def _curve(self, y: np.ndarray) -> Curve:
        sc = self.scenario
        errors = sc.error(y[:, sc.y_names.index(sc.metric)])
        runtime = np.maximum(y[:, sc.y_names.index(sc.runtime)], 0.0)
        if sc.cumulative:  # the surrogate's cumulative time, made non-decreasing
            times = np.maximum.accumulate(runtime)
            costs = np.diff(times, prepend=0.0)
        else:  # each fraction is a training of its own
            costs = runtime
        return Curve(errors, costs, np.cumsum(costs))

    def sample(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` configurations drawn uniformly (log-uniformly on log scales),
        as a random search would: the fixed sample the benchmark's budget is
        measured on."""
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            config: dict[str, Any] = {}
            for h in self.hyperparameters:
                if h.kind == "categorical":
                    config[h.name] = h.choices[int(rng.integers(len(h.choices)))]
                    continue
                low, high = (math.log(h.low), math.log(h.high)) if h.log else (h.low, h.high)
                x = float(rng.uniform(low, high))
                x = math.exp(x) if h.log else x
                config[h.name] = min(max(round(x), int(h.low)), int(h.high)) if h.kind == "int" else x
            out.append(config)
        return out


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _hyperparameter(h: dict[str, Any]) -> Hyperparameter:
    kind = h["type"]
    if kind in ("categorical", "ordinal"):
        return Hyperparameter(h["name"], "categorical", choices=tuple(h.get("choices", h.get("sequence", ()))))
    if kind in ("uniform_int", "uniform_float"):
        return Hyperparameter(h["name"], "int" if kind == "uniform_int" else "float",
                              h["lower"], h["upper"], bool(h.get("log")))
    if kind == "constant":
        return Hyperparameter(h["name"], "categorical", choices=(h["value"],))
    raise ValueError(f"config_space.json: {h['name']}: parameter type {kind!r} is not handled")


_OPEN: dict[tuple[str, str], Surrogate] = {}
_OPEN_LOCK = threading.Lock()


def open_surrogate(folder: str | Path, scenario: str = "lcbench") -> Surrogate:
    """The process's one :class:`Surrogate` of ``scenario`` in ``folder`` (and its curve cache)."""
    key = (str(Path(folder).resolve()), scenario)
    with _OPEN_LOCK:
        if key not in _OPEN:
            _OPEN[key] = Surrogate(folder, scenario)
        return _OPEN[key]


def _data_of(config: dict[str, Any]) -> tuple[str, str]:
    if not config.get("data"):
        raise DataMissing(f"the config has no 'data' folder; {DATA_HINT}")
    return str(config["data"]), str(config.get("scenario", "lcbench"))


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Replay the surrogate's curve of ``config`` on ``config["task"]``,
    from ``trial.next_step``: per step, ``trial.elapse`` its training time,
    then ``trial.report(step, val_error=...)``; stop when ``trial.should_stop()``
    (not asked after the last step). Returns ``{"val_error": <the last reported>}``."""
    data, scenario = _data_of(config)
    surrogate = open_surrogate(data, scenario)
    params = {k: v for k, v in config.items() if k not in FIXED_KEYS}
    curve = surrogate.curve(str(config["task"]), params)
    start = trial.next_step
    if start >= len(curve):  # resumed after its last step: nothing left to train
        return {"val_error": float(curve.errors[-1])}
    value = float("nan")
    for step in range(start, len(curve)):
        trial.elapse(float(curve.costs[step]))
        value = float(curve.errors[step])
        trial.report(step, val_error=value)
        if step + 1 < len(curve) and trial.should_stop():
            break
    return {"val_error": value}


def _preflight(fixed: dict[str, Any]) -> None:
    """Before any trial: the data folder, onnxruntime and the task are there."""
    data, scenario = _data_of(fixed)
    surrogate = open_surrogate(data, scenario)
    surrogate.check_task(str(fixed.get("task", "")))
    surrogate.session()


train.preflight = _preflight  # type: ignore[attr-defined]


def space(task: str, data: str | Path, scenario: str = "lcbench", **settings: Any) -> dict[str, Any]:
    """A study of ``scenario`` on ``task`` as an hpo space dict: the
    surrogate's hyperparameters (ranges and log scales from its
    ``config_space.json``), ``fixed`` task, scenario and data, metric
    ``val_error`` minimised, objective ``hpo.examples.lcbench:train``.
    ``settings`` (``search``, ``early_stopping``, ``scheduling``, ``name``...)
    are added as they are.
    """
    surrogate = open_surrogate(data, scenario)
    return {
        "objective": "hpo.examples.lcbench:train",
        "metric": {"name": "val_error", "direction": "minimize"},
        "fixed": {"task": surrogate.check_task(task), "scenario": scenario, "data": str(data)},
        "space": {h.name: h.as_space() for h in surrogate.hyperparameters},
        **settings,
    }


def main(argv: list[str] | None = None) -> None:
    """Print a task's space file: ``python -m hpo.examples.lcbench --task ID --data FOLDER``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m hpo.examples.lcbench",
                                     description="Print a YAHPO scenario's task as an hpo space file.")
    parser.add_argument("--task", required=True, help="the OpenML task id, e.g. 3945")
    parser.add_argument("--data", required=True, help="the folder holding <scenario>/model.onnx")
    parser.add_argument("--scenario", default="lcbench", choices=sorted(SCENARIOS))
    parser.add_argument("--max-trials", type=int, default=200)
    args = parser.parse_args(argv)
    try:
        study = space(args.task, args.data, args.scenario, name=f"{args.scenario}-{args.task}",
                      search={"algorithm": "random", "max_trials": args.max_trials})
    except (DataMissing, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    json.dump(study, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
