"""Writing a small file so that a crash leaves the old one or the new one."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

from hpo.errors import StoreUnavailable

__all__ = ["write_atomically", "process_alive", "unwritable", "MACHINE_FAULTS", "PRIVATE_FILE",
           "PRIVATE_DIR"]

# A study's files and its run directory are its owner's alone: the study's
# results are private, and a store others could read or write would let
# them read or poison it (docs/guide/security.md).
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700

# What a write meets when the file system is the problem, not the caller:
# full, over its quota, or read-only.
MACHINE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data``: written beside it, fsync'd, renamed over
    it, and the directory fsync'd so that the rename itself survives a crash.
    The file is readable and writable by its owner only (``PRIVATE_FILE``).

    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp(), "study.json")
    >>> write_atomically(target, '{"a": 1}')
    >>> target.read_text(), oct(target.stat().st_mode & 0o777)
    ('{"a": 1}', '0o600')
    """
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Owner only, from creation on: what a study writes is its owner's
    # (hpo.store._run_dir says why).
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE), "wb") as f:
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
    return _state(pid) != b"Z"  # a zombie is dead: only its parent has not reaped it yet


def process_stopped(pid: Any) -> bool:
    """Whether process ``pid`` of this host is stopped (SIGSTOP, Ctrl-Z, a
    debugger), as ``/proc`` says; False when unknown."""
    return _state(pid) in (b"T", b"t")


def _state(pid: Any) -> bytes | None:
    """Process ``pid``'s state letter, as ``/proc`` says; None when unknown."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0]  # after the command's name
    except (OSError, ValueError, IndexError, TypeError):
        return None


def unwritable(path: str | os.PathLike[str], err: int | None, why: str) -> StoreUnavailable:
    """What a write to ``path`` that failed with ``err`` means, in the words
    a user acts on: the file system, and what to do."""
    mount = mount_point(Path(path))
    if err in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(mount).free if mount.exists() else 0
        return StoreUnavailable(
            f"{path}: the file system holding the study is full ({mount}: {free / 2**20:.1f} MiB "
            f"free; {why}). Nothing was recorded as a trial's failure.\n  fix: free space on "
            f"{mount} (or give the study another file system: --runs-dir), then run the same "
            "command again: the trials cut short resume from their checkpoints")
    if err in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StoreUnavailable(
            f"{path}: cannot be written any more ({why}: the file or {mount} was made read-only). "
            "Nothing was recorded as a trial's failure.\n  fix: make it writable again, then run "
            "the same command again: the trials cut short resume from their checkpoints")
    return StoreUnavailable(f"{path}: the study's store cannot be written ({why}).\n  fix: repair "
                            "what failed, then run the same command again")


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path``."""
    path = path.resolve()
    while not os.path.ismount(path) and path.parent != path:
        path = path.parent
    return path
