"""Staging one item on this node: copied once, by whichever trial asks first.

On the node, under ``<stage_to>/hpo-<study>/``::

    <name>/<source's name>   the copy, complete (renamed into place)
    .<name>.staged           its marker: what it was copied from (written last)
    .<name>.lock             the node's lock for the item (flock)
    .<name>.tmp-<host>-<pid> a copy being made (a dead copier's is removed)
    staged.log               a line per copy made on this node

A trial that finds a current marker uses the copy without locking. Otherwise
it takes the item's lock (``flock``: the kernel drops it with a dead
holder), looks again (the trial it waited for may have made the copy), and
makes the copy: a temporary name, every file fsync'd, renamed into place,
the marker written last. Item names never start with a dot, so nothing of
hpo's can be taken for an item.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpo.data._copy import Progress, copy_source, mib
from hpo.data._errors import StagingError
from hpo.data._expand import UnsetVariable, expand_variables
from hpo.data._marker import SourceState, fsync_folder, read_marker, state_of, write_marker
from hpo.data._room import check_room, full
from hpo.data._section import study_folder_name

__all__ = ["stage", "node_folder", "STAGED_LOG"]

STAGED_LOG = "staged.log"
_WRITE_FAULTS = (errno.ENOSPC, errno.EDQUOT)


def node_folder(stage_to: str, study: str) -> Path:
    """This node's folder for the study's copies: ``stage_to`` expanded here."""
    fix = 'set it in the environment of every worker, or give "data.stage_to" a fallback: "${NAME:-/tmp}"'
    try:
        expanded = expand_variables(stage_to)
    except UnsetVariable as unset:
        raise StagingError(errno.EINVAL, f'"data.stage_to" {stage_to!r}: ${unset.args[0]} is not '
                           f"set on this node", fix.replace("NAME", unset.args[0]), stage_to) from None
    if not os.path.isabs(expanded):
        raise StagingError(errno.EINVAL, f'"data.stage_to" {stage_to!r} expands to {expanded!r} on '
                           "this node, a relative path", "make the variable an absolute path", stage_to)
    return Path(expanded) / study_folder_name(study)


def stage(name: str, source: str | os.PathLike[str], folder: Path) -> Path:
    """The path of this node's complete, current copy of ``source`` (the
    item ``name``) in ``folder``, made now if there is none.

    Raises :class:`StagingError` when the source cannot be read here or the
    copy cannot be made (no room: checked before copying).
    """
    source = Path(source)
    state = _state(name, source)
    copy = folder / name / source.name
    if _current(folder, name, state):
        return copy
    _make(folder, source)
    with _node_lock(folder, name):
        if not _current(folder, name, state):  # the trial waited for may have made it
            _replace(folder, name, source, state)
    return copy


def _state(name: str, source: Path) -> SourceState:
    try:
        return state_of(source)
    except OSError as exc:
        raise _state_error(name, source, exc) from None


def _state_error(name: str, source: Path, exc: OSError) -> StagingError:
    return StagingError(exc.errno or errno.EIO, f"cannot stage {name!r}: its source {source} "
                        f"cannot be read on this node ({exc.strerror or exc})",
                        "mount the shared file system on every node, or restore the source", source)


def _current(folder: Path, name: str, state: SourceState) -> bool:
    return read_marker(folder / f".{name}.staged") == state and (folder / name).is_dir()


def _make(folder: Path, source: Path) -> None:
    if folder.resolve().is_relative_to(source.resolve()):
        raise StagingError(errno.EINVAL, f"the staging folder {folder} is inside the source {source}",
                           '"data.stage_to" must be a folder outside the data, on the node', folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(folder, exc) from None


@contextmanager
def _node_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold the item's lock on this node, telling the user while it waits."""
    try:
        handle = os.open(folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o664)
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"hpo: staging {name!r}: waiting for the copy another trial on this node makes",
                  file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def _replace(folder: Path, name: str, source: Path, state: SourceState) -> None:
    """Under the item's lock: drop what is there (stale, torn), check the
    room, copy, rename into place, mark."""
    _discard(folder, name)
    check_room(folder, name, state)
    temporary = folder / f".{name}.tmp-{socket.gethostname()}-{os.getpid()}"
    progress = Progress(name, state.bytes)
    progress.say(f"copying {mib(state.bytes)} ({state.files} files) from {source} to {folder}")
    try:
        temporary.mkdir()
        copy_source(source, temporary / source.name, progress)
        os.rename(temporary, folder / name)
        fsync_folder(folder)
        write_marker(folder / f".{name}.staged", state, host=socket.gethostname(), pid=os.getpid())
    except OSError as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        if exc.errno in _WRITE_FAULTS:
            raise full(folder, name, state.bytes) from None
        if str(exc.filename or "").startswith(str(source)):  # the source, not the node
            raise _state_error(name, source, exc) from None
        raise _unwritable(folder, exc) from None
    seconds = time.monotonic() - progress.started
    progress.say(f"staged in {seconds:.1f} s ({progress.rate()}): {folder / name / source.name}")
    _log(folder, {"name": name, "source": str(source), "bytes": state.bytes, "files": state.files,
                  "seconds": round(seconds, 3), "host": socket.gethostname(), "pid": os.getpid(),
                  "at": time.time()})


def _discard(folder: Path, name: str) -> None:
    """Remove an earlier copy of ``name``, its marker and any copy a dead
    copier left (only the lock's holder copies, so none is in progress)."""
    (folder / f".{name}.staged").unlink(missing_ok=True)
    for leftover in [folder / name, *folder.glob(f".{name}.tmp-*")]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        elif leftover.exists() or leftover.is_symlink():
            leftover.unlink()


def _log(folder: Path, entry: dict[str, object]) -> None:
    """One line per copy made on this node: what ``hpo`` copied, and when."""
    try:
        with open(folder / STAGED_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
    except OSError:
        pass  # a record for people: the copy itself is done and marked


def _unwritable(folder: Path, exc: OSError) -> StagingError:
    return StagingError(exc.errno or errno.EIO, f"cannot write the staging folder {folder} on this "
                        f"node ({exc.strerror or exc})",
                        'point "data.stage_to" at a node-local folder this user can write on every '
                        "node", folder)
