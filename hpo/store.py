"""The durable store of a study: an Optuna storage inside a run directory.

Layout of a run directory (``runs/<study-name>/``)::

    study.json     the normalised space and the storage URL (written once; the
                   default journal is recorded relative to the directory, so a
                   run directory copied elsewhere still opens)
    journal.log    Optuna journal (the default storage; fsync'd appends, safe on
                   NFS/GPFS across nodes thanks to its symlink lock)
    trials/<n>/    per-trial checkpoint directories

The storage is the single source of truth: trials are created in it by the
master, workers write reports and results to it directly (each append is
fsync'd before the call returns), and the master learns about finished trials
by reading it. Killing the master therefore loses nothing.

Any SQLAlchemy URL (``sqlite:///...``, ``postgresql://...``) may replace the
journal. SQLite is fine on a local disk; on a shared file system prefer the
journal (SQLite locking over NFS is unreliable).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import optuna

from hpo.errors import UsageError

__all__ = ["RunDir", "open_storage", "JOURNAL_FILE"]

JOURNAL_FILE = "journal.log"
_STUDY_FILE = "study.json"


@lru_cache(maxsize=8)
def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open (once per process) the storage behind ``url``.

    ``url`` is a SQLAlchemy URL when it contains ``://``, else the path of a
    journal file. Workers reuse the cached object across trials, so the journal
    is replayed incrementally rather than from the start for every trial.
    """
    if "://" in url:
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    backend = optuna.storages.journal.JournalFileBackend(url)
    return optuna.storages.JournalStorage(backend)


def _engine_kwargs(url: str) -> dict[str, Any]:
    # Several worker processes write to one SQLite file: wait for the lock
    # instead of failing at once with "database is locked".
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


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

    def create(self, spec: dict[str, Any], storage: str | None) -> str:
        """Create the directory (or reopen it) and return the storage URL.

        A directory that already holds a study keeps its storage; a different
        space there is refused rather than mixed into the old results.
        """
        if self.study_file.exists():
            existing = self.read()
            if existing["spec"]["space"] != spec["space"]:
                raise UsageError(
                    f"{self.path} already holds study {existing['spec']['name']!r} with a "
                    "different search space; resuming would mix results.\n"
                    "  fix: give the study another \"name\", pass --runs-dir, or remove "
                    f"{self.path}"
                )
            if storage and storage != existing["storage"]:
                raise UsageError(
                    f"{self.path} uses storage {existing['storage']!r}, not {storage!r}.\n"
                    "  fix: drop --storage to resume, or use another run directory"
                )
            return self.storage_url()
        self.path.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.study_file, {"spec": spec, "storage": storage or JOURNAL_FILE})
        return self.storage_url()

    def storage_url(self) -> str:
        """The storage URL, with the default journal as an absolute path
        (workers on other nodes run in other directories)."""
        url = self.read()["storage"]
        return url if "://" in url else str((self.path / url).resolve())

    def read(self) -> dict[str, Any]:
        """The ``study.json`` content; a clear error when this is no run directory."""
        if not self.path.is_dir():
            raise UsageError(
                f"{self.path}: no such directory.\n"
                "  fix: pass the directory `hpo run` created, e.g. runs/<study-name>"
            )
        if not self.study_file.is_file():
            raise UsageError(
                f"{self.path}: not a run directory (no {_STUDY_FILE}).\n"
                "  fix: pass the directory `hpo run` created, e.g. runs/<study-name>"
            )
        return json.loads(self.study_file.read_text())

    def load_study(self) -> optuna.Study:
        """The Optuna study stored for this run directory."""
        name = self.read()["spec"]["name"]
        return optuna.load_study(study_name=name, storage=open_storage(self.storage_url()))


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
