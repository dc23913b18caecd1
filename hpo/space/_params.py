"""Parameter kinds of a search space: their grid values and Optuna distributions.

Each kind is a frozen dataclass that validates itself when built, so a
parameter made in Python gets the same checks, and the same JSON-path errors,
as one read from a space file::

    >>> IntParam("units", 16, 128, step=16).grid_values()
    range(16, 129, 16)
    >>> FloatParam("lr", 0, 1).low
    0.0

The ``as_*`` checkers below are shared with the study-file parser.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, NoReturn, TypeGuard

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from hpo.errors import SpaceError, closest
from hpo.space._conditions import Condition, join
from hpo.space._grid import Points

__all__ = ["Choice", "Param", "CategoricalParam", "IntParam", "FloatParam", "parse_param"]

Choice = str | int | float | bool | None

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Optuna stores every parameter value as a 64-bit float: beyond 2**53 neighbouring
# integers become one value, so distinct grid points would silently run the same config.
_EXACT_INT = 2**53
_JSON_TYPES = {
    bool: "a boolean", int: "an integer", float: "a number", str: "a string",
    list: "an array", tuple: "an array", dict: "an object", type(None): "null",
}


# --- locations and checkers -------------------------------------------------


@dataclass(frozen=True)
class Loc:
    """Where a value sits (source and JSON path), to raise errors about it.

    >>> (Loc("s.json") / "space" / "learning-rate" / 0).path
    '$.space["learning-rate"][0]'
    """

    source: str = "<dict>"
    path: str = "$"

    def __truediv__(self, key: str | int) -> Loc:
        if isinstance(key, int):
            return Loc(self.source, f"{self.path}[{key}]")
        if _IDENTIFIER.fullmatch(key):
            return Loc(self.source, f"{self.path}.{key}")
        return Loc(self.source, f"{self.path}[{json.dumps(key)}]")

    def fail(self, problem: str, fix: str | None = None) -> NoReturn:
        raise SpaceError(self.source, self.path, problem, fix)

    def expected(self, what: str, value: object, fix: str | None = None) -> NoReturn:
        """Fail with the JSON type of ``value`` shown, so that ``"5"`` and ``5`` differ."""
        kind = _JSON_TYPES.get(type(value), type(value).__name__)
        self.fail(f"expected {what}, got {value!r} ({kind})", fix or f"write {what}")


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_int(value: object, at: Loc, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) from ``minimum`` to ``maximum``."""
    what = "an integer"
    if maximum is not None:
        what += f" <= {maximum}" if minimum is None else f" from {minimum} to {maximum}"
    elif minimum is not None:
        what += f" >= {minimum}"
    if not isinstance(value, int) or isinstance(value, bool):
        at.expected(what, value)
    too_small = minimum is not None and value < minimum
    if too_small or (maximum is not None and value > maximum):
        at.fail(f"expected {what}, got {value!r}", f"write {what}")
    return value


def as_number(value: object, at: Loc, positive: bool = False) -> float:
    """``value`` as a float if it is a finite number (bools are not numbers)."""
    what = "a number > 0" if positive else "a number"
    if not _is_number(value):
        at.expected(what, value)
    if not math.isfinite(value) or (positive and value <= 0):
        at.fail(f"expected {what}, got {value!r}", f"write {what}")
    return float(value)


def as_str(value: object, at: Loc) -> str:
    if not isinstance(value, str) or not value:
        at.expected("a non-empty string", value)
    return value


def as_bool(value: object, at: Loc) -> bool:
    if not isinstance(value, bool):
        at.expected("true or false", value)
    return value


def as_choice(value: object, at: Loc, options: Sequence[str]) -> str:
    """``value`` if it is one of ``options``, else an error suggesting the closest."""
    if isinstance(value, str) and value in options:
        return value
    listed = ", ".join(json.dumps(option) for option in options)
    hint = closest(value, options) if isinstance(value, str) else None
    at.expected(f"one of {listed}", value, f'write "{hint}"' if hint else f"write one of {listed}")


def as_object(
    value: object, at: Loc, allowed: Collection[str] | None = None, required: Collection[str] = ()
) -> dict[str, Any]:
    """``value`` if it is an object with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(value, dict):
        at.expected("an object", value)
    for key in value:
        if not isinstance(key, str):
            at.fail(f"expected string keys, got {key!r}", "use strings as keys")
        if allowed is not None and key not in allowed:
            hint = closest(key, allowed)
            valid = "valid keys: " + ", ".join(allowed)
            (at / key).fail(f"unknown key {key!r}", f'did you mean "{hint}"? ({valid})' if hint else valid)
    for key in required:
        if value.get(key) is None:
            (at / key).fail(f"missing required key {key!r}", f'add "{key}"')
    return value


def check_choices(value: object, at: Loc) -> tuple[Choice, ...]:
    """The choices of a categorical parameter: a non-empty list of distinct scalars."""
    if not isinstance(value, (list, tuple)) or not value:
        at.expected("a non-empty list of choices", value, 'write a list such as ["adam", "sgd"]')
    # Index of each choice seen: one look-up per choice, so a million choices check fast.
    # Equal numbers hash alike, so 1, 1.0 and True are one key, as they are one choice to Optuna.
    firsts: dict[Choice, int] = {}
    for i, choice in enumerate(value):
        if not (choice is None or isinstance(choice, (str, bool)) or _is_number(choice)):
            (at / i).expected("a string, number, boolean or null", choice)
        if isinstance(choice, float) and not math.isfinite(choice):
            (at / i).fail(f"expected a finite number, got {choice!r}", "write a finite number")
        first = firsts.setdefault(choice, i)
        if first < i:
            (at / i).fail(
                f"duplicate choice {choice!r} (equal to {value[first]!r} at [{first}])",
                "list each choice once",
            )
    return tuple(value)


# --- parameter kinds ---------------------------------------------------------


@dataclass(frozen=True)
class Param(ABC):
    """One search-space parameter: its grid values, Optuna distribution and JSON form.

    ``loc`` locates the parameter for error messages; it defaults to
    ``$.space.<name>`` in ``<dict>`` and takes no part in equality.
    """

    kind: ClassVar[str]
    name: str
    # None only until __post_init__ fills it in: a Param always has its Loc.
    loc: Loc = field(default=None, kw_only=True, compare=False, repr=False)  # type: ignore[assignment]
    #: When the parameter exists: ``((other parameter, allowed values), ...)``
    #: (hpo.space._conditions); empty for one that always does.
    when: Condition = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            (self.loc or Loc()).expected("a non-empty parameter name", self.name)
        if self.loc is None:
            object.__setattr__(self, "loc", Loc() / "space" / self.name)

    @property
    def is_finite(self) -> bool:
        """Whether the parameter has grid values (False for a continuous float range)."""
        return True

    @abstractmethod
    def grid_values(self) -> Sequence[Choice]:
        """The values grid search tries, as a lazy indexable sequence."""

    @abstractmethod
    def distribution(self) -> BaseDistribution:
        """The Optuna distribution that samplers draw from."""

    def to_dict(self) -> dict[str, Any]:
        """The parameter's object form in a space file, defaults filled in."""
        form = self._form()
        return form | {"when": {p: list(v) for p, v in self.when}} if self.when else form

    @abstractmethod
    def _form(self) -> dict[str, Any]:
        """The object form of the kind's own fields."""

    @abstractmethod
    def describe(self) -> str:
        """One line for humans, e.g. ``float [0.0001, 0.1] log``."""


@dataclass(frozen=True)
class CategoricalParam(Param):
    """One of a list of choices.

    >>> CategoricalParam("optimizer", ["Adam", "SGD"]).describe()
    "categorical ['Adam', 'SGD']"
    """

    kind: ClassVar[str] = "categorical"
    choices: tuple[Choice, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "choices", check_choices(self.choices, self.loc / "choices"))

    def grid_values(self) -> tuple[Choice, ...]:
        return self.choices

    def distribution(self) -> CategoricalDistribution:
        return CategoricalDistribution(self.choices)

    def _form(self) -> dict[str, Any]:
        return {"type": self.kind, "choices": list(self.choices)}

    def describe(self) -> str:
        return f"{self.kind} {list(self.choices)!r}"


def _check_range(param: IntParam | FloatParam) -> None:
    if param.low >= param.high:
        param.loc.fail(
            f"low >= high: low={param.low!r}, high={param.high!r}",
            'make "low" smaller than "high" (a constant belongs under "fixed")',
        )
    if param.log and param.low <= 0:
        (param.loc / "low").fail(
            f"a log scale needs low > 0, got low={param.low!r}",
            'make "low" positive, or set "log": false',
        )


def _range_text(param: IntParam | FloatParam) -> str:
    text = f"{param.kind} [{param.low!r}, {param.high!r}]"
    if param.log:
        text += " log"
    if param.step not in (None, 1):
        text += f" step {param.step!r}"
    if param.num is not None:
        text += f" num {param.num}"
    return text


def _tidy(x: float) -> float:
    """``x`` rounded to 15 significant digits: 0.1 + 2 * 0.1 gives 0.3, not 0.30000000000000004."""
    return float(f"{x:.15g}")


@dataclass(frozen=True)
class IntParam(Param):
    """Integers from ``low`` to ``high`` inclusive, by ``step`` or on a log scale.

    A log-scale int with ``num`` has ``num`` geometrically spaced grid values
    (fewer if rounding merges some); without ``num`` its grid is every int.

    >>> list(IntParam("trees", 1, 1000, log=True, num=4).grid_values())
    [1, 10, 100, 1000]
    """

    kind: ClassVar[str] = "int"
    low: int
    high: int
    step: int = 1
    log: bool = False
    num: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at = self.loc
        as_int(self.low, at / "low")
        as_int(self.high, at / "high")
        for key in ("low", "high"):
            if abs(getattr(self, key)) > _EXACT_INT:
                (at / key).fail(
                    f"{key}={getattr(self, key)!r} is beyond 2**53, where the store (64-bit floats) "
                    "cannot tell neighbouring integers apart",
                    f"keep int ranges within -{_EXACT_INT} and {_EXACT_INT}, or use a float "
                    'parameter ("log": true for a range this wide)',
                )
        as_int(self.step, at / "step", minimum=1)
        as_bool(self.log, at / "log")
        if self.num is not None:
            as_int(self.num, at / "num", minimum=2)
        _check_range(self)
        if self.log and self.step != 1:
            (at / "step").fail(
                f"a log-scale int needs step 1, got {self.step!r}", 'remove "step", or set "log": false'
            )
        if self.num is not None and not self.log:
            (at / "num").fail(
                f'"num" needs "log": true for an int, got num={self.num!r}',
                'remove "num" and use "step" for a linear int, or set "log": true',
            )

    def grid_values(self) -> Sequence[int]:
        if self.num is None:
            return range(self.low, self.high + 1, self.step)
        ratio = self.high / self.low
        return tuple(sorted({round(self.low * ratio ** (k / (self.num - 1))) for k in range(self.num)}))

    def distribution(self) -> IntDistribution:
        # The last grid value as high, so Optuna need not trim the range (and warn).
        top = range(self.low, self.high + 1, self.step)[-1]
        return IntDistribution(self.low, top, log=self.log, step=self.step)

    def _form(self) -> dict[str, Any]:
        data = {"type": self.kind, "low": self.low, "high": self.high, "step": self.step, "log": self.log}
        return data if self.num is None else data | {"num": self.num}

    def describe(self) -> str:
        return _range_text(self)


def _check_count(param: FloatParam) -> None:
    # Beyond 2**53 points the index k in low + k * step is no longer exact, neighbouring
    # points are one float, and the grid could not even be counted with len().
    limit = "more than 2**53 grid points, beyond which they are no longer distinct 64-bit floats"
    if param.step is not None and not param._steps() < _EXACT_INT:
        (param.loc / "step").fail(
            f"step={param.step!r} in [{param.low!r}, {param.high!r}] gives {limit}",
            'use a larger "step", or remove "step" for a continuous range',
        )
    if param.num is not None and param.num > _EXACT_INT:
        (param.loc / "num").fail(
            f"num={param.num!r} asks for {limit}", 'use a smaller "num", or remove "num" for a continuous range'
        )


@dataclass(frozen=True)
class FloatParam(Param):
    """Real numbers from ``low`` to ``high``, continuous or on grid points.

    Grid points come from ``step`` (``low + k * step`` up to ``high``) or
    ``num`` (evenly spaced, or geometrically when ``log``); samplers always
    see the whole range (on ``step`` when given).

    >>> list(FloatParam("lr", 1e-4, 1e-1, log=True, num=4).grid_values())
    [0.0001, 0.001, 0.01, 0.1]
    >>> FloatParam("dropout", 0, 0.5).is_finite
    False
    """

    kind: ClassVar[str] = "float"
    low: float
    high: float
    step: float | None = None
    log: bool = False
    num: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at, set_ = self.loc, object.__setattr__
        set_(self, "low", as_number(self.low, at / "low"))
        set_(self, "high", as_number(self.high, at / "high"))
        if self.step is not None:
            set_(self, "step", as_number(self.step, at / "step", positive=True))
        as_bool(self.log, at / "log")
        if self.num is not None:
            as_int(self.num, at / "num", minimum=2)
        _check_range(self)
        if self.log and self.step is not None:
            (at / "step").fail(
                f'"step" and "log" exclude each other, got step={self.step!r}',
                'remove "step" (use "num" for log-spaced grid points), or set "log": false',
            )
        if self.step is not None and self.num is not None:
            (at / "num").fail(
                f'"num" and "step" exclude each other, got num={self.num!r}', 'keep one of "num" and "step"'
            )
        _check_count(self)

    @property
    def is_finite(self) -> bool:
        return self.step is not None or self.num is not None

    def _steps(self) -> float:
        """Steps from low to high, as a float: inf when ``high - low`` overflows."""
        if self.step is None:
            raise RuntimeError("hpo internal error: asked of a stepped range only")
        return (self.high - self.low) / self.step * (1 + 1e-9)

    def grid_values(self) -> Sequence[float]:
        step = self.step
        if step is not None:
            count = math.floor(self._steps()) + 1
            return Points(count, lambda k: min(_tidy(self.low + k * step), self.high))
        if self.num is not None:
            return Points(self.num, self._spaced)
        self.loc.fail(
            f"a continuous float range [{self.low!r}, {self.high!r}] has no grid points",
            'add "num": N for N grid points, or "step": S',
        )

    def _spaced(self, k: int) -> float:
        if self.num is None:
            raise RuntimeError("hpo internal error: the points of a range with \"num\" only")
        if k == self.num - 1:
            return self.high  # exact, whatever the rounding on the way
        t = k / (self.num - 1)
        if self.log:
            return _tidy(self.low * (self.high / self.low) ** t)
        return _tidy(self.low + (self.high - self.low) * t)

    def distribution(self) -> FloatDistribution:
        high = self.high if self.step is None else self.grid_values()[-1]
        return FloatDistribution(self.low, high, log=self.log, step=self.step)

    def _form(self) -> dict[str, Any]:
        data = {"type": self.kind, "low": self.low, "high": self.high, "log": self.log}
        extras = {"step": self.step, "num": self.num}
        return data | {key: value for key, value in extras.items() if value is not None}

    def describe(self) -> str:
        return _range_text(self)


_KINDS: dict[str, type[Param]] = {cls.kind: cls for cls in (CategoricalParam, IntParam, FloatParam)}


def parse_param(name: str, value: object, at: Loc | None = None, implied: Condition = ()) -> Param:
    """The parameter ``name`` from its JSON value: a list of choices or an object.
    ``implied`` is the condition of the sub-space it is nested in, if any.

    >>> parse_param("lr", {"type": "float", "low": 1e-4, "high": 0.1, "log": True})
    FloatParam(name='lr', when=(), low=0.0001, high=0.1, step=None, log=True, num=None)
    >>> parse_param("optimizer", ["adam", "sgd"]).choices
    ('adam', 'sgd')
    """
    at = at or Loc() / "space" / str(name)
    if isinstance(value, list):
        return CategoricalParam(name, check_choices(value, at), loc=at, when=implied)
    if not isinstance(value, dict):
        shown = json.dumps(value, default=repr)
        at.expected(
            "a list of choices or a parameter object", value,
            f'write [{shown}] for a single choice, or move the constant to "fixed"',
        )
    if value.get("type") is None:
        listed = ", ".join(f'"{kind}"' for kind in _KINDS)
        (at / "type").fail('missing required key "type"', f'add "type": one of {listed}')
    cls = _KINDS[as_choice(value["type"], at / "type", tuple(_KINDS))]
    own = [f for f in fields(cls) if f.name not in ("name", "loc", "when")]
    as_object(value, at, ["type", *(f.name for f in own), "when"], [f.name for f in own if f.default is MISSING])
    given = {key: item for key, item in value.items() if key not in ("type", "when") and item is not None}
    when = join(implied, parse_when(value.get("when"), at / "when"), at / "when")
    return cls(name, **given, loc=at, when=when)


def parse_when(value: object, at: Loc) -> Condition:
    """A parameter's ``"when"``: ``{"other": value}`` or ``{"other": [values]}``, checked
    for its form here and against the other parameters by ``check_conditions``."""
    if value is None:
        return ()
    value = as_object(value, at)
    if not value:
        at.fail("an empty condition", 'name a parameter and its values, e.g. {"optimizer": "sgd"}, or remove "when"')
    condition = []
    for parent, allowed in sorted(value.items()):
        listed = allowed if isinstance(allowed, list) else [allowed]
        condition.append((parent, check_choices(listed, at / parent)))
    return tuple(condition)
