"""Errors that reach the user.

A :class:`UsageError` is bad input (a space file, a CLI flag, an objective that
cannot be imported). The CLI prints its message and exits with status 2, with
no traceback unless ``--debug`` is given. Everything else is a bug or an
infrastructure fault and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["HpoError", "UsageError", "SpaceError", "EngineError", "EngineLost", "StoreUnavailable",
           "closest"]


class HpoError(Exception):
    """Base class of the errors this package raises on purpose."""


class UsageError(HpoError, ValueError):
    """Bad input from the user; the message says where and how to fix it."""


class SpaceError(UsageError):
    """A search-space file or dict that does not validate.

    Parameters
    ----------
    source:
        Where the space came from: a file path or ``"<dict>"``.
    path:
        JSON path of the offending value, e.g. ``"$.space.learning_rate.low"``.
    problem:
        What is wrong, including the value seen.
    fix:
        What to write instead.
    """

    def __init__(self, source: str, path: str, problem: str, fix: str | None = None) -> None:
        self.source, self.path, self.problem, self.fix = source, path, problem, fix
        message = f"{source}: {path}: {problem}"
        if fix:
            message += f"\n  fix: {fix}"
        super().__init__(message)


class StopRequested(HpoError):
    """A signal asked the master to stop (SIGTERM; SIGUSR1, which SLURM sends
    before the walltime). Raised from the signal handler; the controller then
    lets running trials checkpoint and suspend, and the same command resumes."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class EngineLost(HpoError):
    """The engine lost what runs the tasks (the Dask scheduler died). The
    master exits and leaves every trial as it is: those still running on
    workers finish by themselves (their heartbeat says so), the others are
    resumed by the next run of the same command."""


class StoreUnavailable(HpoError):
    """The study's store cannot be written any more: its file system is full,
    its journal was made read-only, deleted or replaced, or another master
    took the study over. The master stops without recording anything as a
    trial's failure; its message says why and what to do (exit 75)."""


class EngineError(UsageError):
    """The engine cannot run the study as asked (e.g. no worker has a GPU)."""


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word``, for "did you mean" hints, or None."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None
