"""Conditional parameters: active only when other parameters take given values.

A parameter with ``"when": {"solver": "sgd"}`` (or ``["sgd", "rmsprop"]``)
exists only in configurations where ``solver`` is one of those values, and a
choice may carry its own sub-space, ``{"value": "sgd", "space": {...}}``,
which is the same condition written where it belongs. Conditions chain: a
parameter whose condition names an inactive parameter is inactive too.

The grid is a list of disjoint blocks, each a plain product: the parameters
a condition names are split into classes of values that activate the same
parameters, and every path through those classes is one block, so the grid
counts and indexes only distinct active combinations, lazily.

    >>> from hpo.space import parse_spec
    >>> spec = parse_spec({"space": {
    ...     "solver": ["adam", {"value": "sgd", "space": {"momentum": [0.0, 0.9]}}],
    ...     "lr": [0.01, 0.1]}})
    >>> spec.grid_size, spec.grid()[0], spec.grid()[-1]
    (6, {'lr': 0.01, 'solver': 'adam'}, {'lr': 0.1, 'momentum': 0.9, 'solver': 'sgd'})
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpo.errors import closest

if TYPE_CHECKING:
    from hpo.space._params import Loc, Param

__all__ = ["Condition", "unnest", "join", "check_conditions", "ordered", "is_active", "blocks"]

#: ``((parameter, allowed values), ...)``, sorted by parameter name.
Condition = tuple[tuple[str, tuple[Any, ...]], ...]

# Blocks of a grid: one per path through the condition classes. Far more than a
# real space makes; beyond it, conditions on many values would make the grid slow.
_MAX_BLOCKS = 100_000


# --- nested sub-spaces --------------------------------------------------------


def unnest(space: Mapping[str, Any], at: Loc, inherited: Condition = ()) -> dict[str, tuple[Any, Loc, Condition]]:
    """Every parameter of ``space``, sub-spaces of choices included, as
    ``name: (its JSON with plain choices, where it is, the condition its place implies)``."""
    found: dict[str, tuple[Any, Loc, Condition]] = {}
    for name, value in space.items():
        loc = at / name
        value, subspaces = _plain_choices(name, value, loc, inherited)
        for sub_name, item in [(name, (value, loc, inherited)), *subspaces]:
            if sub_name in found:
                item[1].fail(f"parameter {sub_name!r} is defined twice (also at {found[sub_name][1].path})",
                             'give each a distinct name, or define it once with "when": '
                             '{"<parameter>": [<value>, <value>]}')
            found[sub_name] = item
    return found


def _plain_choices(name: str, value: Any, at: Loc, inherited: Condition) -> tuple[Any, list]:
    """``value`` with each ``{"value": v, "space": {...}}`` choice replaced by
    ``v``, and the parameters of those sub-spaces."""
    listed = value if isinstance(value, list) else value.get("choices") if isinstance(value, dict) else None
    if not isinstance(listed, list) or not any(isinstance(c, dict) for c in listed):
        return value, []
    choices_at = at if isinstance(value, list) else at / "choices"
    plain: list[Any] = []
    subspaces: list[tuple[str, tuple[Any, Loc, Condition]]] = []
    for i, choice in enumerate(listed):
        if not isinstance(choice, dict):
            plain.append(choice)
            continue
        here = choices_at / i
        unknown = sorted(set(choice) - {"value", "space"})
        if unknown or "value" not in choice:
            here.fail(f"a choice with a sub-space needs \"value\" and \"space\", got keys {sorted(choice)}",
                      'write {"value": "sgd", "space": {"momentum": [0.0, 0.9]}}')
        plain.append(choice["value"])
        sub = choice.get("space", {})
        if not isinstance(sub, dict):
            (here / "space").expected("an object of parameters", sub)
        condition = _merge(inherited, ((name, (choice["value"],)),))
        subspaces.extend(unnest(sub, here / "space", condition).items())
    return (plain if isinstance(value, list) else {**value, "choices": plain}), subspaces


def _merge(first: Condition, second: Condition) -> Condition:
    return tuple(sorted(first + second))


def join(inherited: Condition, own: Condition, at: Loc) -> Condition:
    """A nested parameter's own condition added to the one its place implies."""
    implied = dict(inherited)
    for parent, _ in own:
        if parent in implied:
            (at / parent).fail(f"the condition on {parent!r} is already set by where the parameter is "
                               f"nested (under {parent}={implied[parent][0]!r})",
                               f'remove "{parent}" from "when", or move the parameter out of the sub-space')
    return _merge(inherited, own)


# --- validation and activity ------------------------------------------------------


def check_conditions(params: Mapping[str, Param]) -> list[str]:
    """Refuse a condition on an unknown parameter or value, or a cycle; the
    parameters in an order where every condition's parameters come first."""
    for param in params.values():
        for parent, allowed in param.when:
            _check_parent(param, parent, allowed, params)
    return ordered(params)


def _check_parent(param: Param, parent: str, allowed: tuple, params: Mapping[str, Param]) -> None:
    at = param.loc / "when" / parent
    if parent == param.name:
        at.fail(f"{param.name!r} depends on itself", f'remove "{parent}" from "when"')
    if parent not in params:
        hint = closest(parent, list(params))
        at.fail(f"condition on unknown parameter {parent!r}",
                f'did you mean "{hint}"?' if hint else "name a parameter of the space: " + ", ".join(params))
    values = params[parent].grid_values() if params[parent].kind != "float" else None
    if values is None:
        at.fail(f"condition on {parent!r}, a float range: a sampled float never equals a given value",
                f'make "{parent}" a list of choices, or an int parameter')
    for value in allowed:
        if not any(value == v and type(value) is type(v) for v in _candidates(values, value)):
            shown = list(values) if len(values) <= 20 else f"{list(values[:20])}..."
            at.fail(f"{value!r} is not a value of {parent!r}", f"use values of {parent!r}: {shown}")


def _candidates(values: Sequence, value: Any) -> Sequence:
    """The values equal to ``value`` to compare types with; a range answers in O(1)."""
    if isinstance(values, range):
        return [value] if isinstance(value, int) and not isinstance(value, bool) and value in values else []
    return values


def ordered(params: Mapping[str, Param]) -> list[str]:
    """Parameter names, each after the parameters its condition names, by
    name otherwise (so an unconditional space keeps its sorted order)."""
    waiting = {name: {parent for parent, _ in param.when} for name, param in params.items()}
    children: dict[str, list[str]] = {name: [] for name in params}
    for name, parents in waiting.items():
        for parent in parents:
            children[parent].append(name)
    ready = [name for name, parents in waiting.items() if not parents]
    heapq.heapify(ready)
    order = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for child in children[name]:
            waiting[child].discard(name)
            if not waiting[child]:
                heapq.heappush(ready, child)
    if len(order) < len(params):
        cycle = sorted(set(params) - set(order))
        params[cycle[0]].loc.fail(f"conditions form a cycle among {cycle}",
                                  'make each "when" name parameters that do not depend on it')
    return order


def is_active(param: Param, config: Mapping[str, Any]) -> bool:
    """Whether ``param`` exists given the values chosen so far (its condition's parameters first)."""
    return all(parent in config and config[parent] in allowed for parent, allowed in param.when)


# --- the grid as blocks ---------------------------------------------------------------


def blocks(params: Mapping[str, Param]) -> Iterator[dict[str, Sequence]]:
    """Disjoint blocks of the grid: each maps the active parameters to the
    values they take in it; their products together are every active combination once."""
    order = ordered(params)
    classes = _classes(params)
    count = 0

    def walk(position: int, axes: dict[str, Sequence]) -> Iterator[dict[str, Sequence]]:
        nonlocal count
        while position < len(order) and not _active_in(params[order[position]], axes):
            position += 1
        if position == len(order):
            count += 1
            if count > _MAX_BLOCKS:
                params[order[0]].loc.fail(
                    f"the conditions split the grid into more than {_MAX_BLOCKS:,} blocks",
                    'condition on fewer values, or use "algorithm": "random"')
            yield dict(sorted(axes.items()))
            return
        name = order[position]
        for values in classes.get(name) or [params[name].grid_values()]:
            yield from walk(position + 1, {**axes, name: values})

    yield from walk(0, {})


def _active_in(param: Param, axes: Mapping[str, Sequence]) -> bool:
    # Every value of a class activates the same parameters: its first decides.
    return all(parent in axes and axes[parent][0] in allowed for parent, allowed in param.when)


def _classes(params: Mapping[str, Param]) -> dict[str, list[Sequence]]:
    """For each parameter a condition names, its grid values split into the
    classes that activate the same parameters (in grid order; empty ones left out)."""
    sets: dict[str, list[tuple]] = {}
    for param in params.values():
        for parent, allowed in param.when:
            sets.setdefault(parent, []).append(allowed)
    classes: dict[str, list[Sequence]] = {}
    for parent, allowed_sets in sets.items():
        axis = params[parent].grid_values()
        named = sorted({i for allowed in allowed_sets for v in allowed for i in _positions(axis, v)})
        groups: dict[tuple, list[int]] = {}
        for i in named:
            groups.setdefault(tuple(axis[i] in allowed for allowed in allowed_sets), []).append(i)
        found: list[tuple[int, Sequence]] = [(g[0], tuple(axis[i] for i in g)) for g in groups.values()]
        rest = _Without(axis, named)
        if len(rest):
            gone = set(named)
            found.append((next(i for i in itertools.count() if i not in gone), rest))
        classes[parent] = [values for _, values in sorted(found, key=lambda item: item[0])]
    return classes


def _positions(axis: Sequence, value: Any) -> list[int]:
    if isinstance(axis, range):
        return [axis.index(value)] if isinstance(value, int) and value in axis else []
    return [i for i, v in enumerate(axis) if v == value and type(v) is type(value)]


class _Without(Sequence):
    """``axis`` less the values at the sorted positions ``gone``, computed on demand."""

    def __init__(self, axis: Sequence, gone: list[int]) -> None:
        self._axis, self._gone = axis, gone

    def __len__(self) -> int:
        return len(self._axis) - len(self._gone)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        position = index % len(self)
        for gone in self._gone:  # few: the values some condition names
            if gone <= position:
                position += 1
        return self._axis[position]

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        position = self._axis.index(value)
        if position in self._gone:
            raise ValueError(f"{value!r} is not in this class")
        return position - sum(gone < position for gone in self._gone)
