"""Whether a node's file system has room for a copy, asked before copying."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import NamedTuple

from hpo.data._copy import mib
from hpo.data._errors import StagingError
from hpo.data._marker import SourceState

__all__ = ["FreeSpace", "free_space", "check_room", "full", "file_system"]


class FreeSpace(NamedTuple):
    """What a file system can still take: bytes, its block size, and inodes
    (None where it does not count them)."""

    bytes: int
    block: int
    inodes: int | None


def free_space(folder: Path) -> FreeSpace:
    """The room left, for this user, on the file system holding ``folder``."""
    info = os.statvfs(folder)
    block = info.f_frsize or info.f_bsize
    return FreeSpace(info.f_bavail * block, block, info.f_favail if info.f_files else None)


def check_room(folder: Path, name: str, state: SourceState) -> None:
    """Refuse a copy of ``state`` into ``folder`` that its file system cannot
    hold (bytes, rounded up to its blocks, or inodes)."""
    room = free_space(folder)
    entries = state.files + state.directories + 1
    needed = state.bytes + entries * room.block  # each entry wastes less than a block
    if needed > room.bytes or (room.inodes is not None and entries > room.inodes):
        raise full(folder, name, needed, room.bytes)


def full(folder: Path, name: str, needed: int, free: int | None = None) -> StagingError:
    """The error of a copy of ``needed`` bytes that ``folder`` cannot hold."""
    free = free_space(folder).bytes if free is None else free
    where = file_system(folder)
    return StagingError(
        errno.ENOSPC,
        f"cannot stage {name!r} in {folder}: the file system {where} has {mib(free)} free "
        f"({free:,} bytes), the copy needs {mib(needed)} ({needed:,} bytes)",
        f'free space on {where.split(" ")[0]}, or point "data.stage_to" at a node-local file '
        "system with room for the data (it is checked on every node)",
        folder)


def file_system(path: Path) -> str:
    """``"<mount point> (<type>)"`` of the file system holding ``path``."""
    mount = path.resolve()
    while not os.path.ismount(mount) and mount.parent != mount:
        mount = mount.parent
    kind = "?"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 2 and fields[1].replace("\\040", " ") == str(mount):
                    kind = fields[2]  # the last one listed is the one mounted on top
    except OSError:
        pass
    return f"{mount} ({kind})"
