"""The stored layout of a study: every key ``hpo`` writes beside Optuna's own
fields, who writes it, and who reads it.

Optuna's storage keeps each trial's state, parameters, value and intermediate
values. ``hpo`` adds trial and study system attributes (Optuna's place for
what a library keeps, as its samplers do), one journal line per write; user
attributes stay the user's, so tools that list them (optuna-dashboard's
trial table and study page) are not filled with a column per step and per
event, nor with the master's decisions. Earlier stores kept the study
decisions as user attributes: they are still read (a system attribute wins).

Writers: "relay" is the study's relay in the master (:mod:`hpo.store._relay`),
writing what a trial's process asked for over the store protocol
(:mod:`hpo.store._protocol`), or that process itself when the relay cannot be
reached (:mod:`hpo.store._link`); "master" is the master loop through its
:class:`~hpo.store.StudyStore`. Readers: the master (M), the relay's ledger
(L), the trial's own next task (T: the master copies it into the task), the
results and the dashboard (R).

=================================  ========  =======  =================================
key                                writer    readers  content
=================================  ========  =======  =================================
``hpo:run``                        relay     M L T R  :class:`RunRecord`: the current
                                   (master:           attempt (its ``token`` names it),
                                   ends)              and briefs of earlier ones
``hpo:report:<step:06d>``          relay     L T R    all metrics of one step (the
                                                      study's metric is also Optuna's
                                                      intermediate value)
``hpo:segment:<index:06d>``        relay     M T R    :class:`SegmentRecord`: one
                                                      resumable segment
``hpo:event:<ns:020d>-<pid>``      both      R        :class:`EventRecord`: one decision
``hpo:heartbeat``                  both      M L R    a time (the attempt, every few
                                                      seconds), or ``{"abandoned_at": t}``
                                                      (a master that gave the trial up)
``hpo:profile:<gpus>``             relay     M R      a training rate measured on that
                                                      many GPUs (FLEET)
``hpo:alloc:<index:03d>``          master    M R      one allocation the master made,
                                                      with its reason
``hpo:ended_by``                   master    M L R    :class:`EndedBy`: ended without a
                                                      result
``hpo:ended_master``               master    M        the attempts whose objective ended
                                                      the inline master's process by its
                                                      own hand (hpo.master)
study ``hpo:stop``                 master    L R      why the study must stop, or None
study ``hpo:contender``            master    L        the convergence a running trial
                                                      must reach to keep its slot at the
                                                      end of its quantum (None: nobody
                                                      waits; "inf" as a string)
study ``hpo:resize``               master    L        trial id -> the GPU count the
                                                      master grows it to
study ``hpo:sampler:<number>``     master    M        what a sampler's ``after_trial``
                                                      wrote on trial ``number`` once it
                                                      had ended (constraints...)
study ``hpo:epoch``                master    L        the epoch the last master's run
                                   (relay)            took the study with, and that
                                                      master's lease token
                                                      (:mod:`hpo.store._epoch`)
=================================  ========  =======  =================================

Beside the store, ``control.json`` in the run directory holds the decisions
of the study (stop, contender, resizes, prunes), rewritten atomically by the
relay, for trial processes that cannot reach it (:mod:`hpo.store._control`).

The contract, for writers and readers:

- The master creates trials: Optuna WAITING without a run record (PENDING).
  An attempt's start sets RUNNING, a suspend WAITING again (what Optuna's
  queue does), so tools reading Optuna's state count only running trials
  as running.
- The attempt that started a trial last (the token in its run record) is
  the only writer of its run record, reports, segments, profiles and
  heartbeat, and sets its final state; the relay refuses the requests of
  any other attempt. The master ends only trials no attempt runs (never
  started, lost, suspended), and the first final state wins: Optuna refuses
  to change a finished trial.
- Events have one key each (time and writer), so master and workers never
  overwrite each other's.
- Each write is durable when the call returns (the journal fsyncs appends).
- A finished trial never changes: readers may cache what they built from it.
- Readers accept older records: a missing key means "unknown", and a key
  among the user attributes (where studies written before kept them) counts
  as the same key (:func:`attr_of`).

Everything here is pure: builders return records, readers take Optuna's
``FrozenTrial``. :class:`hpo.store.StudyStore` and the relay write them.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any, NamedTuple, TypedDict, cast

import optuna

__all__ = [
    "RUN_ATTR", "PROFILE_ATTR", "ALLOCATION_ATTR", "REPORT_ATTR", "SEGMENT_ATTR", "EVENT_ATTR", "HEARTBEAT_ATTR",
    "ENDED_BY_ATTR",
    "CONTENDER_ATTR", "RESIZE_ATTR", "STUDY_DECISIONS", "study_decisions", "UNFINISHED_STATES",
    "STOP_ATTR", "EVENT_KINDS", "TrialStatus", "ErrorRecord", "AttemptRecord", "RunRecord",
    "SegmentRecord", "EventRecord", "EndedBy", "TrialAttrs", "Cost", "StudyCost",
    "attr_of", "profiles_of", "allocations_of", "grouped_attrs", "run_of", "status_of", "best_reported", "task_done",
    "last_sign_of_life",
    "start_run", "end_run", "segment_record", "event_record", "event_key", "report_key",
    "segment_key", "cost_of", "study_cost", "RETRIED", "status_from", "sign_of_life",
    "attempt_open", "begin_attempt", "TrialContext", "context_of",
]

RUN_ATTR = "hpo:run"
# The training rate measured on a GPU count ("hpo:profile:2"), and each change
# of the trial's allocation by the master ("hpo:alloc:000"), with its reason.
PROFILE_ATTR = "hpo:profile:"
ALLOCATION_ATTR = "hpo:alloc:"
REPORT_ATTR = "hpo:report:"
SEGMENT_ATTR = "hpo:segment:"
EVENT_ATTR = "hpo:event:"
HEARTBEAT_ATTR = "hpo:heartbeat"
ENDED_BY_ATTR = "hpo:ended_by"
STOP_ATTR = "hpo:stop"
CONTENDER_ATTR = "hpo:contender"
RESIZE_ATTR = "hpo:resize"  # study: trial id -> the GPU count the master grows it to
STUDY_DECISIONS = (STOP_ATTR, CONTENDER_ATTR, RESIZE_ATTR)
# Optuna's states of an unfinished trial: WAITING (queued or suspended), RUNNING.
UNFINISHED_STATES = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)


def study_decisions(user_attrs: dict[str, Any], system_attrs: dict[str, Any]) -> dict[str, Any]:
    """The master's study decisions from a study's attributes: its system
    attributes, else (a store of an earlier version) its user attributes."""
    return {key: system_attrs[key] if key in system_attrs else user_attrs.get(key)
            for key in STUDY_DECISIONS}
EVENT_KINDS = ("pruned", "stopped", "suspended", "resumed", "retried", "unresumable",
               "interrupted", "cancelled", "allocated")


class TrialStatus(str, enum.Enum):
    """Where a trial is in its life, derived from what was stored; the values
    are what ``hpo status`` prints.

    Optuna stores four of them as themselves (RUNNING, COMPLETE, PRUNED, and
    FAIL as FAILED). The others are facts ``hpo`` keeps apart:

    - PENDING: created by the master, not started by a worker (Optuna's
      WAITING without a run record; RUNNING without one in earlier stores);
    - TIMEOUT: failed by exceeding its time limit (walltime expiry is an
      ordinary event on a cluster, not a bug);
    - CANCELLED: ended by the master without a result; its configuration is
      not used up;
    - SUSPENDED: checkpointed between two segments (segmented scheduling);
    - STOPPED: ended early because the study stopped, with the value it had
      (stored as Optuna's PRUNED).
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"

    @property
    def is_finished(self) -> bool:
        return self not in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.SUSPENDED)

    @property
    def stored_as(self) -> optuna.trial.TrialState:
        """The Optuna state a trial in this status is stored with."""
        return _STORED_AS[self]

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> TrialStatus:
        """The status of a stored trial (same as :func:`status_of`)."""
        return status_of(trial)


_OPTUNA = optuna.trial.TrialState
# A trial no attempt runs (queued, suspended) is WAITING, as Optuna's queue keeps
# it: optuna-dashboard counts it apart from the running ones.
_STORED_AS = {
    TrialStatus.PENDING: _OPTUNA.WAITING, TrialStatus.RUNNING: _OPTUNA.RUNNING,
    TrialStatus.SUSPENDED: _OPTUNA.WAITING, TrialStatus.COMPLETE: _OPTUNA.COMPLETE,
    TrialStatus.PRUNED: _OPTUNA.PRUNED, TrialStatus.STOPPED: _OPTUNA.PRUNED,
    TrialStatus.FAILED: _OPTUNA.FAIL, TrialStatus.TIMEOUT: _OPTUNA.FAIL,
    TrialStatus.CANCELLED: _OPTUNA.FAIL,
}


# -- typed records -----------------------------------------------------------------


class ErrorRecord(TypedDict, total=False):
    type: str  # the exception's class, or TimeLimit, Lost, BadReturnValue, EngineError...
    message: str
    traceback: str
    errno: int | None  # an OSError's: ENOSPC, EDQUOT, EROFS are the machine's fault (given up)
    filename: str
    staging: dict[str, str]  # hpo.data.StagingError.record(): the node could not stage (given up)


class AttemptRecord(TypedDict, total=False):
    """What is kept of an earlier attempt (failed and retried, or lost); None
    where its run record did not say."""

    attempt: int | None
    host: str | None
    pid: int | None
    in_master: bool  # it ran inside the master's process (the inline engine)
    started_at: float | None  # this attempt's start
    ended_at: float | None  # its end, or when it was last seen alive
    error: ErrorRecord | None
    core_seconds: float  # what this attempt cost
    gpu_seconds: float


class RunRecord(TypedDict, total=False):
    """The trial's current attempt, written by its worker at every start and end."""

    token: str  # names the attempt (or segment): the relay refuses other attempts' requests
    host: str
    pid: int
    in_master: bool  # it runs inside the master's process (the inline engine)
    log_at: list[Any]  # [log path, size]: where this attempt's output starts in the trial's log
    attempt: int  # 1 for the first
    started_at: float  # the trial's first start
    attempt_started_at: float
    segment: int  # index of the current segment (0 for a trial run in one piece)
    segment_started_at: float
    ended_at: float | None
    duration_s: float  # busy seconds, every attempt and segment
    core_seconds: float  # busy seconds x CPUs, every attempt and segment
    gpu_seconds: float
    cpus: int
    gpus: list[str]  # the assigned GPU ids
    # Its shape, where it has GPUs or several nodes (hpo.trial.where): GPUs
    # (a share of one below 1) on each of its nodes, its nodes' hosts, its
    # share of each GPU and the relative speed of its slowest one.
    gpu_count: float
    nodes: int
    hosts: list[str] | None
    gpu_share: float
    device_speed: float | None
    binded_cpus: str | None  # the cores it was pinned to ("0,1"), by COMPSs or by hpo
    threads: int  # the size its thread pools were limited to (OpenMP, BLAS, TensorFlow)
    tensorflow_threads: int | None  # TensorFlow's intra-op pool, where the objective loaded it
    metrics: dict[str, float]  # the last metrics, with what the objective returned
    error: ErrorRecord | None
    stop_reason: str | None  # "stopped: <why>", "pruned", "patience", "suspended"
    timed_out: bool
    suspended: bool
    # Suspended: whether the segment wrote to its checkpoint directory (False:
    # it resumes from an older checkpoint, from trial.next_step, or from step 0).
    checkpoint_saved: bool
    previous: list[AttemptRecord]


class SegmentRecord(TypedDict, total=False):
    index: int
    host: str
    pid: int
    worker: str
    started_at: float
    ended_at: float
    first_step: int | None
    last_step: int | None
    outcome: str  # a TrialStatus value
    # Time-shared scheduling: the quanta this segment ran without being
    # preempted, the convergence and representative loss of the last one, the
    # quantum's length, and what checkpointing cost.
    quanta: int
    convergence: float | None
    loss: float | None
    quantum_s: float | None
    quantum_steps: int | None
    save_s: float
    restore_s: float
    checkpoint_bytes: int


class EventRecord(TypedDict, total=False):
    time: float
    kind: str  # one of EVENT_KINDS
    step: int | None
    reason: str
    host: str


class EndedBy(TypedDict):
    reason: str  # "cancelled" (the study stopped first) or "interrupted" (run again)
    message: str


def report_key(step: int) -> str:
    return f"{REPORT_ATTR}{step:06d}"


def segment_key(index: int) -> str:
    return f"{SEGMENT_ATTR}{index:06d}"


def event_key(time_ns: int, pid: int) -> str:
    return f"{EVENT_ATTR}{time_ns:020d}-{pid}"


# -- readers -----------------------------------------------------------------------


class TrialAttrs(NamedTuple):
    """A trial's reports ``(step, metrics)``, events and segments, each in order."""

    reports: list[tuple[int, dict[str, float]]]
    events: list[EventRecord]
    segments: list[SegmentRecord]


def attr_of(trial: optuna.trial.FrozenTrial, key: str, default: Any = None) -> Any:
    """The trial's ``hpo`` attribute ``key``: a system attribute, or a user
    attribute in a study written before they moved."""
    system = trial.system_attrs
    return system[key] if key in system else trial.user_attrs.get(key, default)


def grouped_attrs(trial: optuna.trial.FrozenTrial) -> TrialAttrs:
    """One pass over a trial's attributes (it runs for every trial of a study)."""
    # The stored values, taken to be the records they were written as.
    reports: list[tuple[int, Any]] = []
    events: list[tuple[str, Any]] = []
    segments: list[tuple[str, Any]] = []
    for key, value in chain(trial.user_attrs.items(), trial.system_attrs.items()):
        if not key.startswith("hpo:") or not isinstance(value, dict):
            continue
        if key.startswith(REPORT_ATTR):
            reports.append((int(key[len(REPORT_ATTR):]), value))
        elif key.startswith(EVENT_ATTR):
            events.append((key, value))
        elif key.startswith(SEGMENT_ATTR):
            segments.append((key, value))
    reports.sort(key=lambda item: item[0])
    return TrialAttrs(reports, [v for _, v in sorted(events, key=lambda item: item[0])],
                      [v for _, v in sorted(segments, key=lambda item: item[0])])


def profiles_of(trial: optuna.trial.FrozenTrial) -> dict[float, dict[str, Any]]:
    """The trial's measured training rates, by the GPU count they were measured on."""
    attrs = chain(trial.user_attrs.items(), trial.system_attrs.items())
    return {float(k[len(PROFILE_ATTR):]): v for k, v in attrs
            if k.startswith(PROFILE_ATTR) and isinstance(v, dict)}


def allocations_of(trial: optuna.trial.FrozenTrial) -> list[dict[str, Any]]:
    """Every allocation the master gave the trial, in order, with its reason."""
    attrs = {**trial.user_attrs, **trial.system_attrs}
    return [attrs[k] for k in sorted(attrs) if k.startswith(ALLOCATION_ATTR)]


def run_of(trial: optuna.trial.FrozenTrial) -> RunRecord:
    """The trial's run record ({} before a worker started it)."""
    run: RunRecord | None = attr_of(trial, RUN_ATTR)
    return run or {}


def status_of(trial: optuna.trial.FrozenTrial) -> TrialStatus:
    """The status of a stored trial."""
    return status_from(trial.state, run_of(trial), attr_of(trial, ENDED_BY_ATTR))


def status_from(state: optuna.trial.TrialState, run: RunRecord, ended_by: Any) -> TrialStatus:
    """The status of a trial in Optuna ``state`` with this run record and
    ``hpo:ended_by`` (what :func:`status_of` reads from a stored trial)."""
    if state in UNFINISHED_STATES:  # RUNNING in stores written before WAITING was used
        if not run:
            return TrialStatus.PENDING
        return TrialStatus.SUSPENDED if run.get("suspended") else TrialStatus.RUNNING
    if state == _OPTUNA.COMPLETE:
        return TrialStatus.COMPLETE
    if state == _OPTUNA.PRUNED:
        stopped = str(run.get("stop_reason") or "").startswith("stopped")
        return TrialStatus.STOPPED if stopped else TrialStatus.PRUNED
    if ended_by:
        return TrialStatus.CANCELLED
    if run.get("timed_out"):
        return TrialStatus.TIMEOUT
    return TrialStatus.FAILED if state == _OPTUNA.FAIL else TrialStatus.PENDING


def best_reported(trial: optuna.trial.FrozenTrial, maximize: bool) -> float | None:
    """The best value of the study's metric the trial reported so far."""
    values = trial.intermediate_values.values()
    return (max(values) if maximize else min(values)) if values else None


def task_done(trial: optuna.trial.FrozenTrial, segment_before: int) -> bool:
    """Whether the task submitted when the trial's last segment was
    ``segment_before`` (-1: none) is over: the trial finished, or suspended
    again after a later segment."""
    if trial.state.is_finished():
        return True
    run = run_of(trial)
    return bool(run.get("suspended")) and run.get("segment", -1) > segment_before


def last_sign_of_life(trial: optuna.trial.FrozenTrial) -> float:
    """When the trial's worker last showed it was alive (0.0: never, or given up)."""
    return sign_of_life(run_of(trial), attr_of(trial, HEARTBEAT_ATTR))


def sign_of_life(run: RunRecord, heartbeat: Any) -> float:
    """:func:`last_sign_of_life` from a run record and an ``hpo:heartbeat`` value."""
    started = run.get("segment_started_at") or run.get("started_at") or 0.0
    if isinstance(heartbeat, dict):  # given up by a master that stopped; alive if started since
        return started if started > heartbeat["abandoned_at"] else 0.0
    return max(heartbeat or 0.0, started)


def attempt_open(run: RunRecord) -> bool:
    """Whether the attempt (or segment) the run record names has not ended:
    started, and not ended since (suspended, given up, or finished)."""
    ended = run.get("ended_at")
    return bool(run) and not (ended is not None and ended >= run.get("segment_started_at", 0.0))


class TrialContext(TypedDict):
    """What a trial's task carries of its stored trial: the master fills it,
    so that the trial's process never reads the store (records.py's T)."""

    run: RunRecord
    heartbeat: Any
    reports: list[tuple[int, dict[str, float]]]
    segments: list[SegmentRecord]


def context_of(trial: optuna.trial.FrozenTrial | None) -> TrialContext:
    """The context of a stored trial (an empty one for None)."""
    if trial is None:
        return {"run": {}, "heartbeat": None, "reports": [], "segments": []}
    attrs = grouped_attrs(trial)
    return {"run": run_of(trial), "heartbeat": attr_of(trial, HEARTBEAT_ATTR),
            "reports": attrs.reports, "segments": attrs.segments}


# -- builders ----------------------------------------------------------------------


def start_run(previous: RunRecord, where: dict[str, Any], now: float, gpus: float,
              last_seen: float | None = None) -> RunRecord:
    """The run record as a task starts: the next segment of a suspended trial,
    or a new attempt (the first, a retry, or one after ``previous`` was lost,
    last seen alive at ``last_seen``). ``where`` holds host, pid, cpus and the
    GPU ids; ``gpus`` is how many GPUs a trial holds (what its time costs)."""
    placed = cast(RunRecord, where)  # run record fields
    segment = previous.get("segment", -1) + 1
    if previous.get("suspended"):
        return {**previous, **placed, "segment_started_at": now, "suspended": False,
                "segment": segment}
    if previous and last_seen is not None:  # lost: charge it up to its last sign of life
        busy = max(last_seen - previous.get("segment_started_at", last_seen), 0.0)
        previous = _charged(previous, busy, last_seen, gpus)
    history = [*previous.get("previous", []), *([_brief(previous)] if previous else [])]
    return {**placed, "attempt": len(history) + 1, "started_at": previous.get("started_at", now),
            "attempt_started_at": now, "segment_started_at": now, "segment": segment,
            "previous": history, "duration_s": previous.get("duration_s", 0.0),
            "core_seconds": previous.get("core_seconds", 0.0),
            "gpu_seconds": previous.get("gpu_seconds", 0.0)}


def begin_attempt(previous: RunRecord, heartbeat: Any, where: dict[str, Any], now: float,
                  gpus: float, token: str) -> tuple[RunRecord, list[tuple[str, EventRecord]]]:
    """The run record of an attempt (or segment) named ``token`` that starts
    at ``now`` after ``previous``, and the events to write with it: an
    attempt that was running and never ended was lost with its worker or
    master, and is charged up to its last sign of life."""
    lost = bool(previous) and not previous.get("suspended")
    events: list[tuple[str, EventRecord]] = []
    last_seen = None
    if lost:
        last_seen = sign_of_life(previous, heartbeat) or previous.get("segment_started_at")
        events.append((event_key(time.time_ns(), where.get("pid") or 0), event_record(
            "retried", None, f"attempt {previous.get('attempt')} on {previous.get('host')} "
            f"(pid {previous.get('pid')}) was lost with its worker or master; running again "
            "from its checkpoint", str(where.get("host")), now)))
        previous = {**previous, "error": {"type": "Lost", "message": "ended without a result"}}
    return {**start_run(previous, where, now, gpus, last_seen), "token": token}, events


def end_run(run: RunRecord, now: float, gpus: float, *, metrics: dict[str, float],
            error: ErrorRecord | None, stop_reason: str | None, timed_out: bool,
            suspended: bool, binding: dict[str, Any] | None = None) -> RunRecord:
    """``run`` with this task's busy time and cost added, and how it ended;
    ``binding`` holds the ``binded_cpus``/``threads`` it ran with, where known."""
    busy = now - run["segment_started_at"]
    return {**_charged(run, busy, now, gpus), **cast(RunRecord, binding or {}), "metrics": metrics,
            "error": error, "stop_reason": stop_reason, "timed_out": timed_out,
            "suspended": suspended}


def _charged(run: RunRecord, busy: float, ended: float, gpus: float) -> RunRecord:
    return {**run, "ended_at": ended, "duration_s": run.get("duration_s", 0.0) + busy,
            "core_seconds": run.get("core_seconds", 0.0) + busy * int(run.get("cpus") or 1),
            "gpu_seconds": run.get("gpu_seconds", 0.0) + busy * gpus}


def _brief(run: RunRecord) -> AttemptRecord:
    """What is kept of an attempt that ended: where, when, why, and its own cost."""
    earlier = run.get("previous", [])
    return {"attempt": run.get("attempt"), "host": run.get("host"), "pid": run.get("pid"),
            "in_master": run.get("in_master", False),
            "started_at": run.get("attempt_started_at", run.get("started_at")),
            "ended_at": run.get("ended_at"), "error": run.get("error"),
            "core_seconds": run.get("core_seconds", 0.0) - sum(a.get("core_seconds", 0.0) for a in earlier),
            "gpu_seconds": run.get("gpu_seconds", 0.0) - sum(a.get("gpu_seconds", 0.0) for a in earlier)}


def segment_record(run: RunRecord, steps: tuple[int, int] | None, outcome: TrialStatus) -> SegmentRecord:
    """The record of the segment ``run`` just ended, which reported ``steps``."""
    first, last = steps or (None, None)
    return {"index": run["segment"], "host": run["host"], "pid": run["pid"],
            "worker": f"{run['host']}:{run['pid']}", "started_at": run["segment_started_at"],
            "ended_at": cast(float, run["ended_at"]),  # set: the run has ended (end_run)
            "first_step": first, "last_step": last,
            "outcome": outcome.value}


def event_record(kind: str, step: int | None, reason: str, host: str,
                 now: float | None = None) -> EventRecord:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
    return {"time": time.time() if now is None else now, "kind": kind, "step": step,
            "reason": reason, "host": host}


# -- cost --------------------------------------------------------------------------

#: The cost category of earlier attempts, beside the TrialStatus values.
RETRIED = "retried attempt"


@dataclass(frozen=True)
class Cost:
    """What a trial used: busy seconds x CPUs (GPUs), every attempt included.

    ``retried_*`` is the part spent on earlier attempts. A running trial's
    current segment is not in it until :meth:`at` adds it up to a moment.
    """

    core_seconds: float = 0.0
    gpu_seconds: float = 0.0
    retried_core_seconds: float = 0.0
    retried_gpu_seconds: float = 0.0
    running_since: float | None = None
    cpus: int = 1
    gpus: int = 0

    def at(self, now: float | None) -> Cost:
        """The cost up to ``now``, the running segment included."""
        if self.running_since is None or now is None:
            return self
        busy = max(now - self.running_since, 0.0)
        return replace(self, core_seconds=self.core_seconds + busy * self.cpus,
                       gpu_seconds=self.gpu_seconds + busy * self.gpus, running_since=None)


def cost_of(trial: optuna.trial.FrozenTrial) -> Cost:
    """The cost of a stored trial, from its run record.

    >>> trial = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0,
    ...     system_attrs={RUN_ATTR: {"cpus": 2, "core_seconds": 30.0, "previous": [
    ...         {"attempt": 1, "core_seconds": 10.0, "gpu_seconds": 0.0}]}})
    >>> cost = cost_of(trial)
    >>> cost.core_seconds, cost.retried_core_seconds
    (30.0, 10.0)
    """
    run = run_of(trial)
    earlier = [a for a in run.get("previous") or () if isinstance(a, dict)]
    gpus = run.get("gpus")
    live = status_of(trial) is TrialStatus.RUNNING
    return Cost(
        core_seconds=float(run.get("core_seconds") or 0.0),
        gpu_seconds=float(run.get("gpu_seconds") or 0.0),
        retried_core_seconds=sum(float(a.get("core_seconds") or 0.0) for a in earlier),
        retried_gpu_seconds=sum(float(a.get("gpu_seconds") or 0.0) for a in earlier),
        running_since=run.get("segment_started_at") if live else None,
        cpus=int(run.get("cpus") or 1),
        gpus=len(gpus) if isinstance(gpus, list) else int(gpus or 0),
    )


@dataclass(frozen=True)
class StudyCost:
    """Core- and GPU-hours of a study, in all and by what they went to: the
    TrialStatus value of the trial's last attempt, or RETRIED for earlier ones."""

    core_hours: float = 0.0
    gpu_hours: float = 0.0
    core_hours_by: dict[str, float] = field(default_factory=dict)
    gpu_hours_by: dict[str, float] = field(default_factory=dict)


def study_cost(trials: Iterable[tuple[TrialStatus, Cost]], now: float | None = None) -> StudyCost:
    """Add up trials' costs; with ``now``, running segments count up to it.

    >>> done = (TrialStatus.COMPLETE, Cost(core_seconds=7200.0, retried_core_seconds=3600.0))
    >>> study_cost([done]).core_hours_by["retried attempt"]
    1.0
    """
    order = [s.value for s in TrialStatus] + [RETRIED]
    core, gpu = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0.0)
    for status, cost in trials:
        cost = cost.at(now)
        core[status.value] += (cost.core_seconds - cost.retried_core_seconds) / 3600
        gpu[status.value] += (cost.gpu_seconds - cost.retried_gpu_seconds) / 3600
        core[RETRIED] += cost.retried_core_seconds / 3600
        gpu[RETRIED] += cost.retried_gpu_seconds / 3600
    return StudyCost(math.fsum(core.values()), math.fsum(gpu.values()), core, gpu)
