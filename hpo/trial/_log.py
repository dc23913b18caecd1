"""A trial's log: what its objective prints, kept in the run directory.

``trials/<n>/output.log`` collects the objective's standard output and error
(``print``, Keras' progress, warnings) for every attempt and segment, each
under a header line, and the traceback of a failure. The output still goes
where it went before (the worker's log, the terminal).

The file, and the trial's folder, are made at a first attempt's first line
of output: a trial that prints nothing costs the file system nothing (a
folder and a file made per trial are most of a short trial's own cost, and
on a shared file system each is a round trip to its metadata server). The
header keeps the time the attempt began. A resumed, time-shared or isolated
attempt writes its header at its start: where it went on, and in which
process, is its story in the log.

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

__all__ = ["LOG_NAME", "TrialLog", "trial_log", "log_header", "log_path"]

LOG_NAME = "output.log"

_logs: dict[int, TrialLog] = {}  # thread id -> the log of the trial it runs
_lock = threading.Lock()


def log_path(checkpoint_dir: str | Path) -> Path:
    """Where the log of the trial with this checkpoint directory is."""
    return Path(checkpoint_dir) / LOG_NAME


@contextmanager
def trial_log(checkpoint_dir: str | Path, header: str | None = None) -> Iterator[TrialLog]:
    """Copy this thread's writes to ``sys.stdout``/``sys.stderr`` into the
    trial's log while the block runs; yields the log (for the traceback).
    Its header line comes first: ``header``, or :func:`log_header` once the
    caller knows it (nothing is written meanwhile)."""
    log = TrialLog(log_path(checkpoint_dir))
    try:
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
    finally:
        log.close()


def log_header(log: TrialLog, header: str, at_once: bool = True) -> None:
    """The line that opens an attempt's part of the log, stamped now:
    written now, or (``at_once`` false) before the attempt's first output."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    log.head(f"--- {header}, {socket.gethostname()}, {stamp} ---\n")
    if at_once:
        log.make()


class TrialLog:
    """A trial's log file, opened for appending at its first write (its
    folder made then too); until then nothing exists on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._header = ""
        self.closed = False

    def head(self, line: str) -> None:
        """Write ``line`` before the first output (at once, if there was some)."""
        if self._file is None:
            self._header = line
        else:
            self._file.write(line)

    def write(self, text: str) -> int:
        return self._opened().write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def make(self) -> None:
        """Make the file now, with its header."""
        self._opened()

    def fileno(self) -> int:
        """The file's descriptor (faulthandler writes there): opens it."""
        return self._opened().fileno()

    def close(self) -> None:
        self.closed = True
        if self._file is not None:
            self._file.close()

    def _opened(self) -> TextIO:
        if self._file is None:
            if self.closed:
                raise ValueError(f"write to the closed log {self.path}")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")
            self._file.write(self._header)
        return self._file


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
