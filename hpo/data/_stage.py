"""Staging one item on this node: copied once, by whichever trial asks first.

On the node, under ``<stage_to>/hpo-<study>/``::

    .<name>.copy-<n>/<source's name>  a complete copy (renamed into place)
    <name>                   a link to the current copy, for people
    .<name>.staged           its marker: what it was copied from, and which copy (written last)
    .<name>.lock             the node's lock for the item (flock)
    .<name>.tmp-<host>-<pid> a copy being made (a dead copier's is removed)
    staged.log               a line per copy made on this node (before its marker)

A trial that finds a current marker uses the copy it names without locking.
Otherwise it takes the item's lock (``flock``: the kernel drops it with a
dead holder), looks again (the trial it waited for may have made the copy),
and makes a new copy beside the others: a temporary name, every file
fsync'd, renamed into a folder of its own, the marker written last. A trial
reads the copy it was given until it ends (a lease: see ``_copies``), so a
source changed meanwhile never takes its files away; older copies go when
their last reader lets go. Item names never start with a dot, so nothing of
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
from contextlib import contextmanager, suppress
from pathlib import Path

from hpo.data._copies import (
    Lease,
    clear_leftovers,
    hold,
    lease,
    lock_path,
    next_copy,
    point_link,
    sweep,
    sweep_unlocked,
)
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


def stage(name: str, source: str | os.PathLike[str], folder: Path,
          held: list[Lease] | None = None) -> Path:
    """The path of this node's complete, current copy of ``source`` (the
    item ``name``) in ``folder``, made now if there is none.

    The copy stays, whatever is staged later, while its lease is held:
    appended to ``held`` (release it when done reading), or, without
    ``held``, until this process ends.

    Raises :class:`StagingError` when the source cannot be read here or the
    copy cannot be made (no room: checked before copying).
    """
    source = Path(source)
    state = _state(name, source)
    leased = _current(folder, name, state)
    if leased is None:
        _make(folder, source)
        with _node_lock(folder, name):
            # The trial waited for may have made it.
            leased = _current(folder, name, state) or _replace(folder, name, source, state)
    elif _others(folder, name):
        sweep(folder, name)  # older copies whose readers are gone
    _hold(leased, held)
    return leased.copy / source.name


# Leases taken without a holder: kept until the process ends, one per copy.
_PROCESS_LEASES: dict[Path, Lease] = {}


def _hold(leased: Lease, held: list[Lease] | None) -> None:
    if held is not None:
        held.append(leased)
    elif _PROCESS_LEASES.setdefault(leased.copy, leased) is not leased:
        leased.release()  # this process holds that copy already


def _state(name: str, source: Path) -> SourceState:
    try:
        return state_of(source)
    except OSError as exc:
        raise _state_error(name, source, exc) from None


def _state_error(name: str, source: Path, exc: OSError) -> StagingError:
    return StagingError(exc.errno or errno.EIO, f"cannot stage {name!r}: its source {source} "
                        f"cannot be read on this node ({exc.strerror or exc})",
                        "mount the shared file system on every node, or restore the source", source)


def _current(folder: Path, name: str, state: SourceState) -> Lease | None:
    """A lease on the copy the marker names, if it is one of ``state``."""
    marked = read_marker(folder / f".{name}.staged")
    if marked is None or marked.state != state or marked.copy is None:
        return None
    return lease(folder, name, marked.copy)


def _others(folder: Path, name: str) -> bool:
    """Whether the node has copies of ``name`` besides the current one."""
    prefix = f".{name}.copy-"
    return sum(entry.startswith(prefix) for entry in os.listdir(folder)) > 1


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
        handle = os.open(lock_path(folder, name), os.O_RDWR | os.O_CREAT, 0o664)
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


def _replace(folder: Path, name: str, source: Path, state: SourceState) -> Lease:
    """Under the item's lock: drop what no trial reads (old copies, torn
    ones), check the room, copy beside the current copy into a folder of
    its own, point the link and the marker at it; the copy it replaces goes
    once no trial reads it."""
    try:
        clear_leftovers(folder, name)
        sweep_unlocked(folder, name)
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    check_room(folder, name, state)
    progress = Progress(name, state.bytes)
    files = "1 file" if state.files == 1 else f"{state.files} files"
    progress.say(f"copying {mib(state.bytes)} ({files}) from {source} to {folder}")
    leased = _copy_beside(folder, name, source, state, progress)
    with suppress(OSError):  # the copy is made; what stays goes at the study's end
        sweep_unlocked(folder, name)  # the copy replaced, if no trial reads it
    seconds = time.monotonic() - progress.started
    progress.say(f"staged in {seconds:.1f} s ({progress.rate()}): {leased.copy / source.name}")
    return leased


def _copy_beside(folder: Path, name: str, source: Path, state: SourceState,
                 progress: Progress) -> Lease:
    """The new copy, made under a temporary name and renamed into a folder
    of its own, leased before anyone can see it; then linked and marked."""
    host = socket.gethostname()
    temporary = folder / f".{name}.tmp-{host}-{os.getpid()}"
    copy = next_copy(folder, name)
    leased = None
    try:
        temporary.mkdir()
        leased = hold(folder, name, temporary, folder / copy)
        copy_source(source, temporary / source.name, progress)
        os.rename(temporary, folder / copy)
        point_link(folder, name, copy)
        fsync_folder(folder)
        # Logged before it is marked: a trial that finds it current, without
        # the lock, finds it in the log too.
        _log(folder, {"name": name, "copy": copy, "source": str(source), "bytes": state.bytes,
                      "files": state.files, "seconds": round(time.monotonic() - progress.started, 3),
                      "host": host, "pid": os.getpid(), "at": time.time()})
        write_marker(folder / f".{name}.staged", state, copy, host=host, pid=os.getpid())
        return leased
    except OSError as exc:
        if leased is not None:
            leased.release()  # an unmarked copy: removed by the next sweep
        shutil.rmtree(temporary, ignore_errors=True)
        if exc.errno in _WRITE_FAULTS:
            raise full(folder, name, state.bytes) from None
        if str(exc.filename or "").startswith(str(source)):  # the source, not the node
            raise _state_error(name, source, exc) from None
        raise _unwritable(folder, exc) from None


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
