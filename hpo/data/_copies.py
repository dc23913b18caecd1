"""The copies of an item on a node, and the leases of the trials reading them.

Each copy has a folder of its own, ``.<name>.copy-<n>``, never reused while
it exists: staging again makes a new one beside the old ones, and the marker
then names it (the link ``<name>`` points to it, for people). A trial reads
the copy that was current when it asked, through a lease: a shared
``flock`` on the copy's folder, which the kernel drops when the process
ends. A copy other than the current one is removed once an exclusive lock on
it can be had, that is once no trial reads it: a trial's path and the files
it opens stay valid until it lets go, whatever is staged meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from hpo.data._marker import read_marker

__all__ = ["Lease", "lease", "hold", "copy_name", "next_copy", "point_link", "lock_path", "sweep",
           "sweep_unlocked", "clear_leftovers"]


def copy_name(name: str, number: int) -> str:
    """The folder of copy ``number`` of ``name``: ``.<name>.copy-<number>``."""
    return f".{name}.copy-{number}"


def lock_path(folder: Path, name: str) -> Path:
    """The node's lock of the item ``name`` (taken to stage or to remove its copies)."""
    return folder / f".{name}.lock"


class Lease:
    """A trial's hold on one copy: the copy stays while the lease is held.
    :meth:`release` lets it go, and removes the item's copies no trial
    reads any more (when no other trial of the node is staging it)."""

    def __init__(self, folder: Path, name: str, copy: Path, handle: int) -> None:
        self.folder, self.name, self.copy = folder, name, copy
        self._handle: int | None = handle

    def release(self) -> None:
        if self._handle is None:
            return
        os.close(self._handle)  # drops the shared lock
        self._handle = None
        try:
            sweep(self.folder, self.name)
        except OSError:
            pass  # the study's end removes what remains


def lease(folder: Path, name: str, copy: str) -> Lease | None:
    """A lease on the copy ``folder/copy`` of ``name``; None when it is gone
    (removed, or being removed: it is renamed away before its files go)."""
    path = folder / copy
    try:
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_SH)  # a remover holds it only while renaming it away
        opened, there = os.fstat(handle), os.stat(path)
        if (opened.st_dev, opened.st_ino) == (there.st_dev, there.st_ino):
            return Lease(folder, name, path, handle)
    except FileNotFoundError:
        pass
    except BaseException:
        os.close(handle)
        raise
    os.close(handle)
    return None


def hold(folder: Path, name: str, made: Path, copy: Path) -> Lease:
    """A lease on the folder ``made``, a copy no one else can see yet, that
    its maker renames to ``copy`` (the lock follows the folder)."""
    handle = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(handle, fcntl.LOCK_SH)
    return Lease(folder, name, copy, handle)


def next_copy(folder: Path, name: str) -> str:
    """A folder name for a new copy of ``name``: one past every existing copy's."""
    numbers = [int(match.group(1)) for match in map(_copy_pattern(name).fullmatch, _entries(folder)) if match]
    return copy_name(name, max(numbers, default=0) + 1)


def point_link(folder: Path, name: str, copy: str) -> None:
    """Point the link ``<name>`` at ``copy``, atomically (replaced, never absent)."""
    link = folder / f".{name}.link-{socket.gethostname()}-{os.getpid()}"
    link.unlink(missing_ok=True)
    os.symlink(copy, link)
    os.replace(link, folder / name)


def sweep(folder: Path, name: str) -> None:
    """Remove the copies of ``name`` that are neither current nor read, if
    the item's lock is free (its holder stages, and sweeps after)."""
    try:
        handle = os.open(lock_path(folder, name), os.O_RDWR)
    except FileNotFoundError:
        return  # nothing staged here
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        sweep_unlocked(folder, name)
    finally:
        os.close(handle)


def sweep_unlocked(folder: Path, name: str) -> None:
    """:func:`sweep`, by the holder of the item's lock."""
    marked = read_marker(folder / f".{name}.staged")
    current = marked.copy if marked else None
    pattern = _copy_pattern(name)
    for entry in _entries(folder):
        if pattern.fullmatch(entry) and entry != current:
            _remove_unread(folder, name, entry)


def clear_leftovers(folder: Path, name: str) -> None:
    """By the holder of the item's lock: remove what dead copiers and
    removers left, and a ``<name>`` folder of an earlier layout (a copy in
    place, which a link replaces)."""
    for entry in _entries(folder):
        if entry.startswith((f".{name}.tmp-", f".{name}.removing-", f".{name}.link-")):
            _remove(folder / entry)
    plain = folder / name
    if plain.is_dir() and not plain.is_symlink():
        doomed = folder / f".{name}.removing-{socket.gethostname()}-{os.getpid()}"
        os.rename(plain, doomed)
        _remove(doomed)


def _remove_unread(folder: Path, name: str, copy: str) -> None:
    """Remove the copy ``folder/copy`` unless a trial holds a lease on it."""
    with _exclusive(folder / copy) as held:
        if not held:
            return  # read: the last of its readers removes it
        doomed = folder / f".{name}.removing-{socket.gethostname()}-{os.getpid()}"
        try:
            os.rename(folder / copy, doomed)  # a reader that waited finds it gone
        except OSError:
            return  # left for the study's end
    _remove(doomed)


@contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Whether an exclusive lock on the folder ``path`` was had at once."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        yield False
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(handle)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(FileNotFoundError):
            path.unlink()


def _entries(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _copy_pattern(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(f".{name}.copy-") + r"(\d+)")
