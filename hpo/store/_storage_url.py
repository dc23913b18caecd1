"""A storage URL from the user, checked and opened before anything is recorded.

A study whose run directory names a storage that cannot open would fail on
every later command too; one that lives in memory would end with nothing kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpo.errors import UsageError

__all__ = ["check_storage_url"]

_FIX = ("  fix: pass a journal file path, sqlite:////ABSOLUTE/PATH/study.db or "
        "postgresql+psycopg2://USER@HOST/DB, or drop --storage to use the run directory's journal")


def check_storage_url(url: str) -> None:
    """Refuse a storage that keeps nothing or cannot be opened for writing."""
    from hpo.store._study import open_storage

    if "://" not in url:
        _check_journal_path(Path(url))
    else:
        _check_database_url(url)
    try:
        open_storage(url)
    except UsageError:
        raise  # a damaged journal: its own message and fix
    except ImportError as exc:
        raise _no_driver(url, exc) from None
    except Exception as exc:  # SQLAlchemy/Optuna errors: unreachable server, bad path...
        raise UsageError(f"--storage {url}: cannot open it ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}).\n{_FIX}") from None


def _check_journal_path(path: Path) -> None:
    parent = path.resolve().parent
    if path.is_dir():
        raise UsageError(f"--storage {path}: is a directory, not a journal file.\n{_FIX}")
    if not parent.is_dir():
        raise UsageError(f"--storage {path}: the directory {parent} does not exist.\n"
                         f"  fix: create it (mkdir -p {parent}) or pass another path")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise UsageError(f"--storage {path}: not writable by this user.\n"
                         "  fix: pass a path you can write to")


def _check_database_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        raise UsageError(f"--storage {url}: not a storage URL this tool can open.\n{_FIX}") from None
    except ImportError as exc:
        raise _no_driver(url, exc) from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database == ":memory:" or database.startswith("file::memory:"):
            raise UsageError(f"--storage {url}: an in-memory database keeps nothing once the run "
                             "ends; status, resume and the dashboard need a file.\n"
                             "  fix: --storage sqlite:////ABSOLUTE/PATH/study.db")
        directory = Path(database).resolve().parent
        if not directory.is_dir():
            raise UsageError(f"--storage {url}: the directory {directory} does not exist.\n"
                             f"  fix: create it (mkdir -p {directory}) or pass another path")


def _no_driver(url: str, exc: ImportError) -> UsageError:
    return UsageError(f"--storage {url}: its database driver is not installed ({exc}).\n"
                      "  fix: pip install the driver (PostgreSQL: pip install 'hpo[postgres]')")
