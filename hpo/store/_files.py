"""Writing a small file so that a crash leaves the old one or the new one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["write_atomically", "process_alive"]


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data``: written beside it, fsync'd, renamed over
    it, and the directory fsync'd so that the rename itself survives a crash.

    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp(), "study.json")
    >>> write_atomically(target, '{"a": 1}')
    >>> target.read_text()
    '{"a": 1}'
    """
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(partial, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def process_alive(pid: Any) -> bool:
    """Whether process ``pid`` of this host is alive; True when unknown (not an int)."""
    if not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
