"""What a run directory remembers of its batch jobs.

``jobs.json``: every submission, so status can find it. Per job, in
``jobs/<id>/``: ``ended.json``, how the study ended (written by the job),
and ``slurm-state.json``, the last state SLURM gave (kept because SLURM
forgets finished jobs after ``MinJobAge``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpo.store import write_atomically

__all__ = ["JOBS_FILE", "append_job", "read_jobs", "job_folder", "read_ending", "write_ending",
           "last_state", "remember_state"]

JOBS_FILE = "jobs.json"
_ENDED, _SEEN = "ended.json", "slurm-state.json"


def read_jobs(run_dir: Path) -> list[dict[str, Any]]:
    """The submissions recorded in ``run_dir``, oldest first ([] when none)."""
    path = Path(run_dir) / JOBS_FILE
    if not path.is_file():
        return []
    return json.loads(path.read_text())


def append_job(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Add one submission (stamped with the time) and write the file atomically."""
    record = {**record, "submitted_at": _now()}
    jobs = [*read_jobs(run_dir), record]
    write_atomically(Path(run_dir) / JOBS_FILE, json.dumps(jobs, indent=2) + "\n")
    return record


def job_folder(run_dir: Path, job_id: str) -> Path:
    """``jobs/<id>/``: the job's scheduler file, logs and records."""
    return Path(run_dir) / "jobs" / str(job_id)


def read_ending(run_dir: Path, job_id: str) -> dict[str, Any] | None:
    """How the job's study ended (:func:`hpo.launchers.outcome.study_ending`), if recorded."""
    return _read(job_folder(run_dir, job_id) / _ENDED)


def write_ending(run_dir: Path, job_id: str, ending: dict[str, Any]) -> None:
    _write(job_folder(run_dir, job_id) / _ENDED, ending)


def last_state(run_dir: Path, job_id: str) -> dict[str, Any] | None:
    """The last state SLURM gave for the job (a ``JobStatus`` dict and ``seen_at``)."""
    return _read(job_folder(run_dir, job_id) / _SEEN)


def remember_state(run_dir: Path, job_id: str, state: dict[str, Any]) -> None:
    """Keep SLURM's latest answer about the job (written only when it changed)."""
    known = last_state(run_dir, job_id) or {}
    if {k: v for k, v in known.items() if k != "seen_at"} != state:
        _write(job_folder(run_dir, job_id) / _SEEN, {**state, "seen_at": _now()})


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
