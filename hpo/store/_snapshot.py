"""Journal snapshots: a reader starts from the state of a journal prefix
instead of replaying the whole journal.

A snapshot is a file beside the journal (``journal.log.<name>``): one header
line, then a payload. The header says which prefix of the journal the payload
stands for (its record count and byte length, and checksums of its first and
last bytes) and which versions wrote it. A snapshot is only ever a shortcut:
one that is damaged, written by other versions, or whose prefix no longer
matches the journal (repaired, replaced, cut short) is ignored, and the
journal, which stays a plain Optuna journal, is replayed as without it.

:class:`SnapshotJournal` is Optuna's own mechanism
(:class:`~optuna.storages.journal.BaseJournalSnapshot`): ``JournalStorage``
restores its replay result from the snapshot and reads the journal from the
snapshot's record on, seeking straight to its byte offset. The replay result
is a pickle, as Optuna's restore wants, but its trials are packed
(:func:`pack_replay`): plain values in one :mod:`marshal` blob, each
distinct distribution once, rebuilt into ``FrozenTrial`` objects with the
cyclic collector paused (a pickle of 100,000 ``FrozenTrial`` objects took
several times as long to load).

The store's snapshot (``journal.log.snapshot``) also carries, when the
master wrote it, the state of the master's relay at the same record (its
ledger and what its pruner learnt, :mod:`hpo.store._relay`): the next master
opens the study from the snapshot and the journal's tail
(:func:`read_store_snapshot`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import marshal
import os
import pickle
import sys
import zlib
from collections.abc import Callable, Collection, Generator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import optuna

from hpo.store._files import write_atomically
from hpo.store._format import JournalSnapshot
from hpo.store._journal import JournalFile

__all__ = ["Mark", "SnapshotJournal", "read_snapshot", "write_snapshot", "save_journal_snapshot",
           "replay_dump", "replica_dump", "records_read", "is_placeholder", "snapshot_path", "STORE_SNAPSHOT",
           "SNAPSHOT_EVERY", "pack_replay", "store_payload", "read_store_snapshot", "gc_paused"]

STORE_SNAPSHOT = "snapshot"  # journal.log.snapshot: Optuna's replay result
# Records a journal must have beyond its snapshot before the master writes a
# new one at the end of a study: below that, replaying them is quicker than
# restoring (and a small study's run directory stays as it was).
SNAPSHOT_EVERY = 10_000
_FORMAT = 2  # 2: packed trials, and the relay's state beside Optuna's
_EDGE = 1 << 16  # bytes checksummed at each end of the covered prefix
# A finished trial never changes (Optuna refuses updates), so a reader that
# keeps its own copy of finished trials may store them as this placeholder.
# (create_trial numbers it -1, which no stored trial has.)
_PLACEHOLDER = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL)
_STATES = {state.value: state for state in optuna.trial.TrialState}


class Mark(NamedTuple):
    """Where a snapshot stands: the records it covers and their byte length."""

    records: int
    offset: int


def snapshot_path(journal: str | os.PathLike[str], name: str) -> Path:
    return Path(f"{journal}.{name}")


def _versions() -> dict[str, Any]:
    from hpo import __version__

    return {"format": _FORMAT, "hpo": __version__, "optuna": optuna.__version__,
            "python": list(sys.version_info[:2])}


def _prefix_checksums(journal: str | os.PathLike[str], offset: int) -> list[int] | None:
    """Checksums of the first and last bytes of the journal's first ``offset``
    bytes; None when the journal is shorter or does not end a record there."""
    try:
        with open(journal, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:
                return None
            head = f.read(min(offset, _EDGE))
            f.seek(max(offset - _EDGE, 0))
            tail = f.read(offset - max(offset - _EDGE, 0))
    except OSError:
        return None
    if offset and not tail.endswith(b"\n"):
        return None
    return [zlib.crc32(head), zlib.crc32(tail)]


def write_snapshot(journal: str | os.PathLike[str], name: str, mark: Mark, payload: bytes) -> bool:
    """Write ``payload`` as the snapshot ``name`` of the journal's first
    ``mark.records`` records, atomically; False (nothing written) when the
    directory is not writable: a snapshot is never required."""
    checksums = _prefix_checksums(journal, mark.offset)
    if checksums is None:
        return False
    header = {**_versions(), "records": mark.records, "offset": mark.offset, "prefix": checksums,
              "payload": [len(payload), zlib.crc32(payload)]}
    try:
        write_atomically(snapshot_path(journal, name), json.dumps(header).encode() + b"\n" + payload)
    except OSError:  # a read-only run directory (someone else's study), a full disk
        return False
    return True


def read_snapshot(journal: str | os.PathLike[str], name: str) -> tuple[Mark, bytes] | None:
    """The snapshot ``name`` of the journal and where it stands, or None when
    there is none or it cannot be trusted (damaged, other versions, another
    journal or prefix)."""
    try:
        data = snapshot_path(journal, name).read_bytes()
    except OSError:
        return None
    end = data.find(b"\n")
    try:
        header = json.loads(data[:end])
        mark = Mark(int(header["records"]), int(header["offset"]))
        size, checksum = header["payload"]
        expected = header["prefix"]
        same_versions = all(header.get(k) == v for k, v in _versions().items())
    except (ValueError, KeyError, TypeError):
        return None
    payload = data[end + 1:]
    if end < 0 or not same_versions or len(payload) != size or zlib.crc32(payload) != checksum:
        return None
    if mark.records < 0 or _prefix_checksums(journal, mark.offset) != expected:
        return None
    return mark, payload


class SnapshotJournal(JournalFile, JournalSnapshot):
    """A journal file that Optuna replays from a snapshot on, when there is a
    trustworthy one: by default the store's (``journal.log.snapshot``), or
    ``seed`` (a mark and a packed replay result that the caller read and
    checked).

    Only readers use it: Optuna also saves a snapshot every 100 trials a
    process creates, which this backend leaves to :func:`save_journal_snapshot`.
    """

    def __init__(self, path: str, seed: tuple[Mark, bytes] | None = None) -> None:
        super().__init__(path)
        self._seed = seed
        self._offered: Mark | None = None  # the snapshot handed to Optuna
        self.restored_from: Mark | None = None  # where the replay started (tests, benches)

    def load_snapshot(self) -> bytes | None:
        if self._seed is not None:
            mark, payload = self._seed
        else:
            found = read_store_snapshot(self._path)
            if found is None:
                return None
            mark, payload, _ = found
        self.known(mark.records, mark.offset)  # read_logs seeks here instead of scanning
        self._offered = mark
        return payload

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        offered, self._offered = self._offered, None
        if offered is not None and log_number_from == offered.records:  # Optuna restored it
            self.restored_from = offered
        return super().read_logs(log_number_from)

    def save_snapshot(self, snapshot: bytes) -> None:
        pass  # see the class docstring

    def mark(self, records: int) -> Mark | None:
        """Where record ``records`` starts, when this backend has read that far."""
        offset = self.offset_of(records)
        return None if offset is None else Mark(records, offset)


# -- Optuna's replay result, packed ---------------------------------------------------


def pack_replay(result: Any, placeholder: Callable[[int, optuna.trial.FrozenTrial], bool] | None = None
                ) -> bytes:
    """Optuna's replay result ``result`` (a ``JournalStorageReplayResult``) as
    the pickle Optuna's ``JournalStorage.restore_replay_result`` takes, its
    trials packed: the trials for which ``placeholder(trial_id, trial)`` is
    true are stored as placeholders (:func:`is_placeholder`). The caller
    holds the storage's lock. ValueError when a trial holds what
    :mod:`marshal` cannot (never a value read from a journal)."""
    shell = object.__new__(type(result))
    shell.__dict__.update(result.__dict__)
    shell._trials = {}
    packer = _Packer()
    rows = [trial_id if placeholder is not None and placeholder(trial_id, trial) else packer.row(trial_id, trial)
            for trial_id, trial in result._trials.items()]
    return pickle.dumps(_Packed(shell, marshal.dumps(rows), packer.distributions),
                        protocol=pickle.HIGHEST_PROTOCOL)


class _Packed:
    """What :func:`pack_replay` pickles: unpickled, it is the replay result."""

    def __init__(self, shell: Any, rows: bytes, distributions: list[Any]) -> None:
        self.shell, self.rows, self.distributions = shell, rows, distributions

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpack_replay, (self.shell, self.rows, self.distributions)


class _Packer:
    """Trials as rows of plain values; strings met again are the same object
    (marshal then writes a reference), distributions indices into one list."""

    def __init__(self) -> None:
        self.distributions: list[Any] = []
        self._index: dict[Any, int] = {}
        self._strings: dict[str, str] = {}

    def row(self, trial_id: int, trial: optuna.trial.FrozenTrial) -> tuple[Any, ...]:
        start, complete = trial.datetime_start, trial.datetime_complete
        return (trial_id, trial.number, trial.state.value, trial.values,
                None if start is None else start.isoformat(), None if complete is None else complete.isoformat(),
                self._shared(trial.params), {self._string(name): self._distribution(distribution)
                                             for name, distribution in trial.distributions.items()},
                self._shared(trial.user_attrs), self._shared(trial.system_attrs), trial.intermediate_values)

    def _distribution(self, distribution: Any) -> int:
        index = self._index.get(distribution)
        if index is None:
            index = self._index[distribution] = len(self.distributions)
            self.distributions.append(distribution)
        return index

    def _string(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def _shared(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return self._string(value)
        if kind is dict:
            return {self._string(k) if type(k) is str else k: self._shared(v) for k, v in value.items()}
        if kind is list:
            return [self._shared(v) for v in value]
        return value


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector paused: reading or rebuilding
    a big store makes millions of objects and no garbage, which the
    collector would scan again and again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _unpack_replay(shell: Any, rows: bytes, distributions: list[Any]) -> Any:
    """The replay result :func:`pack_replay` packed; None (Optuna then replays
    the whole journal) when the rows cannot be read."""
    fromisoformat, frozen = datetime.fromisoformat, optuna.trial.FrozenTrial
    try:
        with gc_paused():
            trials = {}
            for row in marshal.loads(rows):
                if type(row) is int:
                    trials[row] = _PLACEHOLDER
                    continue
                trial_id, number, state, values, start, complete, params, names, user, system, steps = row
                trials[trial_id] = frozen(
                    number, _STATES[state], None, None if start is None else fromisoformat(start),
                    None if complete is None else fromisoformat(complete), params,
                    {name: distributions[index] for name, index in names.items()}, user, system, steps,
                    trial_id, values=values)
    except Exception:  # whatever is wrong with it, the journal is still there
        return None
    shell._trials = trials
    return shell


def store_payload(replay: bytes, relay: Any = None) -> bytes:
    """The payload of the store's snapshot: Optuna's packed replay result and
    the state of the relay at the same record (plain values; None when a
    reader wrote it)."""
    return marshal.dumps((replay, relay))


def read_store_snapshot(journal: str | os.PathLike[str]) -> tuple[Mark, bytes, Any] | None:
    """The store's snapshot of the journal, when there is one to trust: where
    it stands, Optuna's packed replay result, and the relay's state there
    (None when a reader wrote it)."""
    found = read_snapshot(journal, STORE_SNAPSHOT)
    if found is None:
        return None
    mark, payload = found
    try:
        replay, relay = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    if type(replay) is not bytes:
        return None
    return mark, replay, relay


def replay_dump(storage: optuna.storages.JournalStorage, study_id: int | None = None,
                kept: Collection[int] = ()) -> tuple[Mark, bytes] | None:
    """Optuna's replay result of ``storage`` as it stands (not synced first:
    a caller's views of the trials match it), packed (:func:`pack_replay`),
    and where it stands. The finished trials of study ``study_id`` whose
    numbers are in ``kept`` are placeholders (:func:`is_placeholder`): the
    caller keeps them itself. None when the backend cannot say where the
    replay stands.

    Optuna offers no public way to take its replay state; this reaches its
    private attributes, under the storage's own lock.
    """
    backend = storage._backend
    if not isinstance(backend, SnapshotJournal):
        return None
    with storage._thread_lock:
        result = storage._replay_result
        mark = backend.mark(result.log_number_read)
        if mark is None:
            return None
        study_of = result._trial_id_to_study_id

        def placeholder(trial_id: int, trial: optuna.trial.FrozenTrial) -> bool:
            return trial.state.is_finished() and trial.number in kept and study_of.get(trial_id) == study_id

        return mark, pack_replay(result, placeholder if kept else None)


def replica_dump(storage: optuna.storages.JournalStorage,
                 where: Callable[[], Mark]) -> tuple[Mark, bytes]:
    """Optuna's replay result of ``storage``, brought up to date and packed
    (:func:`pack_replay`), and where it stands (``where()``, asked of its
    backend at that moment). Optuna offers no public way to take it; this
    reaches its private attributes, under the storage's own lock."""
    with storage._thread_lock:
        storage._sync_with_backend()
        return where(), pack_replay(storage._replay_result)


def records_read(storage: optuna.storages.BaseStorage) -> tuple[int, int]:
    """How many journal records ``storage`` stands for, and how many of them
    it replayed itself (the others came from its snapshot); (0, 0) for a
    storage that is not a journal read through :class:`SnapshotJournal`."""
    backend = getattr(storage, "_backend", None)
    if not isinstance(backend, SnapshotJournal):
        return 0, 0
    if not isinstance(storage, optuna.storages.JournalStorage):
        raise RuntimeError("hpo internal error: what reads a SnapshotJournal")
    total = storage._replay_result.log_number_read
    restored = backend.restored_from.records if backend.restored_from else 0
    return total, total - min(restored, total)


def is_placeholder(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` stands for a finished trial a reader keeps itself."""
    return trial.number < 0


def save_journal_snapshot(storage: optuna.storages.BaseStorage, min_new_records: int = 0) -> bool:
    """Write the snapshot of a journal storage opened with
    :class:`SnapshotJournal` (read-only stores are), when it replayed at least
    ``min_new_records`` records beyond its own snapshot; False when nothing
    was written (another storage, too few new records, not writable)."""
    if not isinstance(storage, optuna.storages.JournalStorage):
        return False
    total, replayed = records_read(storage)
    if total == 0 or replayed < max(min_new_records, 1):
        return False
    try:
        dump = replay_dump(storage)
    except ValueError:  # a value marshal cannot hold: no snapshot
        return False
    backend = storage._backend
    if not isinstance(backend, SnapshotJournal):
        raise RuntimeError("hpo internal error: records_read() counted none otherwise")
    return dump is not None and write_snapshot(backend.path, STORE_SNAPSHOT, dump[0], store_payload(dump[1]))
