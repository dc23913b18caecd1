"""A stop asked of this process by a signal, not by the study.

A worker or an isolated trial process that receives SIGTERM (``scancel``, a
walltime, a master shutting its cluster down, a parent that died) asks its
running trials to checkpoint and suspend at their next check, and gives them
the stop grace (``HPO_STOP_GRACE_S``) before it exits. The next run resumes
them from their checkpoints, as after a clean stop of the master.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["stop_grace_s", "request_suspend", "suspend_requested", "track_child",
           "untrack_child", "tracked_children", "exit_after_grace"]

_reason: str | None = None
_children: set[int] = set()  # process groups of the isolated trials started here
_lock = threading.Lock()


def stop_grace_s() -> float:
    """Seconds a running trial gets to checkpoint after a stop (``HPO_STOP_GRACE_S``, 30)."""
    return float(os.environ.get("HPO_STOP_GRACE_S", "30"))


def request_suspend(reason: str) -> None:
    """Running trials of this process suspend at their next check; isolated
    trial processes started here are told the same (SIGTERM to their group)."""
    global _reason
    _reason = _reason or reason
    with _lock:
        groups = list(_children)
    for group in groups:
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass


def suspend_requested() -> str | None:
    """Why this process was asked to stop, or None."""
    return _reason


def track_child(group: int) -> None:
    with _lock:
        _children.add(group)


def untrack_child(group: int) -> None:
    with _lock:
        _children.discard(group)


def tracked_children() -> set[int]:
    """The isolated trial processes started here and still running."""
    with _lock:
        return set(_children)


def exit_after_grace(code: int = 143) -> threading.Thread:
    """End this process after the stop grace, whatever the objective is doing
    (a trial blocked in a long step must not outlive its task)."""
    timer = threading.Timer(stop_grace_s(), os._exit, args=(code,))
    timer.daemon = True
    timer.start()
    return timer
