"""Finding the user's objective from its import reference."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpo.errors import SpaceError, UsageError, closest

Objective = Callable[[dict, Any], Any]


def objective_path(space: str | os.PathLike | None) -> list[str]:
    """The folders an objective module is imported from before the installed
    packages: the space file's folder (a module beside it), then the current
    directory; absolute, so that a worker elsewhere finds the same ones. The
    one rule of ``hpo validate``, ``run``, ``check-resume`` and ``submit``.

    >>> objective_path("<dict>") == [str(Path.cwd().resolve())]
    True
    """
    return list(_folders(os.fspath(space) if space else None, os.getcwd()))


@functools.lru_cache(maxsize=32)
def _folders(space: str | None, cwd: str) -> tuple[str, ...]:
    # Asked for every trial the master makes: the file system once per place.
    folders = [str(Path(space).resolve().parent)] if space and Path(space).is_file() else []
    return tuple(dict.fromkeys([*folders, str(Path(cwd).resolve())]))


def add_to_path(folders: Sequence[str]) -> None:
    """Put ``folders`` first on this process's ``sys.path`` (each once).
    Dask starts its worker processes with their parent's ``sys.path``; the
    processes hpo starts itself get them on ``PYTHONPATH`` (see ``pythonpath``)."""
    missing = [f for f in folders if f not in sys.path]
    sys.path[:0] = missing


def pythonpath(folders: Sequence[str]) -> str:
    """A ``PYTHONPATH`` value: ``folders``, then this process's own PYTHONPATH."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*folders, *inherited]))


# The objective's module this thread is importing (its top level runs meanwhile).
_importing = threading.local()


class StartedAtImport(UsageError):
    """A study or a trial started from the top level of the objective's module."""


def refuse_trials_while_importing(what: str) -> None:
    """Raise UsageError when ``what`` (a study, a trial) would start from the
    top level of an objective's module while hpo imports it: every process
    that runs a trial imports that module again, and would start it again,
    without end."""
    module = getattr(_importing, "module", None)
    if module is not None:
        raise StartedAtImport(
            f"{what} started at the top level of the objective's module {module!r}, while hpo "
            "imported it: every trial's process imports it again, and would start it again.\n"
            f'  fix: in {module}, put that code under `if __name__ == "__main__":`')


def resolve_objective(ref: str | Objective, source: str = "<objective>",
                      path: Sequence[str] | None = None) -> Objective:
    """The callable behind ``"package.module:function"`` (or ``ref`` itself),
    imported with ``path`` first on ``sys.path`` (default: :func:`objective_path`
    of the space file ``source``).

    COMPSs and Dask workers find the objective by importing it, so it travels
    as a reference, not as a pickled closure.

    >>> resolve_objective("hpo.examples.toy:sleep").__name__
    'sleep'
    """
    if callable(ref):
        return ref
    add_to_path(objective_path(source) if path is None else path)
    module_name, _, attr = ref.partition(":")
    outer = getattr(_importing, "module", None)
    _importing.module = outer or module_name
    try:
        module = importlib.import_module(module_name)
    except StartedAtImport:
        raise  # says where and what to change
    except ImportError as exc:
        raise SpaceError(
            source, "$.objective", f"cannot import module {module_name!r} of {ref!r}: {exc}",
            _import_fix(module_name, attr),
        ) from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed (SystemExit: argparse at import)
        raise SpaceError(
            source, "$.objective", f"importing module {module_name!r} of {ref!r} raised {_error_text(exc)}",
            f"fix the module; python -c 'import {module_name}' shows the traceback",
        ) from exc
    finally:
        _importing.module = outer
    function = getattr(module, attr, None)
    if not callable(function):
        meant = closest(attr, [name for name, value in vars(module).items()
                               if callable(value) and not name.startswith("_")])
        raise SpaceError(
            source, "$.objective", f"{module_name!r} has no callable {attr!r}",
            f"did you mean {module_name}:{meant}?" if meant else
            "name a function train(config, trial) defined at module level",
        )
    return function


def _import_fix(module_name: str, attr: str) -> str:
    """The fix for a module that cannot be imported: a file name given for
    the module ("noisy_obj.py:train") is the usual slip."""
    if module_name.endswith(".py"):
        return (f"name the module, not its file: \"{module_name[:-3].replace('/', '.')}:{attr}\" "
                "(without .py)")
    return ("check the module path: hpo imports it from the space file's folder, the "
            "current directory, PYTHONPATH and the installed packages")


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
