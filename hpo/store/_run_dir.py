"""A study's run directory: ``study.json``, the store, per-trial checkpoints.

Layout of a run directory (``runs/<study-name>/``)::

    study.json     the normalised space and the storage URL (written once; the
                   default journal is recorded relative to the directory, so a
                   run directory copied elsewhere still opens)
    journal.log    Optuna journal (the default storage; fsync'd appends, safe on
                   NFS/GPFS across nodes thanks to its symlink lock)
    journal.log.torn-<time>, journal.log.damaged-<time>
                   bytes a repair set aside (hpo.store._journal), never deleted
    journal.log.snapshot, journal.log.views
                   optional shortcuts for readers (hpo.store._snapshot): the
                   state of a journal prefix; ignored unless they match it
    master.lease   the master that holds the study (hpo.store._lease)
    control.json   the study's decisions, for trials that cannot reach its
                   relay (hpo.store._control)
    trials/<n>/    per-trial checkpoint directories

The directory is its owner's alone (mode 0700, set by each master), and the
files the store writes are 0600: nobody else may read the study's results or
write to its store (docs/guide/security.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from hpo.errors import UsageError
from hpo.store import _snapshot
from hpo.store._control import CONTROL_FILE
from hpo.store._files import PRIVATE_DIR, PRIVATE_FILE, write_atomically
from hpo.store._journal import repair_journal
from hpo.store._lease import MasterLease
from hpo.store._snapshot import Mark, SnapshotJournal, save_journal_snapshot
from hpo.store._study import StudyStore, open_storage

__all__ = ["RunDir", "JOURNAL_FILE"]

JOURNAL_FILE = "journal.log"
_STUDY_FILE = "study.json"
# What defines a study's results: resuming with one of these changed would
# rank new trials with old ones that answered another question.
_DEFINING = ("space", "fixed", "objective", "metric.name", "metric.direction")
_RUN_DIR_FIX = "  fix: pass the directory `hpo run` created, e.g. runs/<study-name>"


def _is_record(info: object) -> bool:
    """Whether ``info`` has what is read of a ``study.json`` (a damaged one may not)."""
    if not isinstance(info, dict):
        return False
    spec = info.get("spec")
    return (isinstance(spec, dict) and isinstance(info.get("storage"), str)
            and isinstance(spec.get("name"), str) and isinstance(spec.get("space"), dict)
            and all(isinstance(m, dict) and isinstance(m.get("name"), str) for m in _metric_list(spec)))


def _metric_list(spec: dict[str, Any]) -> list[Any]:
    """The spec's objectives: its "metric" object, or its list of them."""
    metric = spec.get("metric")
    return metric if isinstance(metric, list) and metric else [metric]


@dataclass(frozen=True)
class RunDir:
    """A study's run directory and the facts written in its ``study.json``
    (``path``: a :class:`~pathlib.Path` or a string naming it)."""

    path: Path

    def __post_init__(self) -> None:
        # A tool's script may pass the string it was given on its command line.
        object.__setattr__(self, "path", Path(self.path))

    @property
    def study_file(self) -> Path:
        return self.path / _STUDY_FILE

    @property
    def control_file(self) -> Path:
        """The study's decisions for trials that cannot reach its relay."""
        return self.path / CONTROL_FILE

    def checkpoint_dir(self, number: int) -> Path:
        """Per-trial directory on shared storage; a retried trial finds it again."""
        return self.path / "trials" / f"{number:06d}"

    def check(self, spec: dict[str, Any], storage: str | None, allow_changes: bool = False) -> None:
        """Refuse to resume a different study here (its results would mix)."""
        if not self.study_file.exists():
            return
        existing = self.read()
        for key in _DEFINING:
            before, now = _get(existing["spec"], key), _get(spec, key)
            if before != now and not (allow_changes and key != "metric.direction"):
                raise UsageError(self._changed_message(existing["spec"]["name"], key, before, now))
        if storage and storage != existing["storage"]:
            raise UsageError(f"{self.path} uses storage {existing['storage']!r}, not {storage!r}.\n"
                             "  fix: drop --storage to resume, or use another run directory")
        self._refuse_lost_journal(existing)

    def _refuse_lost_journal(self, existing: dict[str, Any]) -> None:
        """A study whose journal vanished while its trials' checkpoints stay
        would start anew over them (trials "complete" without a report):
        refused, with the fix."""
        url = self._url(existing)
        if "://" in url or (os.path.isfile(url) and os.path.getsize(url) > 0):
            return
        trials = self.path / "trials"
        if not (trials.is_dir() and any(trials.iterdir())):
            return  # the study never ran a trial: it may start
        raise UsageError(
            f"{self.path}: the study's journal {url} is missing (or empty), but the run directory "
            "holds its trials' checkpoints (trials/): running again would start a new study over "
            "them.\n  fix: restore the journal from a backup; or start over: move the run "
            f"directory away (mv {self.path} {self.path}.old) or pass another --runs-dir")

    def _changed_message(self, name: str, key: str, before: Any, now: Any) -> str:
        shown = _space_change(before, now) if key == "space" else f" ({_short(before)} there, {_short(now)} now)"
        fix = (f"give the study another name (\"name\" in the space, `hpo run --name`, "
               f"hpo.run(name=...)) or another runs directory (--runs-dir, runs_dir=), "
               f"or remove {self.path}")
        if key != "metric.direction":  # the store ranks trials by its first direction for good
            fix += "; or continue anyway: `hpo run --allow-changes`, hpo.run(allow_changes=True)"
        return (f"{self.path} already holds study {name!r} with a different \"{key}\"{shown}; "
                f"resuming would mix results.\n  fix: {fix}")

    @contextmanager
    def lease(self) -> Iterator[MasterLease]:
        """Hold the study for this master (:class:`~hpo.store.MasterLease`),
        creating the directory; one this call created is removed again if
        nothing was recorded in it."""
        created = not self.path.exists()
        try:
            self._make_private()
        except (FileExistsError, NotADirectoryError):
            raise UsageError(f"{self.path}: a file is in the way of the run directory.\n"
                             "  fix: pass --runs-dir naming a directory") from None
        except PermissionError:
            raise UsageError(f"{self.path}: cannot create the run directory (permission denied).\n"
                             "  fix: pass --runs-dir naming a directory you can write to") from None
        if not os.access(self.path, os.W_OK):
            raise UsageError(f"{self.path}: the run directory is not writable by this user.\n"
                             "  fix: pass --runs-dir naming a directory you can write to")
        try:
            with MasterLease(self.path) as held:
                yield held
        finally:
            if created and not any(self.path.iterdir()):
                self.path.rmdir()

    def create(self, spec: dict[str, Any], storage: str | None, allow_changes: bool = False) -> str:
        """Create the directory (or reopen it, see :meth:`check`) and return the
        storage URL; an existing study keeps its storage. An allowed change of
        the study is recorded, the earlier definitions kept."""
        self.check(spec, storage, allow_changes)
        if not self.study_file.exists():
            self._make_private()
            record: dict[str, Any] = {"spec": spec, "storage": storage or JOURNAL_FILE}
            write_atomically(self.study_file, json.dumps(record, indent=2))
        elif allow_changes and (record := self.read())["spec"] != spec:
            record["earlier_specs"] = [*record.get("earlier_specs", []), record["spec"]]
            record["spec"] = spec
            write_atomically(self.study_file, json.dumps(record, indent=2))
        url = self.storage_url()
        if "://" not in url:
            _begin_private(url)
        return url

    def _make_private(self) -> None:
        """Create the directory, or take back one others may enter, as its
        owner's alone (``PRIVATE_DIR``): it holds the study's results and its
        store. One made by ``hpo submit`` or an earlier hpo is made private
        by the next master; another user's is left to its owner."""
        self.path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)  # its parents: the umask's
        if self.path.stat().st_mode & 0o777 != PRIVATE_DIR:
            try:
                os.chmod(self.path, PRIVATE_DIR)
            except PermissionError:
                pass

    def storage_url(self) -> str:
        """The storage URL, with the default journal as an absolute path
        (workers on other nodes run in other directories)."""
        return self._url(self.read())

    def _url(self, info: dict[str, Any]) -> str:
        url = info["storage"]
        return url if "://" in url else str((self.path / url).resolve())

    def read(self) -> dict[str, Any]:
        """The ``study.json`` content; a clear error when this is no run directory
        or the file is damaged (not JSON, or without the study's record)."""
        if self.path.is_file():  # a space file, often: its study's directory is meant
            raise UsageError(f"{self.path}: a file, not a run directory.\n  fix: pass the "
                             f"directory its study's results are in, {_run_dir_of(self.path)}")
        if not self.path.is_dir():
            raise UsageError(f"{self.path}: no such directory.\n{_RUN_DIR_FIX}")
        if not os.access(self.path, os.R_OK | os.X_OK):
            raise UsageError(f"{self.path}: not readable by this user (a run directory is its owner's "
                             "alone).\n  fix: run this as the study's owner, or ask them for its "
                             "report (hpo report)")
        if not self.study_file.is_file():
            raise UsageError(f"{self.path}: not a run directory (no {_STUDY_FILE}).\n{_RUN_DIR_FIX}")
        try:
            info = json.loads(self.study_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8 or not JSON
            raise self._damaged(f"cannot be read as JSON ({exc})") from None
        if not _is_record(info):
            raise self._damaged('not a study record: it needs "storage" and a "spec" with '
                                '"name", "metric" and "space"')
        return info

    def _damaged(self, problem: str) -> UsageError:
        return UsageError(
            f"{self.study_file}: {problem}.\n"
            "  fix: restore it from a copy, or delete it and run the same `hpo run` command "
            "again, which writes it anew and resumes the study from its store")

    def open_store(self, read_only: bool = False, seed: tuple[Mark, bytes] | None = None) -> StudyStore:
        """The study's store; ``read_only`` never creates or changes anything
        (the dashboard), and refuses a store that is missing. A read-only
        journal starts from its snapshot, or from ``seed`` (a checked
        snapshot the caller read, see :class:`SnapshotJournal`)."""
        info = self.read()
        url, name = self._url(info), info["spec"]["name"]
        storage = _open_read_only(url, self.path, seed) if read_only else open_storage(url)
        try:
            return StudyStore(storage, name)
        except KeyError:
            raise self._no_study(storage, name) from None

    def _no_study(self, storage: optuna.storages.BaseStorage, name: str) -> UsageError:
        held = ", ".join(repr(study.study_name) for study in storage.get_all_studies())
        if not held:
            return UsageError(
                f"{self.path}: the store holds no study named {name!r} yet.\n"
                "  fix: wait until `hpo run` has created it, or pass the right run directory")
        # study.json's name was edited, or it points at another study's store.
        return UsageError(
            f"{self.path}: the store holds no study named {name!r}, only {held}.\n"
            f"  fix: put the name back in {self.study_file}, or pass the right run directory")

    def repair(self) -> list[str]:
        """Salvage the intact records of a damaged journal
        (:func:`~hpo.store._journal.repair_journal`); lines saying what was done."""
        url = self.storage_url()
        if "://" in url:
            raise UsageError(
                f"{self.path}: the study is stored in {url}; hpo repair is for the journal file "
                "only.\n  fix: repair the database with its own tools (sqlite3 .recover, a "
                "PostgreSQL backup)")
        if not os.path.isfile(url):
            raise UsageError(f"{self.path}: the study's journal {url} is missing; nothing to repair.\n"
                             "  fix: pass a run directory whose study has started")
        return repair_journal(url)

    def save_snapshot(self, min_new_records: int | None = None) -> bool:
        """Write the journal's snapshot (:mod:`hpo.store._snapshot`) when at
        least ``min_new_records`` records (default ``SNAPSHOT_EVERY``) came
        after the last one, so that readers start from it instead of replaying
        the whole journal; False for a database store, or when nothing was
        written."""
        if "://" in self.storage_url():
            return False
        at_least = _snapshot.SNAPSHOT_EVERY if min_new_records is None else min_new_records
        return save_journal_snapshot(self.open_store(read_only=True).storage, at_least)

    def load_study(self) -> optuna.Study:
        """The Optuna study stored for this run directory."""
        return self.open_store().study()

    def store_files(self) -> list[str]:
        """The files whose size and time change with the store ([] for a server)."""
        url = self.storage_url()
        if "://" not in url:
            return [url]
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///"):]
            return [path, path + "-wal"]
        return []


def _begin_private(journal: str) -> None:
    """Create the study's journal, empty and its owner's alone, where none
    is yet: Optuna would create it with the umask's mode, and one outside
    the run directory (``--storage PATH``) would be readable by others."""
    try:
        os.close(os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except OSError:  # there already; or Optuna's opening of it says what is wrong
        pass


def _open_read_only(url: str, place: Path,
                    seed: tuple[Mark, bytes] | None = None) -> optuna.storages.BaseStorage:
    """Open the storage without creating or changing anything."""
    if "://" not in url:
        if not os.path.isfile(url):
            # Optuna's journal backend would create an empty file: refuse instead.
            raise UsageError(
                f"{place}: the study's journal {url} is missing.\n"
                "  fix: pass a run directory whose study has started (hpo run SPACE.json)")
        # The lock is only taken to append; reading never touches it (nor
        # repairs: a torn tail is skipped, damage in the middle refused). A
        # snapshot beside the journal, when it matches, spares the replay of
        # the records it covers.
        return optuna.storages.JournalStorage(SnapshotJournal(url, seed))
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not os.path.isfile(path):
            raise UsageError(f"{place}: the study's database {path} is missing.\n"
                             "  fix: pass a run directory whose study has started")
        # SQLite's read-only mode: even a bug here could not write to the store.
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    return optuna.storages.RDBStorage(url, skip_compatibility_check=True, skip_table_creation=True)


def _run_dir_of(space: Path) -> str:
    """Where ``hpo run SPACE`` keeps its results by default: ``runs/`` and the
    study's name (the space's ``"name"``, else the file's stem)."""
    try:
        name = json.loads(space.read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):  # not a JSON object: no name to read
        name = None
    name = name if isinstance(name, str) and name else space.stem
    return f"runs/{name} (runs/ and the study's name; another parent if it ran with --runs-dir)"


def _get(spec: dict[str, Any], dotted: str) -> Any:
    value: Any = spec
    for part in dotted.split("."):
        if isinstance(value, list):  # several objectives: each one's value
            value = [item.get(part) if isinstance(item, dict) else None for item in value]
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _space_change(before: Any, now: Any) -> str:
    """Which parameters of the space changed, in words (the first few)."""
    before, now = before if isinstance(before, dict) else {}, now if isinstance(now, dict) else {}
    changes = [f'"{name}" added' for name in now if name not in before]
    changes += [f'"{name}" removed' for name in before if name not in now]
    changes += [f'"{name}": {_short(before[name])} there, {_short(now[name])} now'
                for name in before if name in now and before[name] != now[name]]
    if not changes:
        return ""
    return f" (parameters {'; '.join(changes[:3])}{'; ...' if len(changes) > 3 else ''})"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
