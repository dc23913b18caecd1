"""A study's run directory: ``study.json``, the store, per-trial checkpoints.

Layout of a run directory (``runs/<study-name>/``)::

    study.json     the normalised space and the storage URL (written once; the
                   default journal is recorded relative to the directory, so a
                   run directory copied elsewhere still opens)
    journal.log    Optuna journal (the default storage; fsync'd appends, safe on
                   NFS/GPFS across nodes thanks to its symlink lock)
    trials/<n>/    per-trial checkpoint directories
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from hpo.errors import UsageError
from hpo.store._files import write_atomically
from hpo.store._study import StudyStore, open_storage

__all__ = ["RunDir", "JOURNAL_FILE"]

JOURNAL_FILE = "journal.log"
_STUDY_FILE = "study.json"
_RUN_DIR_FIX = "  fix: pass the directory `hpo run` created, e.g. runs/<study-name>"


@dataclass(frozen=True)
class RunDir:
    """A study's run directory and the facts written in its ``study.json``."""

    path: Path

    @property
    def study_file(self) -> Path:
        return self.path / _STUDY_FILE

    def checkpoint_dir(self, number: int) -> Path:
        """Per-trial directory on shared storage; a retried trial finds it again."""
        return self.path / "trials" / f"{number:06d}"

    def check(self, spec: dict[str, Any], storage: str | None) -> None:
        """Refuse to resume a different study here (its results would mix)."""
        if not self.study_file.exists():
            return
        existing = self.read()
        if existing["spec"]["space"] != spec["space"]:
            raise UsageError(
                f"{self.path} already holds study {existing['spec']['name']!r} with a "
                "different search space; resuming would mix results.\n"
                "  fix: give the study another \"name\" (--name), pass --runs-dir, or remove "
                f"{self.path}")
        if storage and storage != existing["storage"]:
            raise UsageError(f"{self.path} uses storage {existing['storage']!r}, not {storage!r}.\n"
                             "  fix: drop --storage to resume, or use another run directory")

    def create(self, spec: dict[str, Any], storage: str | None) -> str:
        """Create the directory (or reopen it, see :meth:`check`) and return the
        storage URL; an existing study keeps its storage."""
        self.check(spec, storage)
        if not self.study_file.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            record = {"spec": spec, "storage": storage or JOURNAL_FILE}
            write_atomically(self.study_file, json.dumps(record, indent=2))
        return self.storage_url()

    def storage_url(self) -> str:
        """The storage URL, with the default journal as an absolute path
        (workers on other nodes run in other directories)."""
        return self._url(self.read())

    def _url(self, info: dict[str, Any]) -> str:
        url = info["storage"]
        return url if "://" in url else str((self.path / url).resolve())

    def read(self) -> dict[str, Any]:
        """The ``study.json`` content; a clear error when this is no run directory."""
        if not self.path.is_dir():
            raise UsageError(f"{self.path}: no such directory.\n{_RUN_DIR_FIX}")
        if not self.study_file.is_file():
            raise UsageError(f"{self.path}: not a run directory (no {_STUDY_FILE}).\n{_RUN_DIR_FIX}")
        return json.loads(self.study_file.read_text())

    def open_store(self, read_only: bool = False) -> StudyStore:
        """The study's store; ``read_only`` never creates or changes anything
        (the dashboard), and refuses a store that is missing."""
        info = self.read()
        url, name = self._url(info), info["spec"]["name"]
        storage = _open_read_only(url, self.path) if read_only else open_storage(url)
        try:
            return StudyStore(storage, name)
        except KeyError:
            raise UsageError(
                f"{self.path}: the store holds no study named {name!r} yet.\n"
                "  fix: wait until `hpo run` has created it, or pass the right run directory"
            ) from None

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


def _open_read_only(url: str, place: Path) -> optuna.storages.BaseStorage:
    """Open the storage without creating or changing anything."""
    if "://" not in url:
        if not os.path.isfile(url):
            # Optuna's journal backend would create an empty file: refuse instead.
            raise UsageError(
                f"{place}: the study's journal {url} is missing.\n"
                "  fix: pass a run directory whose study has started (hpo run SPACE.json)")
        # The lock is only taken to append; reading never touches it.
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not os.path.isfile(path):
            raise UsageError(f"{place}: the study's database {path} is missing.\n"
                             "  fix: pass a run directory whose study has started")
        # SQLite's read-only mode: even a bug here could not write to the store.
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    return optuna.storages.RDBStorage(url, skip_compatibility_check=True, skip_table_creation=True)
