"""The journal file, kept readable after a crash.

A write cut off (a crash inside an append, a full disk) leaves a torn tail:
bytes after the last intact record. Optuna's reader skips it, but its next
append is glued onto it, and from then on every read fails.
:class:`JournalFile` sets such a tail aside before it appends. Damage followed
by intact records is refused on reading; :func:`repair_journal` salvages the
intact records and says honestly what the dropped bytes may have held.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import optuna
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileSymlinkLock

from hpo.errors import UsageError
from hpo.store._files import process_alive, process_stopped, write_atomically
from hpo.store._format import FIELDS, Op, creation_ops, encode_records, record_starts
from hpo.store._protocol import MAX_STEP
from hpo.store.records import (
    ENDED_BY_ATTR,
    EVENT_ATTR,
    PROFILE_ATTR,
    REPORT_ATTR,
    RUN_ATTR,
    SEGMENT_ATTR,
)

__all__ = ["JournalFile", "JournalLock", "LockLost", "clear_dead_lock", "lock_holder", "LOCK_SUFFIX", "HELD_SUFFIX",
           "repair_journal", "write_durably", "encode_records", "unusable"]

LOCK_SUFFIX = ".lock"  # Optuna's lock file beside the journal
HELD_SUFFIX = ".lock-held"  # names the lock's holder while it is held
_LOCK_NAP_S = 0.05  # a waiter looks at the lock at least this often (Optuna's: up to 1 s)
_CHUNK = 8192
_SEARCH_CHUNK = 8 << 20


class LockLost(RuntimeError):
    """The journal's lock was not this writer's any more when it let go: a
    writer that found it held too long (Optuna's grace period, while this
    one was stopped) broke it, and may hold a lock of its own now."""


class JournalLock(JournalFileSymlinkLock):
    """Optuna's symlink lock, named by its holder and released only while it
    is still the one this writer took.

    Optuna's own release removes whatever lock is there, so a writer that
    wakes after its lock was broken would remove the next holder's, and two
    writers would append at once. While held, ``<journal>.lock-held`` names
    the lock (its inode and change time), its host and its process: a
    writer that finds the lock left by a process gone from this host (killed
    inside an append) breaks exactly that lock after some 60 ms, instead of
    waiting out Optuna's 30 s grace; any other lock is waited for as Optuna does,
    and broken after the grace period when the journal stays unchanged."""

    def __init__(self, path: str, role: str = "writer") -> None:
        super().__init__(path)
        self.role = role  # "relay": a master's, gone once another master holds the study
        self._mine: tuple[int, int] | None = None

    def acquire(self) -> bool:
        nap_s, changed, seen = 0.001, time.monotonic(), None
        while True:
            try:
                os.symlink(self._lock_target_file, self._lock_file)
                break
            except FileExistsError:
                pass
            # A holder appends in about a millisecond: only a lock held past
            # the first naps (some 60 ms) is worth asking who left it.
            if nap_s >= _LOCK_NAP_S and clear_dead_lock(self._lock_target_file):
                continue
            try:
                mtime = os.stat(self._lock_file).st_mtime  # the journal's: a holder appending keeps it fresh
            except OSError:
                continue  # released meanwhile
            if mtime != seen:
                seen, changed = mtime, time.monotonic()
            if self.grace_period is not None and time.monotonic() - changed > self.grace_period:
                print(f"hpo: {self._lock_file}: broke a journal lock held for over "
                      f"{self.grace_period} s with the journal unchanged", file=sys.stderr, flush=True)
                try:
                    super().release()
                except RuntimeError:  # released or broken meanwhile
                    pass
                continue
            time.sleep(nap_s)
            nap_s = min(2 * nap_s, _LOCK_NAP_S)
        try:
            self._name_the_lock()
        except BaseException:  # interrupted (a signal) before the caller could release it
            super().release()
            raise
        return True

    def _name_the_lock(self) -> None:
        self._mine = _link_identity(self._lock_file)
        held = {"lock": list(self._mine or ()), "host": socket.gethostname(), "pid": os.getpid(),
                "role": self.role}
        try:
            Path(self._lock_target_file + HELD_SUFFIX).write_text(json.dumps(held))
        except OSError:  # a full disk: the lock is held all the same, unnamed (Optuna's grace)
            pass

    def release(self) -> None:
        mine, self._mine = self._mine, None
        if mine is not None and _link_identity(self._lock_file) != mine:
            raise LockLost(f"{self._lock_file}: the journal's lock was broken while this process "
                           "held it (it was stopped for longer than the lock's grace period)")
        super().release()
        # Only then, and only if it is still this lock's: a writer killed in
        # between leaves a marker naming no lock, never a lock without its name.
        marker = self._lock_target_file + HELD_SUFFIX
        try:
            if json.loads(Path(marker).read_text()).get("lock") == list(mine or ()):
                os.unlink(marker)
        except (OSError, ValueError, AttributeError):
            pass


def lock_holder(path: str) -> dict[str, Any] | None:
    """Who holds the journal's lock (its ``host``, ``pid`` and ``role``),
    as the lock's marker says; None when it is free or its holder unnamed."""
    try:
        held = json.loads(Path(path + HELD_SUFFIX).read_text())
        named = [int(n) for n in held["lock"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return held if list(_link_identity(path + LOCK_SUFFIX) or ()) == named else None


def clear_dead_lock(path: str, stopped_is_gone: bool = False, relays_gone: bool = False) -> bool:
    """Remove the journal's lock if a process that is gone left it. Only the
    very lock that process took (same inode and change time) is removed, and
    only when the process is gone from this host, or, with
    ``stopped_is_gone``, stopped (Ctrl-Z, SIGSTOP): a caller that took the
    study's lease from it knows that when it wakes, it writes nothing more.
    With ``relays_gone`` (a master opening the study), a relay's lock is
    removed wherever it ran: the master around it is gone. Breakers take
    turns (``flock`` on the journal), so that two never remove a lock one
    of them broke and a third took since."""
    held = lock_holder(path)
    if held is None:
        return False
    pid = held.get("pid")
    elsewhere = held.get("host") != socket.gethostname()
    if elsewhere and not (relays_gone and held.get("role") == "relay"):
        return False
    if not elsewhere and process_alive(pid) and not (stopped_is_gone and process_stopped(pid)):
        return False
    try:
        turn = open(path, "rb")  # nothing else flocks the journal
    except FileNotFoundError:  # the journal is gone: its writers say so, not its lock
        return False
    with turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if lock_holder(path) != held:
            return False  # released, or broken by another, since
        Path(path + HELD_SUFFIX).unlink(missing_ok=True)
        os.unlink(path + LOCK_SUFFIX)
    print(f"hpo: {path}: removed the journal lock that process {pid} on {held.get('host')} left "
          "when it died or was stopped", file=sys.stderr, flush=True)
    return True


def _link_identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns


class JournalFile(JournalFileBackend):
    """Optuna's journal file backend that never makes damage worse: a torn tail
    is set aside before an append, damage in the middle is refused on reading,
    and so is a record of a newer Optuna (rather than cut off as torn)."""

    def __init__(self, path: str, create: bool = True, role: str = "writer") -> None:
        self._path = path
        self._journal_lock = JournalLock(path, role)
        if not create and not os.path.exists(path):
            # A writer of a running study never begins a journal: one that
            # vanished must stay missing, for the next master to refuse.
            raise FileNotFoundError(errno.ENOENT, "the study's journal is missing", path)
        super().__init__(path, lock_obj=self._journal_lock)
        self._offsets = {0: 0}  # record number -> byte offset of its line
        self.lock_lost = False  # whether another writer broke this one's lock
        self._read_to = 0  # the end of the last record read

    @property
    def path(self) -> str:
        return self._path

    @property
    def read_to(self) -> int:
        """The byte offset just past the last record read."""
        return self._read_to

    def known(self, records: int, offset: int) -> None:
        """Record ``records`` starts at byte ``offset`` (a snapshot that was
        checked against the journal says so): a read from it seeks there."""
        self._offsets[records] = offset

    def offset_of(self, records: int) -> int | None:
        """Where record ``records`` starts, when this reader knows it."""
        return self._offsets.get(records)

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        number = log_number_from if log_number_from in self._offsets else 0
        self._read_to = max(self._read_to, self._offsets[number])  # the bytes before are accounted for
        for record, offset in self._intact(self._offsets[number]):
            if record is None:  # skipped: the bytes are read all the same
                self._read_to = max(self._read_to, offset)
                if number in self._offsets and self._offsets[number] < offset:
                    self._offsets[number] = offset
                continue
            number += 1
            self._offsets[number] = offset
            self._read_to = max(self._read_to, offset)
            if number > log_number_from:
                yield record

    def read_from(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The intact records from byte ``offset`` on, and the offset after the
        last of them (an incomplete last line waits for the next read)."""
        records = []
        end = offset
        for record, after in self._intact(offset):
            if record is not None:
                records.append(record)
            end = after
        return records, end

    def _intact(self, offset: int) -> Iterator[tuple[dict[str, Any] | None, int]]:
        """Each intact record from byte ``offset`` on, with the offset after
        it (None for a record no reader can use, skipped); lines appended
        meanwhile wait for the next read, and a torn tail (or a write still
        going on) ends it."""
        with open(self._path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            f.seek(offset)
            for line in f:
                if offset + len(line) > end:
                    return
                record = _record(line, self._path, offset)
                if record is None:
                    _refuse_damage_before_records(self._path, offset)
                    return
                why = unusable(record)
                if why is not None:  # every reader skips the same records: numbering agrees
                    _say_skipped(self._path, offset, why)
                offset += len(line)
                yield (record if why is None else None), offset

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.append_direct(encode_records(logs))

    def append_direct(self, data: bytes, allowed: Callable[[], bool] | None = None) -> bool:
        """Append whole records under the file lock and fsync before returning;
        nothing, and False, when ``allowed`` (asked under the lock) says no."""
        with self.locked() as f:
            if allowed is not None and not allowed():
                return False
            write_durably(f, data)
        return True

    @contextmanager
    def locked(self) -> Iterator[BinaryIO]:
        """The journal open for appending under its file lock, a torn tail set
        aside: under the lock no other append is half done, so a tail that does
        not end in an intact record is torn for good."""
        self._journal_lock.acquire()
        try:
            # Never created here: a journal deleted meanwhile stays missing.
            with open(os.open(self._path, os.O_RDWR | os.O_APPEND), "ab+") as f:
                _set_torn_tail_aside(f, self._path)
                yield f
        finally:
            try:
                self._journal_lock.release()
            except LockLost:
                # What was written is durable all the same; the relay reads
                # what others appended before its next round (fencing).
                self.lock_lost = True


def write_durably(f: BinaryIO, data: bytes) -> None:
    """Append ``data`` to the journal open in ``f`` and make it durable
    (``fdatasync``: the data and the file's new size, not its times)."""
    f.write(data)
    f.flush()
    os.fdatasync(f.fileno())


def repair_journal(path: str) -> list[str]:
    """Replace a damaged journal by its intact records, keeping the original
    beside it; lines that say what was dropped and kept. A salvage that would
    give trials the wrong ids is refused (:class:`UsageError`), nothing changed."""
    lock = JournalFileSymlinkLock(path)
    lock.acquire()  # no append may land between reading and replacing
    try:
        data = Path(path).read_bytes()
        kept, damaged = _scan(data, path)
        if not damaged:
            return _set_unusable_aside(path, data, kept)
        _refuse_unfaithful(path, data, kept, damaged)
        replayed = _replay(path, [record for _, record in kept])
        original = _free_name(path, "damaged")
        write_atomically(original, data)  # first: a crash here leaves both
        write_atomically(path, b"".join(data[at:data.index(b"\n", at) + 1] for at, _ in kept))
    finally:
        lock.release()
    return [f"repaired {path}",
            *(f"  dropped {_describe(data, start, stop)}" for start, stop in damaged),
            f"  kept {len(kept)} intact records; Optuna replays them: {replayed}",
            *(f"  {line}" for line in _verdict(data, damaged)),
            f"  the damaged original is kept as {original}"]


def _set_unusable_aside(path: str, data: bytes, kept: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """Move the intact records no reader can use (values that are not
    numbers...) into a file beside the journal (called under its lock)."""
    why = {at: unusable(record) for at, record in kept}
    aside = [at for at, _ in kept if why[at] is not None]
    if not aside:
        return [f"{path}: nothing to repair ({len(kept)} intact records)"]
    lines = {at: data[at:data.index(b"\n", at) + 1] for at, _ in kept}
    moved = _free_name(path, "unusable")
    write_atomically(moved, b"".join(lines[at] for at in aside))  # first: a crash here leaves both
    write_atomically(path, b"".join(line for at, line in lines.items() if why[at] is None))
    return [f"repaired {path}",
            *(f"  set aside the record at byte {at}: {why[at]}" for at in aside),
            f"  kept {len(kept) - len(aside)} records; the ones set aside are in {moved}",
            "  a trial whose end was set aside is unfinished again: the same `hpo run` runs it again"]


# -- reading ------------------------------------------------------------------

_COMPLETE = optuna.trial.TrialState.COMPLETE.value  # as a journal's state records hold it
# hpo's trial attributes that readers use as records (hpo.store.records), and
# those whose key ends in a number.
_RECORD_ATTRS = (RUN_ATTR, ENDED_BY_ATTR, REPORT_ATTR, SEGMENT_ATTR, EVENT_ATTR, PROFILE_ATTR)
_NUMBERED_ATTRS = (REPORT_ATTR, SEGMENT_ATTR)
_skipped: set[tuple[str, int]] = set()


def unusable(record: dict[str, Any]) -> str | None:
    """Why a whole record is of no use to any reader (a value that is not a
    number where Optuna keeps numbers, an hpo record that is not one), or
    None. Such a record is skipped by every reader, and `hpo repair` sets it
    aside; the relay never writes one (hpo.store._protocol)."""
    op = record["op_code"]
    if op == Op.SET_TRIAL_STATE_VALUES:
        why = _unusable_values(record.get("state"), record.get("values"))
        return None if why is None else f"trial id {record.get('trial_id')}: {why}"
    if op == Op.SET_TRIAL_INTERMEDIATE_VALUE:
        step, value = record.get("step"), record.get("intermediate_value")
        if not _is_int(step) or not 0 <= step < MAX_STEP:
            return f"trial id {record.get('trial_id')}: step {step!r} is not an int from 0 to 2**31 - 1"
        if not _is_number(value):
            return f"trial id {record.get('trial_id')}: the value of step {step} is {value!r}, not a number"
    elif op == Op.SET_TRIAL_PARAM and not _is_number(record.get("param_value_internal")):
        return f"trial id {record.get('trial_id')}: parameter {record.get('param_name')!r} is not a number inside"
    elif op == Op.SET_TRIAL_SYSTEM_ATTR and isinstance(record.get("system_attr"), dict):
        for key, value in record["system_attr"].items():
            why = _unusable_attr(key, value)
            if why is not None:
                return f"trial id {record.get('trial_id')}: {why}"
    return None


def _unusable_values(state: Any, values: Any) -> str | None:
    if values is None:
        return "a complete trial without values" if state == _COMPLETE else None
    if not isinstance(values, list) or not values:
        return f"values {values!r} are not a list of numbers"
    if not all(_is_number(v) and math.isfinite(v) for v in values):
        return f"values {values!r} are not all finite numbers"
    return None


def _unusable_attr(key: Any, value: Any) -> str | None:
    if not isinstance(key, str) or not key.startswith(_RECORD_ATTRS):
        return None
    if key.startswith(_NUMBERED_ATTRS) and not key.rpartition(":")[2].isdigit():
        return f"attribute {key!r} does not end in a number"
    if not isinstance(value, dict):
        return f"attribute {key!r} holds {type(value).__name__}, not a record"
    return None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _say_skipped(path: str, offset: int, why: str) -> None:
    """Say once per process and record that a reader skips it."""
    if (path, offset) in _skipped:
        return
    _skipped.add((path, offset))
    where = Path(path)
    run_dir = where.parent if where.name == "journal.log" else "RUN_DIR"
    print(f"hpo: {path}: the record at byte {offset} is skipped: {why}.\n  fix: hpo repair {run_dir} "
          "sets it aside (its trial, if it was its end, runs again)", file=sys.stderr)



def _record(line: bytes, path: str | None = None, offset: int = 0) -> dict[str, Any] | None:
    """The record on ``line``, or None when the line is damaged. A whole
    record of an op code this Optuna does not know is refused, never taken
    for damage (:class:`UsageError`)."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line.decode())
    except ValueError:  # not UTF-8, not JSON
        return None
    if not isinstance(record, dict) or not isinstance(record.get("op_code"), int):
        return None
    # Pieces of two records can join into valid JSON: the fields tell.
    fields = FIELDS.get(record["op_code"])
    if fields is None and "worker_id" in record:
        raise _newer_optuna(path, offset, record["op_code"])
    complete = fields is not None and all(f in record for f in ("worker_id", *fields))
    return record if complete else None


def _newer_optuna(path: str | None, offset: int, op_code: int) -> UsageError:
    return UsageError(
        f"{path or 'the journal'}: the record at byte {offset} has op code {op_code}, which "
        f"Optuna {optuna.__version__} does not know: a newer Optuna wrote it. Nothing was changed.\n"
        "  fix: install the Optuna that wrote the study where hpo runs "
        "(pip install -U optuna), then run the command again")


def _refuse_damage_before_records(path: str, offset: int) -> None:
    """Raise when intact records follow the damaged line at ``offset``.

    The file is opened afresh: a writer may have set the tail aside meanwhile.
    """
    with open(path, "rb") as f:
        f.seek(offset)
        if _record(f.readline(), path, offset) is not None:
            return  # repaired meanwhile: the next read goes on from here
        stop = f.tell()
        for line in f:
            if _record(line, path, stop) is not None:
                raise _damage_error(path, offset, stop)
            stop += len(line)


def _damage_error(path: str, start: int, stop: int) -> UsageError:
    where = Path(path)
    run_dir = where.parent if where.name == "journal.log" else "RUN_DIR"
    return UsageError(
        f"{path}: damaged at byte {start}: {stop - start} unreadable bytes are followed by intact "
        "records, so the study cannot be read, and writing to it would make it worse.\n"
        f"  fix: hpo repair {run_dir}  (it keeps the damaged file beside the repaired one and "
        "says what it drops)")


# -- a torn tail --------------------------------------------------------------


def _set_torn_tail_aside(f: BinaryIO, path: str) -> None:
    """Move the bytes after the last intact record into a file beside the
    journal, and cut the journal there. Cheap when the tail is intact."""
    size = f.seek(0, os.SEEK_END)
    end = _last_record_end(f, size, path)
    if end == size:
        return
    f.seek(end)
    aside = _free_name(path, "torn")
    write_atomically(aside, f.read(size - end))
    f.truncate(end)
    os.fsync(f.fileno())
    print(f"hpo: {path}: its last write was cut off; the {size - end} bytes after the last intact "
          f"record (byte {end} on) are set aside in {aside}, and the journal goes on from there",
          file=sys.stderr)


def _last_record_end(f: BinaryIO, size: int, path: str) -> int:
    """The offset just past the last intact record (0 when there is none)."""
    end = size
    while end > 0:
        start = _line_start(f, end)
        f.seek(start)
        if _record(f.read(end - start), path, start) is not None:
            return end
        end = start
    return 0


def _line_start(f: BinaryIO, end: int) -> int:
    """Where the line that ends at ``end`` (its newline, if any, included) starts."""
    pos = end - 1
    while pos > 0:
        step = min(pos, _CHUNK)
        f.seek(pos - step)
        found = f.read(step).rfind(b"\n")
        if found >= 0:
            return pos - step + found + 1
        pos -= step
    return 0


def _free_name(path: str, kind: str) -> Path:
    """``<journal>.<kind>-<UTC time>``, numbered when taken (called under the lock)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name, n = Path(f"{path}.{kind}-{stamp}"), 1
    while name.exists():
        n += 1
        name = Path(f"{path}.{kind}-{stamp}-{n}")
    return name


# -- salvage ------------------------------------------------------------------


def _scan(data: bytes, path: str) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, int]]]:
    """The intact records with their offsets, and the damaged byte ranges."""
    kept: list[tuple[int, dict[str, Any]]] = []
    damaged: list[tuple[int, int]] = []
    offset = 0
    for line in io.BytesIO(data):
        record = _record(line, path, offset)
        if record is not None:
            kept.append((offset, record))
        elif damaged and damaged[-1][1] == offset:
            damaged[-1] = (damaged[-1][0], offset + len(line))
        else:
            damaged.append((offset, offset + len(line)))
        offset += len(line)
    return kept, damaged


def _refuse_unfaithful(path: str, data: bytes, kept: list[tuple[int, dict[str, Any]]],
                       damaged: list[tuple[int, int]]) -> None:
    """Refuse a salvage in which Optuna's replay would give trials the wrong ids."""
    problem = _lost_creation(data, damaged) or _dangling(kept)
    if problem:
        raise UsageError(
            f"{path}: cannot be repaired faithfully: {problem}. Optuna numbers studies and trials "
            "by the order of their creation records, so without it later records would land on "
            "the wrong trial or be lost; the journal is left as it was.\n"
            "  fix: restore the journal from a backup, or run the study again in a new run "
            "directory (--runs-dir)")


def _lost_creation(data: bytes, damaged: list[tuple[int, int]]) -> str | None:
    """A creation record still readable in dropped bytes that records follow."""
    for start, stop in damaged:
        if stop < len(data) and creation_ops.intersection(record_starts(data, start, stop)):
            return f"the dropped bytes {start}-{stop - 1} held a study or trial creation"
    return None


def _dangling(kept: list[tuple[int, dict[str, Any]]]) -> str | None:
    """The first intact record that writes to a study or trial no record before
    it creates: a creation was among the dropped bytes, unreadable."""
    studies: list[Any] = []
    trials = 0
    for offset, record in kept:
        study, trial = record.get("study_id"), record.get("trial_id")
        if isinstance(study, int) and study >= len(studies):
            return (f"the record at byte {offset} writes to study {study}, which no intact record "
                    "before it creates")
        if isinstance(trial, int) and trial >= trials:
            return (f"the record at byte {offset} writes to trial id {trial}, but the intact "
                    f"records before it create only {trials} trials")
        if record["op_code"] == Op.CREATE_STUDY and record.get("study_name") not in studies:
            studies.append(record.get("study_name"))
        trials += record["op_code"] == Op.CREATE_TRIAL
    return None


class _Records(BaseJournalBackend):
    """Records in memory, for Optuna to replay."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._records = records

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        return iter(self._records[log_number_from:])

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError("read only")


def _replay(path: str, records: list[dict[str, Any]]) -> str:
    """What Optuna makes of ``records``; refused when its replay fails."""
    try:
        storage = optuna.storages.JournalStorage(_Records(records))
        counts = {s.study_name: len(storage.get_all_trials(
            storage.get_study_id_from_name(s.study_name), deepcopy=False))
            for s in storage.get_all_studies()}
    except Exception as exc:  # whatever fails, the salvage is not a journal Optuna can use
        raise UsageError(f"{path}: its intact records do not replay with Optuna "
                         f"({type(exc).__name__}: {exc}); the journal is left as it was.\n"
                         "  fix: restore the journal from a backup") from None
    return ", ".join(f"study {name!r} with {n} trials" for name, n in counts.items())


def _describe(data: bytes, start: int, stop: int) -> str:
    starts = len(record_starts(data, start, stop))
    lines = data.count(b"\n", start, stop) + (not data[start:stop].endswith(b"\n"))
    return (f"bytes {start}-{stop - 1} ({stop - start} bytes, {lines} damaged line(s); "
            f"{starts} record start(s) still recognisable in them)")


def _verdict(data: bytes, damaged: list[tuple[int, int]]) -> list[str]:
    """What the dropped bytes may have held, as far as can be told."""
    if len(damaged) == 1 and damaged[0][1] == len(data):
        return ["the damage was at the end: only the last writes are lost and no kept record "
                "depends on them; the same `hpo run` redoes what they held"]
    return ["warning: the dropped bytes may have held records the replay needs (a report, an "
            "attribute, a trial's result): check the trials with `hpo status`; the same "
            "`hpo run` redoes trials left unfinished",
            "no sign of a lost study or trial creation (none recognisable in the dropped bytes, "
            "and every kept record writes to a study and trial created before it), so no trial "
            "id has shifted"]
