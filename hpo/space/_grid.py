"""A lazy, exactly counted grid over the parameters' grid values.

A grid of a billion points is never built: its size is the product of the
axis lengths and point ``i`` is decoded from ``i`` in mixed radix, like the
digits of a number, so ``grid[i]`` costs one ``divmod`` per parameter.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hpo.space._conditions import blocks

if TYPE_CHECKING:
    from hpo.space._params import Param

__all__ = ["Grid", "Points"]

T = TypeVar("T")


def _position(index: int, size: int) -> int:
    """``index`` as a non-negative position, accepting negatives like a list."""
    i = operator.index(index)
    if i < 0:
        i += size
    if not 0 <= i < size:
        raise IndexError(f"index {index} out of range for {size:,} points")
    return i


class Points(Sequence[T]):
    """``size`` values computed on demand by ``value(k)``.

    >>> halves = Points(3, lambda k: k / 2)
    >>> len(halves), halves[-1], list(halves)
    (3, 1.0, [0.0, 0.5, 1.0])
    """

    __slots__ = ("_size", "_value")

    def __init__(self, size: int, value: Callable[[int], T]) -> None:
        self._size, self._value = size, value

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._value(k) for k in range(*index.indices(self._size))]
        return self._value(_position(index, self._size))

    def __repr__(self) -> str:
        shown = ", ".join(repr(v) for v in self[:3])
        return f"Points([{shown}{', ...' if self._size > 3 else ''}], size={self._size})"


class _Block:
    """Every combination of some parameters' values: a mixed-radix number."""

    def __init__(self, axes: Mapping[str, Sequence[Any]]) -> None:
        self.keys = tuple(sorted(axes))
        self.axes = tuple(axes[key] for key in self.keys)
        self.radices = tuple(len(axis) for axis in self.axes)
        self.size = math.prod(self.radices)

    def point(self, position: int) -> dict[str, Any]:
        values = []
        for axis, radix in zip(reversed(self.axes), reversed(self.radices)):
            position, digit = divmod(position, radix)
            values.append(axis[digit])
        return dict(zip(self.keys, reversed(values)))

    def index(self, config: Mapping[str, Any]) -> int:
        if set(config) != set(self.keys):
            raise ValueError(f"{config!r} does not have the keys {list(self.keys)}")
        position = 0
        for key, axis, radix in zip(self.keys, self.axes, self.radices):
            position = position * radix + axis.index(config[key])
        return position


class Grid(Sequence[dict[str, Any]]):
    """Every combination of the active parameters' grid values, in a fixed order.

    Keys are sorted (like scikit-learn's ``ParameterGrid``) and the first key
    varies slowest. With conditional parameters (hpo.space._conditions) the
    grid is a run of such products, one per set of active parameters, and a
    point holds only its active parameters.

    >>> from hpo.space import CategoricalParam, IntParam
    >>> grid = Grid({"b": CategoricalParam("b", ["x", "y"]), "a": IntParam("a", 1, 3)})
    >>> len(grid), grid[0], grid[-1]
    (6, {'a': 1, 'b': 'x'}, {'a': 3, 'b': 'y'})
    >>> grid.index({"a": 2, "b": "y"})
    3
    """

    def __init__(self, params: Mapping[str, Param]) -> None:
        self._keys = tuple(sorted(params))
        self._blocks = [block for axes in blocks(params) if (block := _Block(axes)).size]
        self._starts = list(itertools.accumulate((b.size for b in self._blocks), initial=0))
        self._size = self._starts[-1]

    @property
    def keys(self) -> tuple[str, ...]:
        """Parameter names in grid order (a point of a conditional grid has some of them)."""
        return self._keys

    @property
    def size(self) -> int:
        """Number of points, exact even beyond ``sys.maxsize`` (where ``len`` overflows)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        position = _position(index, self._size)
        k = bisect.bisect_right(self._starts, position) - 1
        return self._blocks[k].point(position - self._starts[k])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._size))

    def index(self, config: object, start: int = 0, stop: int | None = None) -> int:
        """Position of ``config`` in the grid, in O(parameters) for int and categorical axes."""
        if not isinstance(config, Mapping):
            raise ValueError(f"{config!r} is not a configuration")
        for block, first in zip(self._blocks, self._starts):
            try:
                position = first + block.index(config)
            except ValueError:
                continue
            if start <= position < (self._size if stop is None else stop):
                return position
        raise ValueError(f"{config!r} is not in the grid between {start} and {stop}")

    def __contains__(self, config: object) -> bool:
        try:
            self.index(config)
        except ValueError:
            return False
        return True

    def __repr__(self) -> str:
        if len(self._blocks) != 1:
            return f"Grid({len(self._blocks)} blocks of active parameters, size={self._size:,})"
        block = self._blocks[0]
        axes = ", ".join(f"{key}: {radix}" for key, radix in zip(block.keys, block.radices))
        return f"Grid({{{axes}}}, size={self._size:,})"
