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

import socket
import sys
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import optuna

from hpo.engines import Engine, gather
from hpo.errors import EngineLost, StoreUnavailable
from hpo.store import MACHINE_FAULTS, StudyStore, process_alive, unwritable
from hpo.store.records import (
    UNFINISHED_STATES,
    TrialStatus,
    attr_of,
    best_reported,
    last_sign_of_life,
    run_of,
    status_of,
    task_done,
)
from hpo.trial import (
    SILENT_HEARTBEATS,
    TrialTask,
    ended_the_interpreter,
    fell_silent,
    heartbeat_s,
    note_awake,
    stop_grace_s,
)

__all__ = [
    "InFlight", "task_over", "await_live_trials", "fail_master_killers", "MASTER_DEATHS", "nothing_left",
    "saved_no_checkpoint", "NO_CHECKPOINT",
    "fallen_silent", "machine_fault", "never_started", "unfinished", "finished", "collect", "stop",
    "cancel_pending", "suspend_running", "stop_suspended", "resume_lost", "LOST_TASK_RETRIES",
]


@dataclass
class InFlight:
    """A task the engine holds for a trial."""

    task: TrialTask
    future: Future  # the engine's, done when the task is over
    # When it was handed to the engine (read before the hand-over: the task
    # may start at once): only an attempt started since is this task's.
    submitted_at: float

    @property
    def trial_id(self) -> int:
        return self.task.trial_id


Flights = MutableMapping[int, InFlight]  # by trial number


# -- what an earlier run left ------------------------------------------------------


def await_live_trials(store: StudyStore, progress: bool, heard_until: Callable[[], float]) -> None:
    """Trials an earlier master left running may still run somewhere (a Dask
    worker outlives its client): wait until they finish or their heartbeat
    goes stale, so that no trial ever runs twice at once. ``heard_until``:
    the relay's (:func:`fallen_silent`)."""
    stale_after = SILENT_HEARTBEATS * heartbeat_s()
    told = False
    while True:
        running = [t for t in store.trials(*UNFINISHED_STATES) if status_of(t) is TrialStatus.RUNNING
                   and not fell_silent(t, heard_until()) and not _gone_from_here(t)]
        if not running:
            return
        if progress and not told:
            print(f"hpo: {len(running)} trials of an earlier run are still running (heartbeat); "
                  f"waiting until they finish or fall silent for {stale_after:g} s", file=sys.stderr)
            told = True
        time.sleep(min(1.0, stale_after / 10))


def _gone_from_here(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial's attempt ran on this host in a process that is gone:
    lost for certain, no heartbeat to wait out."""
    run = run_of(trial)
    return run.get("host") == socket.gethostname() and not process_alive(run.get("pid"))


# A trial whose objective ended the master's process (run inside it) this many
# times is failed (it would otherwise end every run of the study).
MASTER_DEATHS = 2
# The attempts of a trial whose objective ended the master, as the next master read them.
_ENDED_MASTER = "hpo:ended_master"


def fail_master_killers(store: StudyStore) -> None:
    """Trials the master died inside (``--engine inline``): failed, with the
    reason, once their objective ended the interpreter ``MASTER_DEATHS``
    times (its log says so); else said, and resumed. A master killed from
    outside (out of memory, a preemption) is not the trial's doing: the
    trial only runs again."""
    for trial in store.trials(*UNFINISHED_STATES):
        run = run_of(trial)
        if status_of(trial) is not TrialStatus.RUNNING or not run.get("in_master"):
            continue
        how = ended_the_interpreter(run)
        deaths = len(_ended_master(store, trial, run.get("attempt") if how else None))
        if deaths >= MASTER_DEATHS:
            store.fail(store.trial_id(trial), {"type": "EndedTheMaster", "message": (
                f"the master's process ended while this trial ran inside it, {deaths} times "
                f"(--engine inline), by its objective's own hand (last: {how}); its objective ends "
                "the interpreter (os._exit, a crash in native code?). Run it with --engine dask, "
                "whose workers a trial cannot take down")})
        elif how:  # a warning, quiet or not
            print(f"hpo: trial {trial.number} was running inside the master when it ended "
                  f"(--engine inline; {how}); running it again: a second time fails it", file=sys.stderr)
        else:
            print(f"hpo: trial {trial.number} was running inside the master when it ended, not by "
                  "the trial's doing (a signal, out of memory?); running it again", file=sys.stderr)


def _ended_master(store: StudyStore, trial: optuna.trial.FrozenTrial, attempt: int | None) -> list[int]:
    """The attempts of ``trial`` whose objective ended the master, ``attempt``
    (None: no new one) counted once, however many masters read it."""
    ended = list(attr_of(trial, _ENDED_MASTER) or [])
    if attempt is not None and attempt not in ended:
        ended.append(attempt)
        store.write(store.trial_id(trial), _ENDED_MASTER, ended)
    return ended


def nothing_left(store: StudyStore, max_trials: int) -> str | None:
    """Why a study has nothing left to run: its target was reached, or its
    budget is used with no trial unfinished; None when something is left."""
    stop = store.stop() or {}
    if stop.get("reason") == "target":
        return f"its target was reached by trial {stop.get('trial')}"
    trials = store.trials()
    if any(not status_of(t).is_finished for t in trials):
        return None
    counted = sum(1 for t in trials if status_of(t) is not TrialStatus.CANCELLED)
    return f"all {counted} of its trials ran" if counted >= max_trials else None


def never_started(store: StudyStore) -> list[optuna.trial.FrozenTrial]:
    """Trials an earlier master created but no worker started (a clean stop
    hands them back; a master that died leaves them): the next master runs
    them first, as they are, so a stop and resume adds no trial and counts
    none as cancelled."""
    return [t for t in store.trials(*UNFINISHED_STATES) if status_of(t) is TrialStatus.PENDING]


def unfinished(store: StudyStore) -> list[optuna.trial.FrozenTrial]:
    """Trials started by an earlier run and not finished: suspended, or lost."""
    return [t for t in store.trials(*UNFINISHED_STATES)
            if status_of(t) in (TrialStatus.SUSPENDED, TrialStatus.RUNNING)]


# -- while the study runs ----------------------------------------------------------


def task_over(store: StudyStore, task: TrialTask, heard_until: float | None = None) -> bool:
    """Whether the store says ``task`` is over: its trial finished or
    suspended again after a later segment, or it started and fell silent
    (its worker died: COMPSs ignores the failure), judged up to
    ``heard_until`` (:func:`fallen_silent`; default now)."""
    trial = store.trial(task.trial_id)
    return task_done(trial, task.after_segment) or fell_silent(trial, heard_until)


def finished(engine: Engine, flights: Flights, timeout: float, settle: Callable[[], None]) -> list[int]:
    """The numbers of the in-flight trials whose task is over (waits up to
    ``timeout`` s of the engine's clock), their ends durable and in the
    replica: ``settle`` (the relay's) makes those their tasks posted so."""
    done = engine.clock.wait([f.future for f in flights.values()], timeout)
    ended = [number for number, flight in flights.items() if flight.future in done]
    if ended:
        settle()
    return ended



def fallen_silent(store: StudyStore, flights: Flights, looked: list[float], now: float,
                  heard_until: float) -> list[int]:
    """In-flight trials whose attempt fell silent while the engine still
    holds their task (a worker hung, stopped, or cut off, yet still
    connected): to be given up (``Abandons.abandon``) and resumed elsewhere at
    once; the attempt, should it come back, is fenced off. Looked at once a
    heartbeat, with silence counted from when the master woke if it slept
    (:func:`hpo.trial.note_awake`), and only up to ``heard_until``, the
    relay's (:meth:`hpo.store.StudyRelay.heard_until`): heartbeats a held-up
    relay has yet to commit are not silence. ``now`` is the engine's clock."""
    note_awake()
    if now - looked[0] < heartbeat_s():
        return []
    looked[0] = now
    return [number for number, flight in flights.items()
            if status_of(trial := store.trial(flight.trial_id)) is TrialStatus.RUNNING
            and _started_since(trial, flight.submitted_at) and fell_silent(trial, heard_until)]


def _started_since(trial: optuna.trial.FrozenTrial, submitted_at: float) -> bool:
    """Whether the trial's current attempt or segment is the task's own: an
    earlier master's attempt, silent because it died, says nothing of the
    worker that holds the new task and has yet to start it."""
    return (run_of(trial).get("segment_started_at") or 0.0) >= submitted_at


def collect(store: StudyStore, flight: InFlight) -> optuna.trial.FrozenTrial:
    """Gather a finished task; the trial as stored. A task the engine could not
    run to its end (a worker lost too often...) leaves its trial FAILED, unless
    the task gave the trial up first (cancelled): then it is resumed as lost."""
    try:
        gather(flight.future)
    except (EngineLost, StoreUnavailable):
        raise  # not this trial's failure: the master leaves, the trial stays resumable
    except Exception as exc:
        trial = store.trial(flight.trial_id)
        if status_of(trial) is TrialStatus.RUNNING and not last_sign_of_life(trial):
            return trial
        store.fail(flight.trial_id, {"type": "EngineError", "message": f"{type(exc).__name__}: {exc}"})
    return store.trial(flight.trial_id)


def machine_fault(trial: optuna.trial.FrozenTrial) -> StoreUnavailable | None:
    """Why to stop the study when a trial was given up because its file
    system filled up or turned read-only, or its node could not stage its
    data (every next trial would meet it too), or None."""
    error = run_of(trial).get("error") or {}
    staging = error.get("staging")
    if staging:  # its node could not stage its data (hpo.data): the node's words
        return StoreUnavailable(
            f"trial {trial.number} could not stage its data on {staging['host']}: "
            f"{staging['problem']}. Nothing was recorded as a trial's failure.\n  fix: "
            f"{staging['fix']}; then run the same command again: the trials cut short resume "
            "from their checkpoints")
    if error.get("errno") not in MACHINE_FAULTS:
        return None
    return unwritable(error.get("filename") or ".", error["errno"],
                      f"trial {trial.number}: {error.get('type')}: {error.get('message')}")


# A task whose worker died runs again from its checkpoint this many times more
# than ``retries.engine``, as COMPSs's own RETRY would (same worker, then another).
LOST_TASK_RETRIES = 2


def resume_lost(store: StudyStore, trial: optuna.trial.FrozenTrial, engine_retries: int) -> bool:
    """A task ended and left its trial RUNNING: its worker died (COMPSs ignores
    the failure) or it gave the trial up. True: resume it from its checkpoint;
    False: it ended, lost too often (now FAILED) or finished by the attempt
    given up, which went on meanwhile (its end stands)."""
    run = run_of(trial)
    lost = 1 + sum(1 for a in run.get("previous", []) if (a.get("error") or {}).get("type") == "Lost")
    allowed = LOST_TASK_RETRIES + engine_retries
    if lost <= allowed:
        return store.abandon(store.trial_id(trial))  # no heartbeat to wait out
    store.fail(store.trial_id(trial), {"type": "Lost", "message": (
        f"its task ended without a result {lost} times (a worker lost?); "
        f"{allowed} resumptions allowed (2 + retries.engine)")})
    return False


def stop(store: StudyStore, flights: Flights, reason: dict[str, Any]) -> None:
    """Stop the study: running trials stop at their next check, queued tasks
    are cancelled, and a chosen segment that has not started ends STOPPED."""
    store.set_stop(reason)
    cancel_pending(store, flights, reason["reason"])
    for number, flight in list(flights.items()):
        trial = store.trial(flight.trial_id)
        if status_of(trial) is TrialStatus.SUSPENDED and not task_done(trial, flight.task.after_segment):
            flight.future.cancel()  # its next segment has not started
            stop_suspended(store, [flight.trial_id], reason)
            del flights[number]


def cancel_pending(store: StudyStore, flights: Flights, why: str,
                   hand_back: bool = False) -> None:
    """Cancel the queued tasks of trials no worker has started: their trials
    end CANCELLED, or, handed back (a clean stop to be resumed), stay
    PENDING for the next run to start."""
    for number, flight in list(flights.items()):
        if status_of(store.trial(flight.trial_id)) is TrialStatus.PENDING:
            flight.future.cancel()
            if not hand_back:
                store.end_without_result(flight.trial_id, "cancelled", f"study stopped ({why})")
            del flights[number]


def suspend_running(store: StudyStore, engine: Engine, flights: Flights, signal_name: str,
                    settle: Callable[[], None]) -> None:
    """A clean stop: running trials checkpoint and suspend at their next
    check, for up to ``HPO_STOP_GRACE_S`` (30 s); the next run resumes them.
    A trial whose process is gone is not waited for; a second Ctrl-C
    (KeyboardInterrupt) ends the wait at once. Either way, trials still
    running are handed back: the next run resumes them from their checkpoints."""
    store.set_stop({"reason": signal_name, "resume": True})
    grace = stop_grace_s()
    cancel_pending(store, flights, signal_name, hand_back=True)
    if flights:
        again = "; Ctrl-C again exits at once" if signal_name == "SIGINT" else ""
        trials = "1 running trial" if len(flights) == 1 else f"{len(flights)} running trials"
        print(f"\nhpo: {signal_name}: letting {trials} checkpoint "
              f"(up to {grace:g} s){again}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + grace
    stopped = [flight.trial_id for flight in flights.values()]  # however each ends below
    try:
        while flights and time.monotonic() < deadline:
            for number in finished(engine, flights, 0.2, settle):
                _release(flights.pop(number).future)  # a draining worker waits for that
            for number in _gone(store, flights):  # nothing left to checkpoint: no wait
                flight = flights.pop(number)
                flight.future.cancel()  # not run again now: the next run resumes it
                _hand_back(store, flight.trial_id)
    finally:
        for flight in flights.values():
            # Still running when the engine goes: lost with it, to be resumed
            # from its checkpoint at once by the next run (no heartbeat to wait out).
            _hand_back(store, flight.trial_id)
    unsaved = sorted(store.trial(t).number for t in stopped if saved_no_checkpoint(store.trial(t)))
    if unsaved:
        print(f"hpo: trial(s) {', '.join(map(str, unsaved))} saved no checkpoint while they ran: "
              f"{NO_CHECKPOINT}", file=sys.stderr)


#: What a trial suspended without a checkpoint does next, and the fix.
NO_CHECKPOINT = ("unless the objective goes on from trial.next_step by itself, the next run starts "
                 "it again from the start (save with trial.save_checkpoint(state) and restore with "
                 "trial.load_checkpoint(), or use hpo.keras.HpoCallback / hpo.torch.Training)")


def saved_no_checkpoint(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial is suspended after a segment that wrote nothing to
    its checkpoint directory (its worker tells, hpo.trial._run)."""
    return (status_of(trial) is TrialStatus.SUSPENDED
            and run_of(trial).get("checkpoint_saved") is False)


def _release(future: Future) -> None:
    try:
        gather(future)
    except Exception:
        pass  # its trial's record is in the store either way


def _gone(store: StudyStore, flights: Flights) -> list[int]:
    """In-flight trials with nothing left to wait for: ended in the store
    (their task's end not heard of), or their attempt's process on this
    host is gone (a worker killed)."""
    gone = []
    for number, flight in flights.items():
        trial = store.trial(flight.trial_id)
        if task_done(trial, flight.task.after_segment) or (
                status_of(trial) is TrialStatus.RUNNING and _gone_from_here(trial)):
            gone.append(number)
    return gone


def _hand_back(store: StudyStore, trial_id: int) -> None:
    """Leave a trial the stop cut short to the next run (a trial that ended
    meanwhile keeps its end)."""
    if status_of(store.trial(trial_id)) is TrialStatus.RUNNING:
        store.abandon(trial_id)  # one that ended just now keeps its end


def stop_suspended(store: StudyStore, trial_ids: list[int], stop: dict[str, Any]) -> None:
    """The study stopped: suspended trials end STOPPED, with their best value so far."""
    maximize = store.maximize
    reason = f"stopped: {stop.get('reason')}"
    for trial_id in trial_ids:
        trial = store.trial(trial_id)
        store.record_event(trial_id, "stopped", None, f"the study stopped while suspended ({reason})")
        store.write_run(trial_id, {**run_of(trial), "suspended": False, "stop_reason": reason})
        store.finish(trial_id, TrialStatus.STOPPED, best_reported(trial, maximize))
