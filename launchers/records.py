"""``jobs.json`` in a run directory: every submission, so status can find it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpo.store import write_atomically

__all__ = ["JOBS_FILE", "append_job", "read_jobs"]

JOBS_FILE = "jobs.json"


def read_jobs(run_dir: Path) -> list[dict[str, Any]]:
    """The submissions recorded in ``run_dir``, oldest first ([] when none)."""
    path = Path(run_dir) / JOBS_FILE
    if not path.is_file():
        return []
    return json.loads(path.read_text())


def append_job(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Add one submission (stamped with the time) and write the file atomically."""
    record = {**record, "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    jobs = [*read_jobs(run_dir), record]
    write_atomically(Path(run_dir) / JOBS_FILE, json.dumps(jobs, indent=2) + "\n")
    return record
