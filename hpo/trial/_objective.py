"""Finding the user's objective from its import reference."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hpo.errors import SpaceError, UsageError

Objective = Callable[[dict, Any], Any]


def resolve_objective(ref: str | Objective, source: str = "<objective>") -> Objective:
    """The callable behind ``"package.module:function"`` (or ``ref`` itself).

    COMPSs and Dask workers find the objective by importing it, so it travels
    as a reference, not as a pickled closure.

    >>> resolve_objective("hpo.examples.toy:sleep").__name__
    'sleep'
    """
    if callable(ref):
        return ref
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpaceError(
            source, "$.objective", f"cannot import module {module_name!r} of {ref!r}: {exc}",
            "check the module path, and that its package is installed or on PYTHONPATH",
        ) from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed (SystemExit: argparse at import)
        raise SpaceError(
            source, "$.objective", f"importing module {module_name!r} of {ref!r} raised {_error_text(exc)}",
            f"fix the module; python -c 'import {module_name}' shows the traceback",
        ) from exc
    function = getattr(module, attr, None)
    if not callable(function):
        raise SpaceError(
            source, "$.objective", f"{module_name!r} has no callable {attr!r}",
            "name a function train(config, trial) defined at module level",
        )
    return function


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):  # its str() shows the file's base name only
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}"


def reference_of(objective: str | Objective) -> str:
    """A printable name for an objective (its import reference when it has one)."""
    if isinstance(objective, str):
        return objective
    return f"{objective.__module__}:{getattr(objective, '__qualname__', repr(objective))}"


def preflight(objective: Objective, fixed: dict[str, Any], source: str = "<objective>") -> None:
    """Run the objective's own check before any trial starts, where it has one.

    An objective may carry ``train.preflight = check``: ``check(fixed)``
    receives the study's fixed values and raises (``FileNotFoundError``,
    ``ValueError``...) when no trial could run, e.g. its data is missing. The
    study then stops once, before any task, with that message (exit 2),
    instead of failing every trial with it.
    """
    check = getattr(objective, "preflight", None)
    if not callable(check):
        return
    try:
        check(dict(fixed))
    except (Exception, SystemExit) as exc:
        raise UsageError(f"{source}: the objective {reference_of(objective)} cannot run: "
                         f"{_error_text(exc)}") from None
