"""A trial's log: what its objective prints, kept in the run directory.

``trials/<n>/output.log`` collects the objective's standard output and error
(``print``, Keras' progress, warnings) for every attempt and segment, each
under a header line, and the traceback of a failure. The output still goes
where it went before (the worker's log, the terminal).

Worker processes run several trials over their life, and the inline engine
runs them in a thread of the master: the capture follows the thread that
runs the objective, not the process.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

__all__ = ["LOG_NAME", "trial_log", "log_header", "log_path"]

LOG_NAME = "output.log"

_logs: dict[int, TextIO] = {}  # thread id -> the open log of the trial it runs
_lock = threading.Lock()


def log_path(checkpoint_dir: str | Path) -> Path:
    """Where the log of the trial with this checkpoint directory is."""
    return Path(checkpoint_dir) / LOG_NAME


@contextmanager
def trial_log(checkpoint_dir: str | Path, header: str | None = None) -> Iterator[TextIO]:
    """Copy this thread's writes to ``sys.stdout``/``sys.stderr`` into the
    trial's log while the block runs; yields the log (for the traceback).
    Its header line comes first: ``header``, or :func:`log_header` once the
    caller knows it (nothing is written meanwhile)."""
    path = log_path(checkpoint_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        if header is not None:
            log_header(log, header)
        with _lock:
            _install()
            _logs[threading.get_ident()] = log
        try:
            yield log
        finally:
            with _lock:
                del _logs[threading.get_ident()]


def log_header(log: TextIO, header: str) -> None:
    """The line that opens an attempt's part of the log."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    log.write(f"--- {header}, {socket.gethostname()}, {stamp} ---\n")


class _Tee:
    """Stands in for ``sys.stdout``/``sys.stderr``: a write from a thread with
    a trial log open goes to that log too."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._reader_gone = False

    def write(self, text: str) -> int:
        log = _logs.get(threading.get_ident())
        if log is not None and not log.closed:
            log.write(text)
        if self._reader_gone:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:  # `hpo run | tee` and tee gone (Ctrl-C): the log has it
            self._reader_gone = True
            return len(text)

    def flush(self) -> None:
        if self._reader_gone:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone = True

    def __getattr__(self, name: str):  # isatty, fileno, encoding...: the real stream's
        return getattr(self._stream, name)


def _install() -> None:
    """Wrap the process's streams once (the wrappers stay: other code may
    have taken a reference to them since)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Tee):
            setattr(sys, name, _Tee(stream))
