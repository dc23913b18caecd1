"""An objective that ends the process it runs in, when that process is the
master's (``--engine inline``).

An objective that calls ``os._exit`` or crashes in native code ends the
master with it, and would end every run of the study; an out-of-memory kill
or a preemption (SIGKILL from outside) ends the master too, and is no fault
of the trial. The two are told apart by what the attempt leaves in its
trial's log: while the objective runs inside the master, an ``os._exit``
from its thread says so there first, and a fatal signal (SIGSEGV, SIGABRT,
SIGBUS, SIGFPE, SIGILL) has :mod:`faulthandler` write its traceback there.
A kill from outside leaves nothing. The attempt's run record says where its
output begins in the log (:func:`log_start`); the next master reads from
there (:func:`ended_the_interpreter`).
"""

from __future__ import annotations

import faulthandler
import io
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from hpo.trial._log import TrialLog, log_path

__all__ = ["ENDED_LINE", "log_start", "guarding_the_master", "ended_the_interpreter"]

#: The line an objective's ``os._exit`` inside the master leaves in its log.
ENDED_LINE = "hpo: the objective ended the interpreter:"
_FATAL_LINE = "Fatal Python error: "  # faulthandler's first line
_TAIL_BYTES = 64 << 10  # the process ended right after: its last words are at the end

_real_exit = os._exit
_logs: dict[int, TrialLog] = {}  # thread id -> the log of the objective it runs inside the master


def log_start(checkpoint_dir: str) -> list[Any]:
    """Where an attempt's output will begin: the trial log's path and size."""
    path = log_path(checkpoint_dir)
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return [str(path), size]


@contextmanager
def guarding_the_master(log: TrialLog) -> Iterator[None]:
    """While the block runs an objective in the master's own process, an end
    of the process by the objective's hand is written to its ``log``."""
    if os._exit is not _exit:
        # Installed once, for the master's life: code holding the old reference still exits.
        os._exit = _exit
    was_enabled = faulthandler.is_enabled()
    log.flush()
    _enable_faulthandler(log)
    _logs[threading.get_ident()] = log
    try:
        yield
    finally:
        del _logs[threading.get_ident()]
        faulthandler.disable()
        if was_enabled:
            _enable_faulthandler(sys.stderr)


def _enable_faulthandler(file: Any) -> None:
    """faulthandler on ``file`` where it has a file descriptor (a captured
    stderr, as under pytest, has none: then fatal signals go unwritten)."""
    try:
        faulthandler.enable(file=file, all_threads=False)
    except (io.UnsupportedOperation, AttributeError, ValueError, OSError):
        pass


def _exit(status: int) -> NoReturn:
    """``os._exit``, saying first in the trial's log that the objective called it."""
    log = _logs.get(threading.get_ident())
    if log is not None:
        try:
            log.write(f"{ENDED_LINE} os._exit({status})\n")
            log.flush()
            os.fsync(log.fileno())
        except (OSError, ValueError):
            pass  # a full disk or a closed log: the process ends anyway
    _real_exit(status)


def ended_the_interpreter(run: Mapping[str, Any]) -> str | None:
    """How the attempt of the run record ``run`` ended the master's process
    by its objective's own hand, as its log says; None when it did not say
    (killed from outside, or it did not run inside the master)."""
    where = run.get("log_at")
    if not where:
        return None
    path, start = where
    try:
        with open(Path(path), "rb") as log:
            end = log.seek(0, os.SEEK_END)
            log.seek(max(int(start), end - _TAIL_BYTES))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        if line.startswith(ENDED_LINE):
            return line[len(ENDED_LINE):].strip()
        if line.startswith(_FATAL_LINE):
            return line.strip()
    return None
