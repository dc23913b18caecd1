"""What goes wrong when a trial asks for its data."""

from __future__ import annotations

import os
import socket
from typing import Any

from hpo.errors import HpoError, closest

__all__ = ["StagingError", "UnknownDataItem"]


class StagingError(OSError):
    """A node could not stage a data item: its file system is full or not
    writable, ``stage_to`` does not expand there, or the source is gone.

    The node's fault, never the configuration's: a trial that meets it is
    handed back unfinished (as when its disk fills up under it), the master
    stops with this message (exit 75) and the next run resumes the trial.
    An :class:`OSError` with the ``errno`` of the cause, so that code which
    handles file-system errors keeps doing so.
    """

    def __init__(self, err: int, problem: str, fix: str, path: str | os.PathLike[str],
                 host: str | None = None) -> None:
        super().__init__(err, problem, str(path))
        self.problem, self.fix = problem, fix
        self.host = host or socket.gethostname()

    def __str__(self) -> str:
        return f"{self.problem}\n  fix: {self.fix}"

    def __reduce__(self) -> tuple[Any, ...]:  # OSError would rebuild it from (errno, strerror)
        return StagingError, (self.errno, self.problem, self.fix, self.filename, self.host)

    def record(self) -> dict[str, str]:
        """What the trial's run record keeps of it: the master words its stop from it."""
        return {"problem": self.problem, "fix": self.fix, "host": self.host, "path": str(self.filename)}


class UnknownDataItem(HpoError, KeyError):
    """``trial.data_path(name)`` with a name the study's ``data`` section lacks."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(name)
        self.name, self.known = name, known

    def __str__(self) -> str:
        if not self.known:
            return (f"trial.data_path({self.name!r}): this trial has no data items.\n  fix: add "
                    f'"data": {{"items": {{"{self.name}": "/path/to/it"}}}} to the space file, or '
                    f"pass data={{{self.name!r}: '/path/to/it'}} to a Trial built by hand")
        hint = closest(self.name, self.known)
        return (f"trial.data_path({self.name!r}): no data item {self.name!r}; the study's items are "
                f"{', '.join(map(repr, self.known))}.\n  fix: "
                + (f"did you mean {hint!r}?" if hint else 'use one of them, or add it to "data.items"'))
