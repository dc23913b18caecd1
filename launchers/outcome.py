"""How a batch job's study ended, as the store shows it when the study exits.

A signal (USR1 before the walltime, SIGTERM from scancel or the walltime)
stops the study: running trials checkpoint and suspend within the stop
grace, and the study exits 138 or 143. The stop is clean when no trial was
left RUNNING; then the job reports exit 0 to SLURM, since the study is
meant to be continued, and mail or ``afterok`` chains do not see a failure.
The batch script records the ending (``jobs/<id>/ended.json``), so that
``hpo jobs`` can tell later what happened even after the next job changed
the store or SLURM forgot the job. Any other exit keeps what the study said
last in the job's output (exit 75: the store stopped taking writes, or
another master took the study over; its message names the fix).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["CLEAN_STOPS", "STUDY_STARTS", "progress", "interrupted", "study_ending",
           "study_message", "exit_line", "explain"]

# The exit statuses of a study stopped by a signal, and the signal.
CLEAN_STOPS = {138: "SIGUSR1", 143: "SIGTERM"}
# The batch script's line just before the study starts (templates/dask.sbatch):
# what follows it in the job's output is the study's.
STUDY_STARTS = "hpo: starting the study"
_SAID_LINES = 8  # at most this much of what the study said is kept
_WHY = {"SIGUSR1": "SIGUSR1 before the walltime", "SIGTERM": "SIGTERM (scancel or the walltime)"}


def progress(run_dir: Path) -> dict[str, Any] | None:
    """The study's summary (``hpo status --json``), or None before it stored anything."""
    from hpo.results import StudyResult

    if not (Path(run_dir) / "study.json").is_file():
        return None
    try:
        return StudyResult.load(run_dir).summary()
    except (KeyError, ValueError):  # study.json written, no trial stored yet
        return None


def _stored_trials(run_dir: Path) -> list:
    """The study's trials as stored ([] before it stored any)."""
    from hpo.store import RunDir

    if not (Path(run_dir) / "study.json").is_file():
        return []
    try:
        return RunDir(Path(run_dir)).open_store(read_only=True).trials()
    except (KeyError, ValueError):  # study.json written, no study stored yet
        return []


def interrupted(run_dir: Path) -> int:
    """Trials stored RUNNING whose attempt is not live: no master holds the
    study and the trial fell silent. Their master ended (a fault, a fenced
    master, a job killed); the next run resumes them."""
    from hpo.store import MasterLease
    from hpo.store.records import TrialStatus, last_sign_of_life, status_of
    from hpo.trial import silence_s

    if MasterLease(run_dir).holder() is not None:  # a live master will settle them
        return 0
    now = time.time()
    return sum(1 for t in _stored_trials(run_dir) if status_of(t) is TrialStatus.RUNNING
               and now - last_sign_of_life(t) >= silence_s())


def _unsaved(run_dir: Path) -> int:
    """Suspended trials that saved no checkpoint: the next run starts them over."""
    from hpo.master import saved_no_checkpoint

    return sum(1 for t in _stored_trials(run_dir) if saved_no_checkpoint(t))


def study_ending(run_dir: Path, status: int) -> dict[str, Any]:
    """What the study's exit ``status`` and its store say about how it ended."""
    signal = CLEAN_STOPS.get(status)
    try:
        summary, unsaved, unreadable = progress(run_dir), _unsaved(run_dir), None
    except Exception as exc:  # the record must be written whatever the store does
        summary, unsaved, unreadable = None, 0, f"{type(exc).__name__}: {exc}"
    counts = (summary or {}).get("counts", {})
    running = counts.get("RUNNING", 0)
    clean = (status == 0 or signal is not None) and unreadable is None and running == 0
    ending = {"exit_status": status, "reported_exit": 0 if clean else status, "signal": signal,
              "clean": clean, "left_running": running, "suspended": counts.get("SUSPENDED", 0),
              "no_checkpoint": unsaved, "stop": (summary or {}).get("stopped"),
              "at": datetime.now(UTC).isoformat(timespec="seconds")}
    if unreadable:
        ending["store_error"] = unreadable
    return ending


def study_message(output: str) -> list[str]:
    """What the study said last in a job's output, for an exit that is
    neither a clean stop nor a success: its last ``hpo:`` line with the
    indented lines under it (its fix), else the last lines it printed.
    Only this run's study counts: the lines after the last STUDY_STARTS."""
    lines = output.split(STUDY_STARTS + "\n")[-1].splitlines() if STUDY_STARTS in output else []
    lines = [line for line in lines if line.strip()]
    said = [i for i, line in enumerate(lines) if line.startswith("hpo: ")]
    if said and all(line.startswith(" ") for line in lines[said[-1] + 1:]):
        return lines[said[-1]:][:_SAID_LINES]
    return lines[-_SAID_LINES:]


def exit_line(ending: dict[str, Any], resubmit: str) -> str:
    """The job's last line of output."""
    status = ending["exit_status"]
    if status == 0:
        return "hpo: study ended (exit 0)"
    if ending.get("requeued"):
        return (f"hpo: {explain(ending)}; SLURM requeued this job: it runs again and resumes "
                "the study by itself, nothing to resubmit")
    if ending["signal"] is None:
        return (f"hpo: study exited with status {status}; once what it said above is fixed, "
                f"resume it with: {resubmit}")
    return f"hpo: {explain(ending)}; resume it with: {resubmit}"


def explain(ending: dict[str, Any]) -> str | None:
    """What a recorded ending means for the study (None for an ordinary end)."""
    status, signal = ending["exit_status"], ending.get("signal")
    if status == 0:
        return None
    if signal is None:
        said = ending.get("said") or []
        if said and said[0].startswith("hpo: "):
            return f"the study exited with status {status}: {_without_prefix(said[0])}"
        return f"the study exited with status {status}; see the job's output"
    why = _WHY.get(signal, signal)
    if ending.get("requeued") and signal == "SIGTERM":
        why = "SIGTERM (SLURM requeued the job)"
    if ending.get("clean"):
        return (f"the study stopped cleanly on {why}: {_suspended(ending)}, none left running "
                f"(exit {status}, reported to SLURM as 0)")
    if ending.get("store_error"):
        return f"the study stopped on {why}; its store could not be read ({ending['store_error']})"
    return (f"the study stopped on {why} but {_trials(ending['left_running'])} still ran when the "
            "stop grace ran out: left RUNNING, resumed from the last checkpoint by the next run")


def _suspended(ending: dict[str, Any]) -> str:
    """The trials a clean stop suspended, and those of them without a checkpoint."""
    n, unsaved = ending["suspended"], ending.get("no_checkpoint", 0)
    if not unsaved:
        return f"{_trials(n)} suspended with checkpoints"
    if unsaved == n:
        return f"{_trials(n)} suspended without a checkpoint (the next run starts them over)"
    return (f"{_trials(n)} suspended, {unsaved} of them without a checkpoint (the next run "
            "starts those over)")


def _without_prefix(line: str) -> str:
    for prefix in ("hpo: error: ", "hpo: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line


def _trials(n: int) -> str:
    return f"{n} trial{'' if n == 1 else 's'}"
