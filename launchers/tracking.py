"""The jobs of a run directory as SLURM sees them now (or last saw them),
and the rule that a study has one job at a time.

SLURM forgets a finished job after ``MinJobAge``; the state it gave last is
kept in the run directory (:func:`hpo.launchers.records.remember_state`) and
shown instead of MISSING, else what the job recorded at its end
(``ended.json``).

A job that ended may run again: SLURM requeues it (a node failure,
``scontrol requeue``) under the same id. So an ending record never settles
whether a job is still to run: SLURM's queue does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.launchers.records import last_state, read_ending, read_jobs, remember_state
from hpo.launchers.slurm import JobStatus, SlurmProvider
from hpo.launchers.states import JobState

__all__ = ["ACTIVE", "job_statuses", "check_free"]

# A job in one of these states will still run the study.
ACTIVE = (JobState.PENDING, JobState.RUNNING, JobState.HELD)


def job_statuses(run_dir: Path, job_ids: list[str],
                 provider: SlurmProvider | None = None) -> dict[str, JobStatus]:
    """Each job's status: SLURM's answer, remembered; what SLURM last said
    about a job it has since forgotten."""
    statuses = (provider or SlurmProvider()).status(job_ids)
    return {job_id: _with_memory(Path(run_dir), s) for job_id, s in statuses.items()}


def _with_memory(run_dir: Path, status: JobStatus) -> JobStatus:
    if status.state is JobState.MISSING:
        seen = last_state(run_dir, status.job_id)
        if seen is None:
            return _as_recorded(status, read_ending(run_dir, status.job_id))
        known = JobStatus.from_dict(seen)
        if not known.state.finished:  # it ended unseen: say what was seen, not that it runs
            return dataclasses.replace(status, reason=f"no longer known to SLURM; last seen "
                                       f"{known.state.value} at {seen.get('seen_at')}")
        return dataclasses.replace(known, reason=f"as last seen at {seen.get('seen_at')}; "
                                   "no longer known to SLURM")
    if status.state is not JobState.UNKNOWN:
        try:
            remember_state(run_dir, status.job_id, status.to_dict())
        except OSError:  # a run directory we may not write: still shown, not kept
            pass
    return status


def _as_recorded(status: JobStatus, ending: dict[str, Any] | None) -> JobStatus:
    """A job SLURM forgot before anyone asked about it: how it ended by its
    own record, else MISSING."""
    if ending is None:
        return status
    reported = ending.get("reported_exit", ending.get("exit_status"))
    if reported != 0:
        state = JobState.FAILED
    elif ending.get("signal") == "SIGTERM":  # scancel, or the walltime
        state = JobState.CANCELLED
    else:
        state = JobState.COMPLETED
    return dataclasses.replace(status, state=state, exit_code=f"{reported}:0", reason=(
        f"no longer known to SLURM; as the job recorded at its end ({ending.get('at')})"))


def check_free(run_dir: Path, after: str | None, provider: SlurmProvider | None = None) -> None:
    """Refuse a second job for the study in ``run_dir`` while one is queued or
    running (also one SLURM requeued after it ended), or while a live master
    holds the study, unless the new job is queued behind it (``--after`` the
    latest one)."""
    provider = provider or SlurmProvider()
    jobs = [r["job_id"] for r in read_jobs(run_dir)]
    queued = provider.queued(jobs)
    maybe = [j for j in jobs if j in queued or _may_be_active(run_dir, j)]
    statuses = job_statuses(run_dir, maybe, provider) if maybe else {}
    active = [job_id for job_id, s in statuses.items() if s.state in ACTIVE]
    if active and after != active[-1]:
        latest = statuses[active[-1]]
        raise UsageError(
            f"{run_dir}: SLURM job {latest.job_id} ({latest.state.value}) already runs this study; "
            f"a second job would run its trials twice.\n  fix: wait for it to end (hpo jobs "
            f"{run_dir}), scancel {latest.job_id}, or queue the continuation behind it with "
            f"--after {latest.job_id}")
    holder = _lease_holder(run_dir)
    if holder is not None and (after is None or str(holder.get("slurm_job")) not in {after, *active}):
        job = f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""
        raise UsageError(
            f"{run_dir}: a master runs this study now (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}{job}); a second would run its trials twice.\n"
            "  fix: wait for it to end, or stop it (kill -TERM its pid on its host, or scancel "
            "its job); to queue a continuation behind a SLURM job, pass --after JOB_ID")


def _may_be_active(run_dir: Path, job_id: str) -> bool:
    """False for a job known to have ended and not in SLURM's queue again:
    SLURM need not be asked about it."""
    if read_ending(run_dir, job_id) is not None:
        return False
    seen = last_state(run_dir, job_id)
    return seen is None or not JobStatus.from_dict(seen).state.finished


def _lease_holder(run_dir: Path) -> dict[str, Any] | None:
    """The live master holding the study, or None.

    The lease (``hpo.store.MasterLease``, ``master.lease`` in the run
    directory) is taken by every master, wherever it was started; ``holder()``
    is None when the study is free or its lease went stale.
    """
    from hpo.store import MasterLease

    return MasterLease(run_dir).holder()
