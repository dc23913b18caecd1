"""A trial's shape: the CPUs, GPUs, memory and nodes one configuration needs.

Each entry of a space's ``resources`` is a number, the name of a parameter
(searched like any other), or an arithmetic expression of parameters::

    "resources": {"gpus": "gpus", "cpus": "4 * max(1, gpus)", "nodes": 1}

GPUs come whole (1, 2, 8) or as a share of one device (0.25: four trials
on a GPU, each told its device and its memory share). Shapes are checked
when the file is read, over the values the parameters can take, so that a
configuration asking for 1.5 GPUs is refused before any trial runs.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrialShape", "Amount", "parse_amount", "check_shape", "sample_configs"]

_FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "round": round, "abs": abs,
}
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
# Values tried per parameter, and configurations in all, when checking shapes.
_MAX_VALUES, _MAX_CONFIGS = 64, 4096


@dataclass(frozen=True)
class TrialShape:
    """What one trial runs on.

    >>> TrialShape(gpus=0.25).describe()
    '1 cpu, 0.25 gpu'
    >>> TrialShape(cpus=4, gpus=2, nodes=2).describe()
    '4 cpus, 2 gpus per node, 2 nodes'
    """

    cpus: int = 1
    gpus: float = 0  # 0, a share of one device in (0, 1), or whole devices
    memory_gb: float | None = None
    nodes: int = 1
    time_limit_s: float | None = None

    @property
    def shared(self) -> bool:
        """Whether the trial takes a share of one GPU rather than whole ones."""
        return 0 < self.gpus < 1

    @property
    def devices(self) -> int:
        """How many GPU devices the trial sees on each node."""
        return 1 if self.shared else int(self.gpus)

    @property
    def gpu_total(self) -> float:
        """GPUs over all its nodes (what a GPU-hour counts)."""
        return self.gpus * self.nodes

    def describe(self) -> str:
        gpus = f"{self.gpus:g} gpu" + ("s" if self.gpus > 1 else "")
        text = f"{self.cpus} cpu{'s' if self.cpus > 1 else ''}, {gpus}"
        if self.nodes > 1:
            text += f" per node, {self.nodes} nodes"
        if self.memory_gb:
            text += f", {self.memory_gb:g} GB"
        return text


@dataclass(frozen=True)
class Amount:
    """A resource given as a parameter's name or an expression of parameters."""

    text: str
    names: tuple[str, ...]
    # Parsed once: the master evaluates it for every trial.
    tree: ast.expr = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree", ast.parse(self.text, mode="eval").body)

    def value(self, config: Mapping[str, Any]) -> float:
        """The amount for ``config``; KeyError names a parameter it lacks."""
        return _evaluate(self.tree, config)

    def __str__(self) -> str:
        return self.text


def parse_amount(text: str, known: set[str]) -> Amount:
    """An :class:`Amount` from ``text``; ValueError says what is wrong in it.

    >>> parse_amount("max(1, batch_size // 128)", {"batch_size"}).value({"batch_size": 512})
    4
    """
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not an expression") from None
    names = _check_tree(tree, known)
    return Amount(text, tuple(sorted(names)))


def _check_tree(node: ast.AST, known: set[str]) -> set[str]:
    """The parameter names ``node`` uses, after checking it uses nothing else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return set()
    if isinstance(node, ast.Name):
        if node.id not in known:
            raise ValueError(f"{node.id!r} is not a parameter of the space")
        return {node.id}
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _check_tree(node.left, known) | _check_tree(node.right, known)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_tree(node.operand, known)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCTIONS and node.args and not node.keywords:
        return set().union(*(_check_tree(arg, known) for arg in node.args))
    raise ValueError(f"{ast.unparse(node)!r} is not allowed: use numbers, parameter names, "
                     f"+ - * / // % **, and {', '.join(_FUNCTIONS)}")


def _evaluate(node: ast.AST, config: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return config[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, config), _evaluate(node.right, config))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, config))
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise RuntimeError("hpo internal error: what _check_tree lets through")
    return _FUNCTIONS[node.func.id](*(_evaluate(arg, config) for arg in node.args))


def check_shape(cpus: Any, gpus: Any, memory_gb: Any, nodes: Any,
                time_limit_s: float | None) -> TrialShape:
    """The shape with these evaluated amounts; ValueError (naming the
    resource) when one is not a shape a trial can have."""
    if not _number(cpus) or cpus < 1 or cpus != int(cpus):
        raise ValueError(f"cpus is {cpus!r}: expected a whole number >= 1")
    if not _number(gpus) or gpus < 0 or (gpus > 1 and gpus != int(gpus)):
        raise ValueError(f"gpus is {gpus!r}: expected a number >= 0: a share of one GPU "
                         "in (0, 1), or a whole number of GPUs")
    if memory_gb is not None and (not _number(memory_gb) or memory_gb <= 0):
        raise ValueError(f"memory_gb is {memory_gb!r}: expected a number > 0")
    if not _number(nodes) or nodes < 1 or nodes != int(nodes):
        raise ValueError(f"nodes is {nodes!r}: expected a whole number >= 1")
    if nodes > 1 and 0 < gpus < 1:
        raise ValueError(f"a trial on {nodes:g} nodes takes whole GPUs, not {gpus:g} of one")
    whole_gpus = float(gpus) if 0 < gpus < 1 else int(gpus)
    return TrialShape(int(cpus), whole_gpus, None if memory_gb is None else float(memory_gb),
                      int(nodes), time_limit_s)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sample_configs(values: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Configurations to check shapes on: every combination of the values
    given per parameter, at most ``_MAX_CONFIGS`` of them (spread evenly)."""
    names = sorted(values)
    combos = itertools.product(*(values[n][:_MAX_VALUES] for n in names))
    total = math.prod(min(len(values[n]), _MAX_VALUES) for n in names)
    stride = max(1, total // _MAX_CONFIGS)
    return [dict(zip(names, combo)) for combo in itertools.islice(combos, 0, None, stride)]
