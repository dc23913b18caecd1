"""The study file: a JSON search space plus how to search it, parsed and validated.

Two forms are accepted. The flat form of the original PyCOMPSs study maps
each parameter to its list of choices::

    {"optimizer": ["Adam", "SGD", "RMSprop"], "num_epochs": [20, 50, 100]}

The full form has a ``"space"`` key and optional settings around it::

    {"name": "digits", "search": {"algorithm": "random", "max_trials": 12},
     "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": true}}}

Everything is checked when the file is read, and every error names the
file, the JSON path and the fix. A JSON ``null`` is the same as leaving the
key out.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Literal, NoReturn

from optuna.distributions import BaseDistribution

from hpo import registry
from hpo.allocation import Amount, TrialShape, check_shape, parse_amount, sample_configs
from hpo.data import DataSection
from hpo.errors import SpaceError, closest
from hpo.space._conditions import check_conditions, is_active, ordered, unnest
from hpo.space._data import parse_data
from hpo.space._grid import Grid
from hpo.space._params import (
    FloatParam,
    IntParam,
    Loc,
    Param,
    as_choice,
    as_int,
    as_number,
    as_object,
    as_str,
    parse_param,
)

__all__ = [
    "ALGORITHMS", "SAMPLERS", "DIRECTIONS", "PRUNERS", "POLICIES", "DEFAULT_OBJECTIVE",
    "Metric", "SearchSettings", "Resources", "Retries", "EarlyStopping", "Scheduling", "Allocation",
    "StudySpec", "load_spec", "parse_spec",
]

ALGORITHMS = registry.ALGORITHMS.names
SAMPLERS = registry.SAMPLERS.names
PRUNERS = registry.PRUNERS.names
POLICIES = registry.POLICIES.names
DIRECTIONS = ("maximize", "minimize")
DEFAULT_OBJECTIVE = "hpo.examples.keras_mnist:train"

_TOP_KEYS = (
    "name", "objective", "metric", "search", "resources",
    "retries", "early_stopping", "scheduling", "allocation", "data", "fixed", "space",
)
_SEARCH_KEYS = ("algorithm", "sampler", "max_trials", "parallel", "seed", "timeout_s")
_NAME = re.compile(r"[A-Za-z0-9._-]+")
# Far more than any space needs (a million choices take about 10 MB); a path to
# something else entirely fails fast instead of filling memory.
_MAX_BYTES = 16 * 2**20
# Far deeper than any space, and shallow enough that copying and writing the
# spec stays clear of Python's recursion limit.
_MAX_DEPTH = 100


@dataclass(frozen=True)
class Metric:
    """The value the objective reports, which way is better, and an optional goal."""

    name: str = "val_accuracy"
    direction: Literal["maximize", "minimize"] = "maximize"
    target: float | None = None


@dataclass(frozen=True)
class SearchSettings:
    """How to search. ``sampler`` is set for bayesian search only, else None."""

    algorithm: str = "grid"
    sampler: str | None = None
    max_trials: int | None = None
    parallel: int | None = None  # None: as many trials as the engine has slots
    seed: int | None = None
    timeout_s: float | None = None  # wall-clock budget of the whole study


@dataclass(frozen=True)
class Resources:
    """What one trial needs: numbers, or :class:`~hpo.allocation.Amount`
    expressions of the configuration's parameters (see :meth:`shape`)."""

    cpus: int | Amount = 1
    gpus: float | Amount = 0
    memory_gb: float | Amount | None = None
    nodes: int | Amount = 1
    time_limit_s: float | None = None

    @property
    def varies(self) -> bool:
        """Whether trials of the study differ in shape."""
        return any(isinstance(getattr(self, k), Amount) for k in _AMOUNTS)

    def shape(self, config: dict[str, Any]) -> TrialShape:
        """The shape of the trial of ``config``; ValueError when it is not one."""
        amounts = {k: _amount(getattr(self, k), config) for k in _AMOUNTS}
        return check_shape(**amounts, time_limit_s=self.time_limit_s)

    def to_dict(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in (*_AMOUNTS, "time_limit_s")}
        return {k: str(v) if isinstance(v, Amount) else v for k, v in values.items()}


_AMOUNTS = ("cpus", "gpus", "memory_gb", "nodes")


def _amount_text(key: str, value: Any) -> str:
    if isinstance(value, Amount):
        return f"{key} = {value}"
    return {"cpus": f"{value} cpu(s)", "gpus": f"{value:g} gpu(s)", "memory_gb": f"{value:g} GB",
            "nodes": f"{value} nodes"}[key]


def _amount(value: Any, config: dict[str, Any]) -> Any:
    return value.value(config) if isinstance(value, Amount) else value


@dataclass(frozen=True)
class EarlyStopping:
    """Which pruner stops hopeless trials, how many steps every trial gets first,
    and after how many reports without improvement a trial stops by itself."""

    pruner: str = "none"
    min_steps: int = 0
    patience: int | None = None
    min_delta: float = 0.0


@dataclass(frozen=True)
class Scheduling:
    """Which trial gets a free slot: ``fifo`` runs each trial to its end; the
    others run trials in quanta of ``quantum_s`` seconds (Hermes; 10 unless
    ``segment_steps`` reports are asked for instead), after which a trial
    checkpoints and yields its slot if a waiting trial deserves it more. A
    time quantum grows by ``quantum_growth`` of itself per preemption of the
    trial, never so short that checkpointing takes over
    ``max_checkpoint_share`` of it, and doubles at each of the ``milestones``
    the trial passes: metric values, or percentage decreases of its loss ("50%")."""

    policy: str = "fifo"
    segment_steps: int | None = None
    quantum_s: float | None = None
    quantum_growth: float = 0.5
    max_checkpoint_share: float = 0.05
    milestones: tuple[float | str, ...] = ()


ALLOCATIONS = ("fifo", "longest_first", "rate")
PLACEMENTS = ("any", "speed")


@dataclass(frozen=True)
class Allocation:
    """How trials get their GPUs. ``policy``: ``fifo`` (each trial its
    configured shape, in order), ``longest_first`` (the cost model's longest
    trials first) or ``rate`` (FLEET: GPU counts from measured training rates,
    so trials started together finish together). ``placement: speed`` gives
    the fastest GPUs to the trials that gain most. ``cost_model`` names a
    function returning :class:`hpo.allocation.ModelCost` for a configuration
    (default: the objective module's ``cost``, when it has one).
    ``time_limit_factor`` sets each trial's time limit to that many times its
    predicted time; ``gpu_memory_gb`` is what a GPU holds, for refusing
    configurations the model says will not fit (default: nvidia-smi's figure)."""

    policy: str = "fifo"
    placement: str = "any"
    cost_model: str | None = None
    profile_batches: int = 48
    time_limit_factor: float | None = None
    gpu_memory_gb: float | None = None

    @property
    def planned(self) -> bool:
        """Whether the master plans starts beyond the configured shapes."""
        return self.policy != "fifo" or self.placement != "any"


@dataclass(frozen=True)
class Retries:
    """Two kinds of retry. ``objective``: more runs of a trial whose objective
    failed (raised, returned no valid metric), each from its checkpoint.
    ``engine``: more runs of a task that failed for the infrastructure (its
    wrapper raised: the store unreachable...), as the engine retries tasks.
    A single number in the file sets both."""

    objective: int = 0
    engine: int = 0


_Check = Callable[[Any, Loc], Any]
_positive = partial(as_number, positive=True)
_METRIC: dict[str, _Check] = {
    "name": as_str, "direction": partial(as_choice, options=DIRECTIONS), "target": as_number,
}
_SEARCH: dict[str, _Check] = {
    "algorithm": partial(as_choice, options=ALGORITHMS),
    "sampler": partial(as_choice, options=SAMPLERS),
    "max_trials": partial(as_int, minimum=1),
    "parallel": partial(as_int, minimum=1),
    # numpy's generators and Optuna's samplers take seeds of 32 bits, never negative
    "seed": partial(as_int, minimum=0, maximum=2**32 - 1),
    "timeout_s": _positive,
}
_RESOURCE_KEYS = ("cpus", "gpus", "memory_gb", "nodes", "time_limit_s")
_EARLY_STOPPING: dict[str, _Check] = {
    "pruner": partial(as_choice, options=PRUNERS), "min_steps": partial(as_int, minimum=0),
    "patience": partial(as_int, minimum=1), "min_delta": as_number,
}


_RETRIES: dict[str, _Check] = {
    "objective": partial(as_int, minimum=0), "engine": partial(as_int, minimum=0),
}


_ALLOCATION: dict[str, _Check] = {
    "policy": partial(as_choice, options=ALLOCATIONS),
    "placement": partial(as_choice, options=PLACEMENTS),
    "cost_model": lambda value, at: _objective(value, at),
    "profile_batches": partial(as_int, minimum=2, maximum=10_000),
    "time_limit_factor": _positive, "gpu_memory_gb": _positive,
}


def _allocation(value: object, at: Loc) -> Allocation:
    if isinstance(value, str):
        return Allocation(policy=as_choice(value, at, ALLOCATIONS))
    return _section(Allocation, value, at, _ALLOCATION)


def _retries(value: object, at: Loc) -> Retries:
    if isinstance(value, int) and not isinstance(value, bool):
        count = as_int(value, at, minimum=0)
        return Retries(objective=count, engine=count)
    if not isinstance(value, dict):
        at.expected("an integer >= 0 or an object", value,
                    'write "retries": 2, or "retries": {"objective": 2, "engine": 1}')
    return _section(Retries, value, at, _RETRIES)


def _milestone(value: object, at: Loc) -> float | str:
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if 0 < percent < 100:
            return f"{percent:g}%"
        at.expected("a percentage between 0 and 100", value, 'e.g. "50%" (the loss halved)')
    return as_number(value, at)


def _non_negative(value: object, at: Loc) -> float:
    number = as_number(value, at)
    if number < 0:
        at.expected("a number >= 0", value, "e.g. 0.5 (a preemption adds half the quantum)")
    return number


def _share(value: object, at: Loc) -> float:
    number = as_number(value, at)
    if not 0 < number < 1:
        at.expected("a share between 0 and 1", value, "e.g. 0.05 (checkpoints take at most 5%)")
    return number


def _milestones(value: object, at: Loc) -> tuple[float | str, ...]:
    if not isinstance(value, list):
        at.expected("a list of metric values or loss decreases", value, 'e.g. [0.9, 0.95] or ["50%", "90%"]')
    return tuple(_milestone(item, at / index) for index, item in enumerate(value))


_SCHEDULING: dict[str, _Check] = {
    "policy": partial(as_choice, options=POLICIES), "segment_steps": partial(as_int, minimum=1),
    "quantum_s": partial(as_number, positive=True), "quantum_growth": _non_negative,
    "max_checkpoint_share": _share,
    "milestones": _milestones,
}


def _scheduling(value: object, at: Loc) -> Scheduling:
    sched = _section(Scheduling, value, at, _SCHEDULING)
    if sched.segment_steps is not None and sched.quantum_s is not None:
        (at / "segment_steps").fail("a quantum is either reports or seconds, not both",
                                    'remove "segment_steps" (time quanta, as Hermes) or "quantum_s"')
    if sched.policy != "fifo" and sched.segment_steps is None and sched.quantum_s is None:
        return replace(sched, quantum_s=10.0)
    return sched


@dataclass(frozen=True)
class StudySpec:
    """A validated study: what to optimise, over which space, and how.

    ``params`` is sorted by name. ``source`` (the file, or ``"<dict>"``) only
    labels errors and takes no part in equality.

    >>> spec = parse_spec({"optimizer": ["Adam", "SGD"], "batch_size": [32, 64]})
    >>> spec.grid_size, spec.max_trials, spec.grid()[0]
    (4, 4, {'batch_size': 32, 'optimizer': 'Adam'})
    """

    name: str
    objective: str
    metric: Metric
    search: SearchSettings
    resources: Resources
    retries: Retries
    early_stopping: EarlyStopping
    fixed: dict[str, Any]
    params: dict[str, Param]
    scheduling: Scheduling = Scheduling()
    allocation: Allocation = Allocation()
    source: str = field(default="<dict>", compare=False)
    #: Every objective when "metric" is a list; ``metric`` is then the first.
    objectives: tuple[Metric, ...] = ()
    #: What each node stages for its trials (the "data" section), or None.
    data: DataSection | None = None

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The objectives in order: one, or those of a "metric" list."""
        return self.objectives or (self.metric,)

    @property
    def multi_objective(self) -> bool:
        return len(self.metrics) > 1

    def reaches_target(self, values: list[float] | float | None) -> bool:
        """Whether a trial's values (one per objective) reach the target of
        any objective that has one."""
        if values is None:
            return False
        values = [values] if isinstance(values, (int, float)) else list(values)
        return any(
            m.target is not None and (v >= m.target if m.direction == "maximize" else v <= m.target)
            for m, v in zip(self.metrics, values)
        )

    def grid(self) -> Grid:
        """The lazy grid over all parameters; SpaceError if one is a continuous range."""
        return Grid(self.params)

    def shape_of(self, config: dict[str, Any]) -> TrialShape:
        """The resources the trial of ``config`` runs on."""
        return self.resources.shape(config)

    @cached_property
    def early_stopping_settings(self) -> dict[str, Any]:
        """The ``early_stopping`` section as a plain dict (every trial's task carries it)."""
        return asdict(self.early_stopping)

    @cached_property
    def shape_bounds(self) -> tuple[TrialShape, TrialShape]:
        """The smallest and the largest trial shape, amount by amount (over up
        to 4,096 configurations: computed once)."""
        return shape_bounds(self)

    @cached_property
    def grid_size(self) -> int | None:
        """Number of grid points, or None when a parameter is a continuous range
        (computed once: the master asks it at every turn of its loop)."""
        if all(param.is_finite for param in self.params.values()):
            return self.grid().size
        return None

    @property
    def max_trials(self) -> int:
        """The trial budget: ``search.max_trials`` if set, else the whole grid."""
        if self.search.max_trials is not None:
            return self.search.max_trials
        size = self.grid_size
        if size is None:
            _missing_budget(self)
        return size

    @property
    def conditional(self) -> bool:
        """Whether some parameter exists only when others take given values."""
        return any(param.when for param in self.params.values())

    def active(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` less the parameters its own values leave inactive."""
        active: dict[str, Any] = {}
        for name in ordered(self.params):
            if name in config and is_active(self.params[name], active):
                active[name] = config[name]
        return active

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions by parameter name, for the samplers."""
        return {name: param.distribution() for name, param in self.params.items()}

    def to_dict(self) -> dict[str, Any]:
        """The normalised full form; ``parse_spec(spec.to_dict()) == spec``."""
        return {
            "name": self.name,
            "objective": self.objective,
            "metric": [asdict(m) for m in self.objectives] if self.objectives else asdict(self.metric),
            "search": asdict(self.search),
            "resources": self.resources.to_dict(),
            "retries": asdict(self.retries),
            "early_stopping": asdict(self.early_stopping),
            "scheduling": {**asdict(self.scheduling), "milestones": list(self.scheduling.milestones)},
            "allocation": asdict(self.allocation),
            **({"data": self.data.to_dict()} if self.data else {}),
            "fixed": copy.deepcopy(self.fixed),
            "space": {name: param.to_dict() for name, param in self.params.items()},
        }

    def with_overrides(self, **changes: Any) -> StudySpec:
        """A copy with command-line style overrides, validated like the file.

        Accepts ``name``, ``objective`` and the ``search`` settings; None means
        "keep the file's value".

        >>> spec = parse_spec({"x": [1, 2, 3]})
        >>> spec.with_overrides(algorithm="random", max_trials=2, seed=None).max_trials
        2
        """
        unknown = sorted(set(changes) - {"name", "objective", *_SEARCH_KEYS})
        if unknown:
            raise TypeError(f"with_overrides() got unexpected keyword arguments: {', '.join(unknown)}")
        data = self.to_dict()
        for key, value in changes.items():
            if value is not None:
                (data["search"] if key in _SEARCH_KEYS else data)[key] = value
        if data["search"]["algorithm"] != "bayesian" and changes.get("sampler") is None:
            data["search"]["sampler"] = None  # left over from bayesian search, now meaningless
        return parse_spec(data, self.source, self.name)

    def describe(self) -> str:
        """A multi-line summary for ``hpo validate``."""
        search, res, stop = self.search, self.resources, self.early_stopping
        metric_line = "; ".join(
            f"{m.name} ({m.direction}" + ("" if m.target is None else f", target {m.target:g}") + ")"
            for m in self.metrics)
        algorithm = search.algorithm + (f" ({search.sampler})" if search.sampler else "")
        parallel = "all engine slots" if search.parallel is None else str(search.parallel)
        search_line = f"{algorithm}, max_trials {self.max_trials:,}, parallel {parallel}"
        if search.seed is not None:
            search_line += f", seed {search.seed}"
        if search.timeout_s is not None:
            search_line += f", timeout {search.timeout_s:g} s"
        resources = ", ".join(_amount_text(k, getattr(res, k)) for k in _AMOUNTS
                              if getattr(res, k) is not None and (k != "nodes" or res.nodes != 1))
        if res.time_limit_s is not None:
            resources += f", time limit {res.time_limit_s:g} s"
        pruning = stop.pruner + (f" after {stop.min_steps} steps" if stop.pruner != "none" else "")
        if stop.patience:
            pruning += f"; patience {stop.patience} reports"
        sched = self.scheduling
        scheduling = sched.policy
        if sched.policy != "fifo":
            scheduling += (f", quanta of {sched.segment_steps} steps" if sched.segment_steps
                           else f", quanta of {sched.quantum_s:g} s")
            if sched.milestones:
                scheduling += ", doubled at milestones " + ", ".join(
                    m if isinstance(m, str) else f"{m:g}" for m in sched.milestones)
        size = self.grid_size
        width = max(map(len, self.params))
        lines = [
            f"study       {self.name}  ({self.source})",
            f"objective   {self.objective}",
            f"metric      {metric_line}",
            f"search      {search_line}",
            f"resources   {resources} per trial",
            f"retries     objective {self.retries.objective}, engine {self.retries.engine}",
            f"pruning     {pruning}",
            f"scheduling  {scheduling}",
        ]
        alloc = self.allocation
        if alloc.planned:
            lines.append(f"allocation  {alloc.policy}, placement {alloc.placement}"
                         + (f", cost model {alloc.cost_model}" if alloc.cost_model else ""))
        if self.data:
            lines.append(f"data        {self.data.describe()}")
        if self.fixed:
            lines.append("fixed       " + ", ".join(f"{k}={v!r}" for k, v in self.fixed.items()))
        lines.append(f"parameters  {len(self.params)}")
        lines += [f"  {name:<{width}}  {param.describe()}" + _when_text(param) for name, param in self.params.items()]
        lines.append("grid size   " + ("infinite (continuous ranges)" if size is None
                                       else f"{size:,}" + (" active combinations" if self.conditional else "")))
        return "\n".join(lines)


def _when_text(param: Param) -> str:
    """``  when solver=sgd, momentum in [0.5, 0.9]`` for a conditional parameter."""
    if not param.when:
        return ""
    return "  when " + ", ".join(f"{p}={v[0]!r}" if len(v) == 1 else f"{p} in {list(v)!r}" for p, v in param.when)


def load_spec(path: str | os.PathLike[str]) -> StudySpec:
    """Read and validate the study file at ``path``; its stem is the default name."""
    path = Path(path)
    source = str(path)
    text = _read_text(path, Loc(source))
    try:
        data = json.loads(text, object_pairs_hook=partial(_no_duplicate_keys, source))
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        problem, fix = f"invalid JSON: {exc.msg} at {where}", f"check the JSON syntax near {where}"
        raise SpaceError(source, "$", problem, fix) from None
    except RecursionError:
        Loc(source).fail("JSON nested too deeply to parse (over about 1,000 levels)",
                         f"a space needs a few levels of nesting, never more than {_MAX_DEPTH}")
    return parse_spec(data, source, default_name=path.stem)


def _read_text(path: Path, at: Loc) -> str:
    """The file's text. Only a regular file is read (a FIFO or a device would block or
    never end), and at most _MAX_BYTES of it."""
    readable = "give the path of a readable UTF-8 JSON file"
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, pipe or socket"
            at.fail(f"not a regular file: it is {kind}", readable)
        with path.open("rb") as file:
            data = file.read(_MAX_BYTES + 1)
        text = data.decode("utf-8")
    except FileNotFoundError:
        at.fail("no such file", "check the path (example spaces are in search_spaces/)")
    except (OSError, UnicodeDecodeError) as exc:
        at.fail(f"cannot read the file: {exc}", readable)
    if len(data) > _MAX_BYTES:
        at.fail(f"the file is larger than {_MAX_BYTES // 2**20} MB, more than any space needs",
                "check the path: is this the space file?")
    return text


def _no_duplicate_keys(source: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys silently, losing e.g. a parameter.
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise SpaceError(source, "$", f"duplicate key {key!r} in an object", "keep one of the two")
        data[key] = value
    return data


def parse_spec(data: dict[str, Any], source: str = "<dict>", default_name: str = "study") -> StudySpec:
    """Validate a space in flat or full form (see the module docstring).

    >>> parse_spec({"space": {"x": {"type": "int", "low": 1, "high": 3}}}).grid_size
    3
    """
    root = Loc(source)
    if not isinstance(data, dict):
        root.expected("a JSON object", data, 'write {"param": [choices, ...]} or {"space": {...}}')
    _check_depth(data, root)
    if "space" in data:
        top = as_object(data, root, _TOP_KEYS)
        params = _space(top["space"], root / "space")
    else:
        top, params = {}, _flat_space(data, root)

    def get(key: str, check: _Check, default: Any) -> Any:
        return default if top.get(key) is None else check(top[key], root / key)

    metrics = _metrics(top.get("metric"), root / "metric")

    spec = StudySpec(
        name=get("name", _name, _safe_name(default_name)),
        objective=get("objective", _objective, DEFAULT_OBJECTIVE),
        metric=metrics[0],
        search=_search(top.get("search"), root / "search"),
        resources=_resources(top.get("resources"), root / "resources", params),
        retries=get("retries", _retries, Retries()),
        early_stopping=_section(
            EarlyStopping, top.get("early_stopping"), root / "early_stopping", _EARLY_STOPPING
        ),
        scheduling=_scheduling(top.get("scheduling"), root / "scheduling"),
        allocation=_allocation(top.get("allocation"), root / "allocation") if top.get("allocation")
        is not None else Allocation(),
        fixed=_fixed(top.get("fixed"), root / "fixed", params),
        params=params,
        source=source,
        objectives=metrics if isinstance(top.get("metric"), list) else (),
        data=get("data", parse_data, None),
    )
    if spec.search.algorithm == "bayesian" and "sampler" not in (top.get("search") or {}):
        spec = replace(spec, search=replace(spec.search, sampler=_default_sampler(spec)))
    if spec.multi_objective:
        _check_multi_objective(spec, root)
    if spec.grid_size is None:
        if spec.search.algorithm == "grid":
            spec.grid()  # raises the continuous parameter's own error
        if spec.search.max_trials is None:
            _missing_budget(spec)
    return spec


def _check_depth(data: dict[str, Any], root: Loc) -> None:
    """Refuse nesting deeper than _MAX_DEPTH, or a container inside itself."""
    stack: list[tuple[Any, Loc, int]] = [(data, root, 0)]
    while stack:
        value, at, depth = stack.pop()
        if depth > _MAX_DEPTH:
            at.fail(f"nested more than {_MAX_DEPTH} levels deep",
                    "a space needs a few levels of nesting: flatten this value")
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        # A Loc only for containers: a list of a million choices is walked fast.
        stack.extend((item, at / (key if isinstance(key, int) else str(key)), depth + 1)
                     for key, item in pairs if isinstance(item, (dict, list, tuple)))


def _space(value: object, at: Loc) -> dict[str, Param]:
    if not isinstance(value, dict) or not value:
        at.expected("a non-empty object of parameters", value, 'e.g. "space": {"optimizer": ["adam", "sgd"]}')
    found = unnest(value, at)  # choices' sub-spaces become parameters with a condition
    params = {name: parse_param(name, *found[name]) for name in sorted(found)}
    check_conditions(params)
    return params


def _flat_space(data: dict[str, Any], root: Loc) -> dict[str, Param]:
    if not data:
        root.fail("no parameters: the object is empty", 'write {"param": [choices, ...]} or {"space": {...}}')
    for key, value in data.items():
        if not isinstance(value, list):
            hint = key if key in _TOP_KEYS else closest(key, _TOP_KEYS)
            full = f'"{hint}" belongs to the full form, which needs a "space" object; ' if hint else ""
            (root / key).expected(
                "a list of choices (flat form: every key is a parameter)", value,
                full + 'write a list such as [value], or use the full form {"space": {...}, "fixed": {...}} '
                "for ranges and constants",
            )
    return _space(data, root)


def _resources(value: object, at: Loc, params: dict[str, Param]) -> Resources:
    """The ``resources`` section: each amount a number, or a parameter's name
    or an expression of parameters, checked over the values they can take."""
    if value is None:
        return Resources()
    given = {k: v for k, v in as_object(value, at, _RESOURCE_KEYS).items() if v is not None}
    known = {name for name, param in params.items() if not param.when}
    amounts: dict[str, Any] = {}
    for key, item in given.items():
        if key == "time_limit_s":
            amounts[key] = _positive(item, at / key)
        elif isinstance(item, str):
            try:
                amounts[key] = parse_amount(item, known)
            except ValueError as exc:
                (at / key).fail(str(exc), f'name a parameter that every configuration has (one of: '
                                f'{", ".join(sorted(known)) or "none"}), e.g. "{key}": "{key}"')
        elif isinstance(item, bool) or not isinstance(item, (int, float)):
            (at / key).expected(
                "a number, a parameter's name or an expression", item, f'e.g. "{key}": 1')
        else:
            amounts[key] = item
    resources = Resources(**amounts)
    for config in _shape_samples(resources, params):
        try:
            resources.shape(config)
        except (ValueError, ZeroDivisionError, TypeError) as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in config.items())
            fix = ("change the amount or the parameter's values so that every configuration "
                   "gets a valid shape") if shown else _LITERAL_FIX[_culprit(exc)]
            (at / _culprit(exc)).fail(f"{exc}" + (f" (for {shown})" if shown else ""), fix)
    return resources


_LITERAL_FIX = {
    "cpus": "write a whole number >= 1, e.g. 4", "nodes": "write a whole number >= 1, e.g. 2",
    "gpus": "write a number >= 0: whole GPUs (2), or a share of one (0.25)",
    "memory_gb": "write a number > 0, e.g. 16",
}


def _culprit(exc: Exception) -> str:
    text = str(exc)
    return next((k for k in _RESOURCE_KEYS if text.startswith(k)), "gpus")


def _shape_samples(resources: Resources, params: dict[str, Param]) -> list[dict[str, Any]]:
    """Configurations spanning the values the resources' parameters take."""
    names = sorted({n for k in _AMOUNTS for n in getattr(getattr(resources, k), "names", ())})
    return sample_configs({n: _values_of(params[n]) for n in names})


def _values_of(param: Param) -> list[Any]:
    if param.is_finite:
        return list(param.grid_values())
    if not isinstance(param, (IntParam, FloatParam)):
        raise RuntimeError("hpo internal error: only a range can be infinite")
    return [param.low, (param.low + param.high) / 2, param.high]


def shape_bounds(spec: StudySpec) -> tuple[TrialShape, TrialShape]:
    """The smallest and the largest trial of ``spec``, amount by amount."""
    shapes = [spec.resources.shape(c) for c in _shape_samples(spec.resources, spec.params)]
    def pick(f):
        return TrialShape(
            cpus=f(s.cpus for s in shapes), gpus=f(s.gpus for s in shapes),
            memory_gb=f((s.memory_gb for s in shapes if s.memory_gb), default=None),
            nodes=f(s.nodes for s in shapes), time_limit_s=spec.resources.time_limit_s)
    return pick(min), pick(max)


def _section(cls: type, value: object, at: Loc, checks: dict[str, _Check]) -> Any:
    """A settings object: its given keys checked, the rest left to the dataclass defaults."""
    if value is None:
        return cls()
    given = as_object(value, at, checks)
    return cls(**{key: checks[key](item, at / key) for key, item in given.items() if item is not None})


def _metrics(value: object, at: Loc) -> tuple[Metric, ...]:
    """One metric object, or a list of them (a multi-objective study)."""
    if not isinstance(value, list):
        return (_section(Metric, value, at, _METRIC),)
    example = '[{"name": "val_accuracy", "direction": "maximize"}, {"name": "fit_seconds", "direction": "minimize"}]'
    if not value:
        at.expected("a metric object or a non-empty list of them", value, f'e.g. "metric": {example}')
    metrics = tuple(_section(Metric, item if item is not None else {}, at / i, _METRIC)
                    for i, item in enumerate(value))
    seen: set[str] = set()
    for i, metric in enumerate(metrics):
        if metric.name in seen:
            (at / i / "name").fail(f"objective {metric.name!r} is listed twice",
                                   "give each objective its own metric name, or remove one")
        seen.add(metric.name)
    return metrics


def _check_multi_objective(spec: StudySpec, root: Loc) -> None:
    """Refuse settings that rank trials by a single value."""
    if spec.early_stopping.pruner != "none":
        (root / "early_stopping" / "pruner").fail(
            f"pruner {spec.early_stopping.pruner!r} with {len(spec.metrics)} objectives: "
            "Optuna's pruners support single-objective studies only",
            'remove early_stopping.pruner or use one metric')
    if spec.search.sampler == "multifidelity":
        (root / "search" / "sampler").fail(
            f'sampler "multifidelity" with {len(spec.metrics)} objectives: it ranks reports by a '
            "single value", 'use "tpe" or "nsga2", or one metric')
    if spec.scheduling.policy != "fifo":
        (root / "scheduling" / "policy").fail(
            f"scheduling policy {spec.scheduling.policy!r} with {len(spec.metrics)} objectives: "
            "segmented policies rank trials by a single loss",
            'remove scheduling.policy (or set it to "fifo") or use one metric')


def _default_sampler(spec: StudySpec) -> str:
    """Bayesian search's sampler when the space names none: multi-fidelity
    TPE where trials stop early (a pruner, a time-sharing policy), as it
    learns from the curves they leave; TPE otherwise (docs/performance.md,
    "Search quality on LCBench")."""
    stops_early = spec.early_stopping.pruner != "none" or spec.scheduling.policy != "fifo"
    return "multifidelity" if stops_early and not spec.multi_objective else "tpe"


def _search(value: object, at: Loc) -> SearchSettings:
    search = _section(SearchSettings, value, at, _SEARCH)
    if search.algorithm == "bayesian":
        return search if search.sampler else replace(search, sampler="tpe")
    if search.sampler is not None:
        (at / "sampler").fail(
            f'"sampler" applies to bayesian search only, got algorithm {search.algorithm!r}',
            'remove "sampler", or set "algorithm": "bayesian"',
        )
    return search


def _fixed(value: object, at: Loc, params: dict[str, Param]) -> dict[str, Any]:
    if value is None:
        return {}
    fixed = as_object(value, at)
    for key in fixed:
        if key in params:
            (at / key).fail(
                f"{key!r} is both fixed and a parameter in \"space\"",
                f'remove "{key}" from "fixed" or from "space"',
            )
    return copy.deepcopy(fixed)


def _name(value: object, at: Loc) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or set(value) == {"."}:
        example = _safe_name(value) if isinstance(value, str) else "my-study"
        at.expected(
            "a name of letters, digits, '.', '_' and '-' (it becomes a directory name)", value,
            f'e.g. "name": "{example}"',
        )
    return value


def _safe_name(text: str) -> str:
    """``text`` made a valid study name: ``"my study"`` becomes ``"my-study"``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "study"


def _objective(value: object, at: Loc) -> str:
    module, colon, function = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (colon and function.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        at.expected('"package.module:function"', value, f'e.g. "objective": "{DEFAULT_OBJECTIVE}"')
    if not isinstance(value, str):
        raise RuntimeError("hpo internal error: anything else has no colon: refused above")
    return value


def _missing_budget(spec: StudySpec) -> NoReturn:
    continuous = ", ".join(name for name, param in spec.params.items() if not param.is_finite)
    Loc(spec.source, "$.search.max_trials").fail(
        f"{spec.search.algorithm} search over a continuous range ({continuous}) needs a budget, got none",
        'add "max_trials": N to "search" (or give those parameters "num" or "step")',
    )
