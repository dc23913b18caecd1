"""What the master decides about trials outside their objective: stop,
cancel, suspend, and what to do with those an earlier run left behind.

A master that starts on an existing study meets what an earlier run left:
trials still running somewhere (their heartbeat is fresh: wait for them),
trials lost with their worker or master (resumed as themselves from their
checkpoints), suspended trials (resumed), and trials created but never
started (cancelled; their configurations are proposed again).

While it runs, the master stops the study (target reached, time budget
spent: queued tasks cancelled, running trials stop at their next check,
suspended ones end STOPPED), stops cleanly on a signal (running trials
checkpoint and suspend; the next run resumes them), records a trial whose
task the engine could not run as FAILED, and resumes from its checkpoint a
trial whose task ended without a result (its worker lost, under COMPSs).
"""

from __future__ import annotations

import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import optuna

from hpo.engines import Engine
from hpo.errors import EngineLost
from hpo.store import StudyStore
from hpo.store.records import (
    TrialStatus, best_reported, last_sign_of_life, run_of, status_of, task_done,
)
from hpo.trial import SILENT_HEARTBEATS, TrialTask, fell_silent, heartbeat_s, stop_grace_s

__all__ = [
    "InFlight", "task_over", "await_live_trials", "cancel_never_started", "unfinished", "finished", "collect", "stop",
    "cancel_pending", "suspend_running", "stop_suspended", "resume_lost", "LOST_TASK_RETRIES",
]

_RUNNING = optuna.trial.TrialState.RUNNING


@dataclass
class InFlight:
    """A task the engine holds for a trial."""

    task: TrialTask
    handle: Any

    @property
    def trial_id(self) -> int:
        return self.task.trial_id


Flights = MutableMapping[int, InFlight]  # by trial number


# -- what an earlier run left ------------------------------------------------------


def await_live_trials(store: StudyStore, progress: bool) -> None:
    """Trials an earlier master left running may still run somewhere (a Dask
    worker outlives its client): wait until they finish or their heartbeat
    goes stale, so that no trial ever runs twice at once."""
    stale_after = SILENT_HEARTBEATS * heartbeat_s()
    told = False
    while True:
        running = [t for t in store.trials(_RUNNING)
                   if status_of(t) is TrialStatus.RUNNING and not fell_silent(t)]
        if not running:
            return
        if progress and not told:
            print(f"hpo: {len(running)} trials of an earlier run are still running (heartbeat); "
                  f"waiting until they finish or fall silent for {stale_after:g} s", file=sys.stderr)
            told = True
        time.sleep(min(1.0, stale_after / 10))


def cancel_never_started(store: StudyStore) -> None:
    """Trials an earlier master created but no worker started are ended; their
    configurations are proposed again. Started ones are resumed instead."""
    for trial in store.trials(_RUNNING):
        if status_of(trial) is TrialStatus.PENDING:
            store.end_without_result(store.trial_id(trial), "interrupted",
                                     "never started by an earlier run")


def unfinished(store: StudyStore) -> list[optuna.trial.FrozenTrial]:
    """Trials started by an earlier run and not finished: suspended, or lost."""
    return [t for t in store.trials(_RUNNING)
            if status_of(t) in (TrialStatus.SUSPENDED, TrialStatus.RUNNING)]


# -- while the study runs ----------------------------------------------------------


def task_over(store: StudyStore, task: TrialTask) -> bool:
    """Whether the store says ``task`` is over: its trial finished or
    suspended again after a later segment, or it started and fell silent
    (its worker died: COMPSs ignores the failure)."""
    trial = store.trial(task.trial_id)
    return task_done(trial, task.after_segment) or fell_silent(trial)


def finished(engine: Engine, flights: Flights, timeout: float) -> list[int]:
    """The numbers of the in-flight trials whose task is over (waits up to ``timeout`` s)."""
    done = {id(h) for h in engine.wait([f.handle for f in flights.values()], timeout)}
    return [number for number, flight in flights.items() if id(flight.handle) in done]



def collect(store: StudyStore, engine: Engine, flight: InFlight) -> optuna.trial.FrozenTrial:
    """Gather a finished task; the trial as stored. A task the engine could not
    run to its end (a worker lost too often...) leaves its trial FAILED, unless
    the task gave the trial up first (cancelled): then it is resumed as lost."""
    try:
        engine.settle(flight.handle)
    except EngineLost:
        raise  # not this trial's failure: the master leaves, the trial stays resumable
    except Exception as exc:
        trial = store.trial(flight.trial_id)
        if status_of(trial) is TrialStatus.RUNNING and not last_sign_of_life(trial):
            return trial
        store.fail(flight.trial_id, {"type": "EngineError", "message": f"{type(exc).__name__}: {exc}"})
    return store.trial(flight.trial_id)


# A task whose worker died runs again from its checkpoint this many times more
# than ``retries.engine``, as COMPSs's own RETRY would (same worker, then another).
LOST_TASK_RETRIES = 2


def resume_lost(store: StudyStore, trial: optuna.trial.FrozenTrial, engine_retries: int) -> bool:
    """A task ended and left its trial RUNNING: its worker died (COMPSs ignores
    the failure) or it gave the trial up. True: resume it from its checkpoint;
    False: it was lost too often and is now FAILED."""
    run = run_of(trial)
    lost = 1 + sum(1 for a in run.get("previous", []) if (a.get("error") or {}).get("type") == "Lost")
    allowed = LOST_TASK_RETRIES + engine_retries
    if lost <= allowed:
        store.abandon(store.trial_id(trial))  # no heartbeat to wait out
        return True
    store.fail(store.trial_id(trial), {"type": "Lost", "message": (
        f"its task ended without a result {lost} times (a worker lost?); "
        f"{allowed} resumptions allowed (2 + retries.engine)")})
    return False


def stop(store: StudyStore, engine: Engine, flights: Flights, reason: dict[str, Any]) -> None:
    """Stop the study: running trials stop at their next check, queued tasks
    are cancelled, and a chosen segment that has not started ends STOPPED."""
    store.set_stop(reason)
    cancel_pending(store, engine, flights, reason["reason"])
    for number, flight in list(flights.items()):
        trial = store.trial(flight.trial_id)
        if status_of(trial) is TrialStatus.SUSPENDED and not task_done(trial, flight.task.after_segment):
            engine.cancel(flight.handle)  # its next segment has not started
            stop_suspended(store, [flight.trial_id], reason)
            del flights[number]


def cancel_pending(store: StudyStore, engine: Engine, flights: Flights, why: str) -> None:
    """Cancel the queued tasks of trials no worker has started."""
    for number, flight in list(flights.items()):
        if status_of(store.trial(flight.trial_id)) is TrialStatus.PENDING:
            engine.cancel(flight.handle)
            store.end_without_result(flight.trial_id, "cancelled", f"study stopped ({why})")
            del flights[number]


def suspend_running(store: StudyStore, engine: Engine, flights: Flights, signal_name: str) -> None:
    """A clean stop: running trials checkpoint and suspend at their next
    check, for up to ``HPO_STOP_GRACE_S`` (30 s); the next run resumes them."""
    store.set_stop({"reason": signal_name, "resume": True})
    grace = stop_grace_s()
    cancel_pending(store, engine, flights, signal_name)
    if flights:
        print(f"\nhpo: {signal_name}: letting {len(flights)} running trials checkpoint "
              f"(up to {grace:g} s)", file=sys.stderr)
    deadline = time.monotonic() + grace
    while flights and time.monotonic() < deadline:
        for number in finished(engine, flights, 0.2):
            try:
                engine.settle(flights.pop(number).handle)  # releases it: a draining worker waits for that
            except Exception:
                pass  # its trial's record is in the store either way
    for flight in flights.values():
        # Still running when the engine goes: lost with it, to be resumed
        # from its checkpoint at once by the next run (no heartbeat to wait out).
        store.abandon(flight.trial_id)


def stop_suspended(store: StudyStore, trial_ids: list[int], stop: dict[str, Any]) -> None:
    """The study stopped: suspended trials end STOPPED, with their best value so far."""
    maximize = store.maximize
    reason = f"stopped: {stop.get('reason')}"
    for trial_id in trial_ids:
        trial = store.trial(trial_id)
        store.record_event(trial_id, "stopped", None, f"the study stopped while suspended ({reason})")
        store.write_run(trial_id, {**run_of(trial), "suspended": False, "stop_reason": reason})
        store.finish(trial_id, TrialStatus.STOPPED, best_reported(trial, maximize))
