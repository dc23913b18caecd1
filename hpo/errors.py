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
           "SameFailure", "closest"]


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


class SameFailure(UsageError):
    """The first trials of a study all failed the same way (:mod:`hpo.master`):
    the space or the objective is wrong; the study stopped (exit 2)."""


class EngineError(UsageError):
    """The engine cannot run the study as asked (e.g. no worker has a GPU)."""


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word``, for "did you mean" hints, or None.

    Among the similar candidates, the fewest typing slips wins (a swapped
    pair of letters is one slip), so a transposition beats a look-alike:

    >>> closest("lgo", ["low", "high", "log", "step"]), closest("hgih", ["low", "high"])
    ('log', 'high')
    >>> closest("serach", ["search", "space"]), closest("zzz", ["low"]) is None
    ('search', True)
    """
    similar = difflib.get_close_matches(word, list(candidates), n=10, cutoff=0.6)
    # get_close_matches lists the most similar first: min keeps that order on ties.
    return min(similar, key=lambda c: _slips(word.lower(), c.lower()), default=None)


def _slips(a: str, b: str) -> int:
    """Edits from ``a`` to ``b``: insertions, deletions, substitutions and
    swaps of two neighbouring letters (optimal string alignment distance)."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]
