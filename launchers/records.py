"""What a run directory remembers of its batch jobs.

``jobs.json``: every submission, so status can find it. Per job, in
``jobs/<id>/``: ``ended.json``, how the study ended (written by the job),
and ``slurm-state.json``, the last state SLURM gave (kept because SLURM
forgets finished jobs after ``MinJobAge``).

SLURM may requeue a job (a node failure, ``scontrol requeue``): the same job
id then runs again from the start of its script. ``ended.json`` belongs to
the latest run; the run that starts moves the earlier run's record aside to
``ended-run<N>.json`` (N: that run's ``SLURM_RESTART_COUNT``), so that no
run overwrites another's.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpo.store import write_atomically

__all__ = ["JOBS_FILE", "append_job", "read_jobs", "job_folder", "read_ending", "write_ending",
           "keep_earlier_ending", "earlier_endings", "last_state", "remember_state"]

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


def keep_earlier_ending(run_dir: Path, job_id: str) -> Path | None:
    """At the start of a run of the job: move the record of its earlier run
    (a requeued job) to ``ended-run<N>.json``; where it went, or None."""
    folder = job_folder(run_dir, job_id)
    earlier = _read(folder / _ENDED)
    if earlier is None:
        return None
    kept = folder / f"ended-run{earlier.get('restart', 0)}.json"
    (folder / _ENDED).replace(kept)
    return kept


def earlier_endings(run_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The records of the job's earlier runs (requeued by SLURM), oldest first."""
    found = [_read(p) for p in job_folder(run_dir, job_id).glob("ended-run*.json")]
    return sorted((e for e in found if e is not None), key=lambda e: e.get("restart", 0))


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
    return datetime.now(UTC).isoformat(timespec="seconds")
