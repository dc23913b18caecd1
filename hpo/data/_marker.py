"""What a copy was made from: the source's state, and the marker that
records it beside a complete copy.

The marker is written last, after the copy is renamed into place: a copy
without one is torn (its copier died) and never used. It holds the source's
identity (sizes, modification times and inodes of every file, hashed), so a
source changed since is staged again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["SourceState", "state_of", "read_marker", "write_marker", "fsync_folder"]


@dataclass(frozen=True)
class SourceState:
    """A source as a copy of it must match. ``fingerprint`` hashes every
    file's path, size, modification time and inode: metadata only, read
    with one ``stat`` per file, never the bytes."""

    path: str
    kind: str  # "file" or "directory"
    files: int
    directories: int
    bytes: int
    fingerprint: str


def state_of(source: Path) -> SourceState:
    """The state of ``source`` now; FileNotFoundError when it is gone."""
    digest = hashlib.sha256()
    top = source.stat()  # follows a link to the source, as the copy does
    if not stat.S_ISDIR(top.st_mode):
        _add(digest, ".", top)
        return SourceState(str(source), "file", 1, 0, top.st_size, digest.hexdigest())
    files = directories = size = 0
    _add(digest, ".", top)
    for root, dirs, names in os.walk(source):
        dirs.sort()
        relative = os.path.relpath(root, source)
        for name in sorted(names):
            info = os.stat(os.path.join(root, name))
            _add(digest, os.path.join(relative, name), info)
            files, size = files + 1, size + info.st_size
        directories += len(dirs)
    return SourceState(str(source), "directory", files, directories, size, digest.hexdigest())


def _add(digest: Any, relative: str, info: os.stat_result) -> None:
    digest.update(f"{relative}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}\n".encode())


def read_marker(path: Path) -> SourceState | None:
    """The state recorded in the marker at ``path``; None when there is none
    (or it is unreadable: the copy is then made again)."""
    try:
        recorded = json.loads(path.read_text())
        return SourceState(**{k: recorded[k] for k in SourceState.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(path: Path, state: SourceState, **details: Any) -> None:
    """Record ``state`` at ``path`` atomically (written beside, fsync'd, renamed)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(partial, "w", encoding="utf-8") as out:
        json.dump({**asdict(state), **details, "staged_at": time.time()}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename into it) survive a crash."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
