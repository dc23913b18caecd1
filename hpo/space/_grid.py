"""A lazy, exactly counted grid over the parameters' grid values.

A grid of a billion points is never built: its size is the product of the
axis lengths and point ``i`` is decoded from ``i`` in mixed radix, like the
digits of a number, so ``grid[i]`` costs one ``divmod`` per parameter.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

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

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self._value(k) for k in range(*index.indices(self._size))]
        return self._value(_position(index, self._size))

    def __repr__(self) -> str:
        shown = ", ".join(repr(v) for v in self[:3])
        return f"Points([{shown}{', ...' if self._size > 3 else ''}], size={self._size})"


class Grid(Sequence[dict[str, Any]]):
    """Every combination of the parameters' grid values, in a fixed order.

    Keys are sorted (like scikit-learn's ``ParameterGrid``) and the first key
    varies slowest.

    >>> from hpo.space import CategoricalParam, IntParam
    >>> grid = Grid({"b": CategoricalParam("b", ["x", "y"]), "a": IntParam("a", 1, 3)})
    >>> len(grid), grid[0], grid[-1]
    (6, {'a': 1, 'b': 'x'}, {'a': 3, 'b': 'y'})
    >>> grid.index({"a": 2, "b": "y"})
    3
    """

    def __init__(self, params: Mapping[str, Param]) -> None:
        self._keys = tuple(sorted(params))
        self._axes = tuple(params[key].grid_values() for key in self._keys)
        self._radices = tuple(len(axis) for axis in self._axes)
        self._size = math.prod(self._radices)

    @property
    def keys(self) -> tuple[str, ...]:
        """Parameter names in grid order."""
        return self._keys

    @property
    def size(self) -> int:
        """Number of points, exact even beyond ``sys.maxsize`` (where ``len`` overflows)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        rest = _position(index, self._size)
        values = []
        for axis, radix in zip(reversed(self._axes), reversed(self._radices)):
            rest, digit = divmod(rest, radix)
            values.append(axis[digit])
        return dict(zip(self._keys, reversed(values)))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._size))

    def index(self, config: Mapping[str, Any], start: int = 0, stop: int | None = None) -> int:
        """Position of ``config`` in the grid, in O(parameters) for int and categorical axes."""
        if not isinstance(config, Mapping) or set(config) != set(self._keys):
            raise ValueError(f"{config!r} does not have the grid's keys {list(self._keys)}")
        position = 0
        for key, axis, radix in zip(self._keys, self._axes, self._radices):
            position = position * radix + axis.index(config[key])
        if not start <= position < (self._size if stop is None else stop):
            raise ValueError(f"{config!r} is not in the grid between {start} and {stop}")
        return position

    def __contains__(self, config: object) -> bool:
        try:
            self.index(config)  # type: ignore[arg-type]
        except ValueError:
            return False
        return True

    def __repr__(self) -> str:
        axes = ", ".join(f"{key}: {radix}" for key, radix in zip(self._keys, self._radices))
        return f"Grid({{{axes}}}, size={self._size:,})"
