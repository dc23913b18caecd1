"""``run_trial``: what every engine runs on a worker for one trial (or one
segment of it).

It never raises because of user code: under COMPSs a task failing past its
retries ends the whole application, so an exception, a NaN, a wrong return
type or a time limit become a failed-trial record in the store, with the
reason and traceback. What it returns is a small summary; the store holds
the full record, durable before the function returns.

The attempt starts, reports and ends through its link to the store
(:class:`~hpo.store.TrialLink`), never reading the store: what it needs of
the stored trial came with the task, and the relay's answer to its start
adds what changed since. When the relay refuses the attempt (its trial
ended meanwhile, or another attempt took it over) it stops, and its result
does not count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.store import MACHINE_FAULTS, Halted, TrialContext, TrialLink
from hpo.store.records import (
    RUN_ATTR,
    RunRecord,
    TrialStatus,
    end_run,
    event_key,
    event_record,
    segment_key,
    segment_record,
    start_run,
)
from hpo.trial._attempt import (
    AttemptResult,
    TaskInterrupted,
    checkpoint_files,
    classify,
    run_here,
    size_of,
    trial_for,
)
from hpo.trial._handle import Trial
from hpo.trial._isolated import run_isolated
from hpo.trial._local_stop import suspend_requested
from hpo.trial._objective import refuse_trials_while_importing
from hpo.trial._pulse import beating
from hpo.trial._task import TrialOutcome, TrialTask, gpu_total, where

__all__ = ["run_trial", "open_trial"]


def run_trial(task: TrialTask) -> TrialOutcome:
    """Run one trial, or one segment of it, and record it durably; the
    module-level task of every engine."""
    refuse_trials_while_importing(f"trial {task.number}")
    link = TrialLink(task.storage, task.trial_id, task.control, master=task.master)
    try:
        started = _Started(link.begin_start(where(task), time.time(), gpu_total(task), task.context),
                           task.context)
    except Halted as halted:
        return _halted(task, halted)
    try:
        return _run_started(task, link, started)
    except Halted as halted:
        # Ended already (an engine ran the task again after its result was
        # stored): the first result stays, and the trial counts once.
        return _halted(task, halted)
    except BaseException as exc:  # the store failed under it: leave the trial to be resumed
        _give_up(link, task, None, f"its task ended without a result: {type(exc).__name__}: {exc}")
        raise


class _Started:
    """An attempt's start, sent to the relay: its answer is read when the
    attempt first needs it, and the trial's process prepares meanwhile
    (:func:`~hpo.trial._attempt.run_here` claims its cores first)."""

    def __init__(self, answer: Callable[[], dict[str, Any]], context: TrialContext) -> None:
        self._answer = answer
        self._task_context = context
        self._started: dict[str, Any] | None = None

    def _got(self) -> dict[str, Any]:
        if self._started is None:
            self._started = self._answer()  # Halted when refused
        return self._started

    def context(self) -> TrialContext:
        """The attempt's context: the task's, with what the answer adds."""
        return _caught_up(self._task_context, self._got())

    @property
    def run(self) -> RunRecord:
        """The attempt's run record, as the relay began it."""
        return self._got()["run"]


def open_trial(task: TrialTask) -> Trial:
    """Start an attempt of ``task`` and return the store-backed :class:`Trial`
    its objective would get (a tool's or a benchmark's way in)."""
    link = TrialLink(task.storage, task.trial_id, task.control, master=task.master)
    started = link.start(where(task), time.time(), gpu_total(task), task.context)
    return trial_for(task, link.token, _caught_up(task.context, started))


def _run_started(task: TrialTask, link: TrialLink, started: _Started) -> TrialOutcome:
    saved_before = checkpoint_files(Path(task.checkpoint_dir))
    context: Callable[[], TrialContext] = started.context
    run: RunRecord | None = None
    while True:
        interruption: TaskInterrupted | None = None
        try:
            with beating(link, task.heartbeat_s):  # its first beat comes after the start, on its connection
                result = _attempt(task, link.token, context)
        except TaskInterrupted as interrupted:  # cancelled, not timed out
            interruption = interrupted
        run = started.run if run is None else run  # the first attempt's, as the relay began it
        if interruption is not None:
            _give_up(link, task, _end_record(run, AttemptResult(error={
                "type": "Cancelled", "message": f"the engine cancelled the running task "
                f"({interruption.kind})"}), task, suspended=False),
                f"its task was cancelled ({interruption.kind}) on {run['host']}")
            return TrialOutcome(task.number, TrialStatus.RUNNING)
        if result.halted is not None:
            return _halted(task, result.halted)
        if (result.error or {}).get("errno") in MACHINE_FAULTS or (result.error or {}).get("staging"):
            # The disk filled up under the objective, or its node could not
            # stage its data: not the trial's failure. It is given up, to
            # resume from its checkpoint on the next run.
            if result.error is None:
                raise RuntimeError("hpo internal error: result.error is not None")
            _give_up(link, task, _end_record(run, result, task, suspended=False),
                     f"{result.error['type']}: {result.error['message']} (the machine's fault: "
                     "resumed from its checkpoint)")
            return TrialOutcome(task.number, TrialStatus.RUNNING)
        state, value = classify(result, task.metric, task.objectives)
        if state is TrialStatus.FAILED and _interrupted(link):
            # It failed while the study was being stopped (Ctrl-C: a closed
            # pipe, a killed helper process): never the trial's failure.
            if result.error is None:
                raise RuntimeError("hpo internal error: FAILED: classify() keeps why")
            _give_up(link, task, _end_record(run, result, task, suspended=False),
                     f"{result.error['type']}: {result.error['message']} (while the study was "
                     "stopping: resumed from its checkpoint on the next run)")
            return TrialOutcome(task.number, TrialStatus.RUNNING)
        if state is not TrialStatus.FAILED or _failed_attempts(run) >= task.retries:
            break
        run = _retry(link, task, run, result)  # user code failed: again, from its checkpoint
        retried = context()
        context = _given({**retried, "reports": _merged(retried["reports"], result.reports)})
    run = _end_record(run, result, task, suspended=state is TrialStatus.SUSPENDED)
    segment = None
    if task.quantum is not None:
        segment = (segment_key(run["segment"]), {
            **segment_record(run, result.steps, state), **(result.quantum or {}),
            "checkpoint_bytes": size_of(Path(task.checkpoint_dir))})
    if state is TrialStatus.SUSPENDED:  # whether "resumes from its checkpoint" is true
        run["checkpoint_saved"] = checkpoint_files(Path(task.checkpoint_dir)) != saved_before
    values = None if value is None else value if isinstance(value, list) else [value]
    ended = link.end(state, values, run, segment, wait=task.end_waits)
    if state is TrialStatus.SUSPENDED:
        return TrialOutcome(task.number, state)  # still RUNNING in the store; resumes later
    if ended.won:
        return TrialOutcome(task.number, state, values[0] if values else None)
    return TrialOutcome(task.number, TrialStatus(ended.status), ended.value)  # the stored end wins


def _attempt(task: TrialTask, token: str, context: Callable[[], TrialContext]) -> AttemptResult:
    """Run the objective once (``context()``: once the attempt has begun). A
    time-out by the engine is a result, and so is a disk that fills up under
    the trial's log; a cancellation raises :class:`TaskInterrupted`."""
    try:
        return run_isolated(task, token, context()) if task.isolate else run_here(task, token, context)
    except TaskInterrupted as interruption:
        if not interruption.timed_out:
            raise
        limit = f" (time_limit_s={task.time_limit_s:g})" if task.time_limit_s is not None else ""
        return AttemptResult(timed_out=True, error={
            "type": interruption.kind, "message": f"the engine ended the task at its time_out{limit}"})
    except OSError as exc:  # hpo's own files around the objective (its log): never user code
        if exc.errno not in MACHINE_FAULTS:
            raise
        return AttemptResult(error={  # a full disk: given up as the machine's fault, no traceback
            "type": type(exc).__name__, "message": str(exc), "errno": exc.errno,
            "filename": str(exc.filename or task.checkpoint_dir)})


def _interrupted(link: TrialLink) -> bool:
    """Whether this attempt's process or its study is being stopped, to be
    resumed (a signal to the worker, or to the master): asked afresh."""
    if suspend_requested():
        return True
    try:
        stop = link.poll(fresh=True).stop
    except Exception:  # the relay refused or is gone: not evidence of a stop
        return False
    return bool(stop and stop.get("resume"))


def _given(context: TrialContext) -> Callable[[], TrialContext]:
    return lambda: context


def _caught_up(context: TrialContext, started: dict[str, Any]) -> TrialContext:
    """The task's context with what the relay's answer to the start adds
    (reports and segments stored after the task was made: a lost attempt's)."""
    return {"run": started["run"], "heartbeat": context["heartbeat"],
            "reports": _merged(context["reports"], [(s, m) for s, m in started.get("reports", [])]),
            "segments": [*context["segments"], *started.get("segments", [])]}


def _merged(reports: list[tuple[int, dict[str, float]]],
            later: list[tuple[int, dict[str, float]]]) -> list[tuple[int, dict[str, float]]]:
    """Reports by step, the later one of a step kept."""
    by_step = dict(reports)
    by_step.update(later)
    return sorted(by_step.items())


def _halted(task: TrialTask, halted: Halted) -> TrialOutcome:
    """The outcome of an attempt the relay refused: the stored end, or a
    trial another attempt runs."""
    if halted.why == "ended" and halted.status:
        return TrialOutcome(task.number, TrialStatus(halted.status), halted.value)
    return TrialOutcome(task.number, TrialStatus.RUNNING)


def _give_up(link: TrialLink, task: TrialTask, run: RunRecord | None, why: str) -> None:
    """Leave a trial whose task ends without a result to be resumed at once
    from its checkpoint (best effort: the store may be what failed)."""
    now = time.time()
    event = event_record("interrupted", None, why, where(task)["host"], now)
    try:
        link.give_up(run, (event_key(time.time_ns(), where(task)["pid"]), event), now)
    except Exception:  # ended meanwhile (the stored end wins), or unreachable
        pass


def _failed_attempts(run: RunRecord) -> int:
    earlier = [a for a in run.get("previous", []) if (a.get("error") or {}).get("type") != "Lost"]
    return sum(1 for a in earlier if a.get("error"))


def _retry(link: TrialLink, task: TrialTask, run: RunRecord, result: AttemptResult) -> RunRecord:
    """Close the failed attempt and open the next one (the objective's retries)."""
    error = result.error or {}
    ended = _end_record(run, result, task, suspended=False)
    place = where(task)
    link.event(event_key(time.time_ns(), place["pid"]), event_record(
        "retried", None, f"attempt {run['attempt']} on {run['host']} failed ({error.get('type')}: "
        f"{error.get('message')}); retrying from its checkpoint", place["host"]))
    following: RunRecord = {**start_run(ended, place, time.time(), gpu_total(task)), "token": link.token}
    link.note(RUN_ATTR, following)
    return following


def _end_record(run: RunRecord, result: AttemptResult, task: TrialTask, suspended: bool) -> RunRecord:
    return end_run(run, time.time(), gpu_total(task), metrics=result.metrics, error=result.error,
                   stop_reason=result.stop_reason, timed_out=result.timed_out, suspended=suspended,
                   binding=result.binding)
