"""The small job-state vocabulary, and SLURM's codes mapped onto it.

SLURM reports two dozen states (``squeue -o %T``, ``scontrol show job``'s
``JobState=``); a user needs to know whether the job waits, runs, or ended and
how. Walltime expiry stays apart from failure: for a study it is normal and
resumable. A code not in the table becomes UNKNOWN, never a guess.
"""

from __future__ import annotations

import enum

__all__ = ["JobState", "SLURM_STATES", "from_slurm"]


class JobState(str, enum.Enum):
    """Where a batch job is."""

    PENDING = "PENDING"      #: queued, not started (priority, resources, dependency)
    RUNNING = "RUNNING"      #: started, or finishing (COMPLETING)
    HELD = "HELD"            #: suspended or held; needs someone to release it
    COMPLETED = "COMPLETED"  #: the batch script exited 0
    FAILED = "FAILED"        #: non-zero exit, node failure, out of memory, launch failure
    TIMEOUT = "TIMEOUT"      #: killed at the walltime; resubmitting resumes the study
    CANCELLED = "CANCELLED"  #: scancel, or the administrator
    MISSING = "MISSING"      #: SLURM no longer knows the job (purged after MinJobAge)
    UNKNOWN = "UNKNOWN"      #: a state this table does not know

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT,
                        JobState.CANCELLED, JobState.MISSING)


# Long names as squeue %T and scontrol print them (squeue's short codes differ).
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.HELD,
    "RESV_DEL_HOLD": JobState.HELD,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.HELD,
    "STOPPED": JobState.HELD,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.TIMEOUT,
    "TIMEOUT": JobState.TIMEOUT,
    "PREEMPTED": JobState.CANCELLED,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
}


def from_slurm(code: str) -> JobState:
    """The JobState of a SLURM state name; UNKNOWN for anything unrecognised.

    >>> from_slurm("COMPLETING"), from_slurm("CANCELLED by 0"), from_slurm("WEIRD")
    (<JobState.RUNNING: 'RUNNING'>, <JobState.CANCELLED: 'CANCELLED'>, <JobState.UNKNOWN: 'UNKNOWN'>)
    """
    # scontrol may append details ("CANCELLED by 0"); squeue may add flags after '+'.
    word = code.strip().split(" ")[0].split("+")[0].upper()
    return SLURM_STATES.get(word, JobState.UNKNOWN)
