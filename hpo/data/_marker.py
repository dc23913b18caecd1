"""What a copy was made from: the source's state, and the marker that
records it beside a complete copy.

The marker is written last, after the copy is renamed into place: a copy
no marker names is torn (its copier died) or old, and never used by a new
trial. It holds the source's identity (sizes, modification times and inodes
of every file, hashed), so a source changed since is staged again, and the
name of the copy's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["SourceState", "Marked", "state_of", "read_marker", "write_marker", "fsync_folder"]


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


class Marked(NamedTuple):
    """What a marker records: the source's state and the folder of its copy
    (None in a marker written before each copy had a folder of its own)."""

    state: SourceState
    copy: str | None


def read_marker(path: Path) -> Marked | None:
    """What the marker at ``path`` records; None when there is none (or it
    is unreadable: the copy is then made again)."""
    try:
        recorded = json.loads(path.read_text())
        state = SourceState(**{k: recorded[k] for k in SourceState.__dataclass_fields__})
        copy = recorded.get("copy")
        return Marked(state, copy if isinstance(copy, str) else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_marker(path: Path, state: SourceState, copy: str, **details: Any) -> None:
    """Record ``state`` and its copy's folder ``copy`` at ``path``
    atomically (written beside, fsync'd, renamed)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(partial, "w", encoding="utf-8") as out:
        json.dump({**asdict(state), "copy": copy, **details, "staged_at": time.time()}, out)
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
