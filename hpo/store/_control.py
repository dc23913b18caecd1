"""The study's decisions in a file, for trial processes that cannot reach the relay.

``control.json`` in the run directory holds what the relay would answer:
the study's stop, the contender of time-shared trials, the GPU counts the
master grows trials to, and the trials its pruner found hopeless. The relay
rewrites it atomically whenever one of them changes; a trial process that
appends to the journal directly (its node cannot open a connection to the
master's, or the relay is gone) reads it at most every ``FRESH_S`` instead of
an answer, and never reads the journal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hpo.store._files import write_atomically
from hpo.store._protocol import Decision

__all__ = ["CONTROL_FILE", "ControlFile", "FRESH_S"]

CONTROL_FILE = "control.json"
FRESH_S = 0.2
_VERSION = 1


class ControlFile:
    """The control file at ``path``: written by the relay, read by trials."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._written: Any = None
        self._read: tuple[float, dict[str, Any]] = (-float("inf"), {})
        self._stamp: tuple[int, int] | None = None

    def write(self, epoch: int, decisions: dict[str, Any]) -> bool:
        """Rewrite the file when ``decisions`` changed (stop, contender,
        resize, prune); False when it was not written (unchanged, or the
        directory is not writable: trials on the relay do not need it)."""
        content = {"v": _VERSION, "epoch": epoch, **decisions}
        if content == self._written:
            return False
        try:
            write_atomically(self.path, json.dumps(content))
        except OSError:
            return False
        self._written = content
        return True

    def decision(self, trial_id: int) -> Decision:
        """What trial ``trial_id`` must do, as the file last said (read at
        most every ``FRESH_S``; an absent or unreadable file says nothing)."""
        content = self._content()
        contender = content.get("contender")
        return Decision(stop=content.get("stop"),
                        prune=(content.get("prune") or {}).get(str(trial_id)),
                        resize=(content.get("resize") or {}).get(str(trial_id)),
                        contender=None if contender is None else float(contender))

    def _content(self) -> dict[str, Any]:
        read_at, content = self._read
        now = time.monotonic()
        if now - read_at < FRESH_S:
            return content
        try:
            info = self.path.stat()
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                loaded = json.loads(self.path.read_text())
                content = loaded if isinstance(loaded, dict) and loaded.get("v") == _VERSION else {}
                self._stamp = stamp
        except (OSError, ValueError):
            content = {}
        self._read = (now, content)
        return content

