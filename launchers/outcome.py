"""How a batch job's study ended, as the store shows it when the study exits.

A signal (USR1 before the walltime, SIGTERM from scancel or the walltime)
stops the study: running trials checkpoint and suspend within the stop
grace, and the study exits 138 or 143. The stop is clean when no trial was
left RUNNING; then the job reports exit 0 to SLURM, since the study is
meant to be continued, and mail or ``afterok`` chains do not see a failure.
The batch script records the ending (``jobs/<id>/ended.json``), so that
``hpo jobs`` can tell later what happened even after the next job changed
the store or SLURM forgot the job.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["CLEAN_STOPS", "progress", "study_ending", "exit_line", "explain"]

# The exit statuses of a study stopped by a signal, and the signal.
CLEAN_STOPS = {138: "SIGUSR1", 143: "SIGTERM"}
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


def study_ending(run_dir: Path, status: int) -> dict[str, Any]:
    """What the study's exit ``status`` and its store say about how it ended."""
    signal = CLEAN_STOPS.get(status)
    try:
        summary, unreadable = progress(run_dir), None
    except Exception as exc:  # the record must be written whatever the store does
        summary, unreadable = None, f"{type(exc).__name__}: {exc}"
    counts = (summary or {}).get("counts", {})
    running = counts.get("RUNNING", 0)
    clean = (status == 0 or signal is not None) and unreadable is None and running == 0
    ending = {"exit_status": status, "reported_exit": 0 if clean else status, "signal": signal,
              "clean": clean, "left_running": running, "suspended": counts.get("SUSPENDED", 0),
              "stop": (summary or {}).get("stopped"),
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if unreadable:
        ending["store_error"] = unreadable
    return ending


def exit_line(ending: dict[str, Any], resubmit: str) -> str:
    """The job's last line of output."""
    status = ending["exit_status"]
    if status == 0:
        return "hpo: study ended (exit 0)"
    if ending["signal"] is None:
        return f"hpo: study exited with status {status}"
    return f"hpo: {explain(ending)}; resume it with: {resubmit}"


def explain(ending: dict[str, Any]) -> str | None:
    """What a recorded ending means for the study (None for an ordinary end)."""
    status, signal = ending["exit_status"], ending.get("signal")
    if status == 0:
        return None
    if signal is None:
        return f"the study exited with status {status}; see the job's output"
    why = _WHY.get(signal, signal)
    if ending.get("clean"):
        return (f"the study stopped cleanly on {why}: {_trials(ending['suspended'])} suspended "
                f"with checkpoints, none left running (exit {status}, reported to SLURM as 0)")
    if ending.get("store_error"):
        return f"the study stopped on {why}; its store could not be read ({ending['store_error']})"
    return (f"the study stopped on {why} but {_trials(ending['left_running'])} still ran when the "
            "stop grace ran out: left RUNNING, resumed from the last checkpoint by the next run")


def _trials(n: int) -> str:
    return f"{n} trial{'' if n == 1 else 's'}"
