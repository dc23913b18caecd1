"""One study in an Optuna storage, as hpo reads and writes it.

:class:`StudyStore` is the only code that reaches Optuna's private
attributes (a study's storage and id, a trial's id): Optuna offers no public
way to write a user attribute on a trial by id from a process that never
asked for it, which is what workers and the master do all the time.
"""

from __future__ import annotations

import math
import os
import socket
import time
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import optuna
from optuna.storages.journal._storage import JournalOperation

from hpo.store._journal import JournalFile
from hpo.store._relay import split_relay
from hpo.store.records import (
    CONTENDER_ATTR, ENDED_BY_ATTR, RESIZE_ATTR, HEARTBEAT_ATTR, RUN_ATTR, STOP_ATTR, ErrorRecord, RunRecord, TrialStatus,
    event_key, event_record, report_key, run_of,
)

__all__ = ["StudyStore", "open_storage", "open_study_store"]

# How stale a worker's view of the study's stop may be (seconds).
_FRESH_S = 0.2


@lru_cache(maxsize=8)
def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open (once per process) the storage behind ``url``.

    ``url`` is a SQLAlchemy URL when it contains ``://``, else the path of a
    journal file. Workers reuse the cached object across trials, so the journal
    is replayed incrementally rather than from the start for every trial.
    """
    if "://" in url:
        # Several worker processes write to one SQLite file: wait for the lock
        # instead of failing at once with "database is locked".
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    # Sets a torn tail aside before appending; refuses damage in the middle;
    # sends appends to the study's relay when the URL names one (hpo.store._relay).
    return optuna.storages.JournalStorage(JournalFile(*split_relay(url)))


@lru_cache(maxsize=8)
def open_study_store(url: str, name: str) -> "StudyStore":
    """The store of study ``name`` behind ``url``, made once per process (each
    lookup of a study by name re-reads the journal's new lines)."""
    return StudyStore(open_storage(url), name)


class StudyStore:
    """Reads and writes one study's trials; see :mod:`hpo.store.records` for
    the layout and who may write what."""

    def __init__(self, storage: optuna.storages.BaseStorage, name: str) -> None:
        self.storage = storage
        self.name = name
        self.study_id = storage.get_study_id_from_name(name)  # KeyError: no such study
        self._attrs: tuple[float, dict[str, Any]] | None = None  # (read at, the study's attributes)

    @classmethod
    def of(cls, study: optuna.Study) -> "StudyStore":
        """The store behind an Optuna study object."""
        return cls(study._storage, study.study_name)

    @staticmethod
    def trial_id(trial: optuna.trial.FrozenTrial | optuna.Trial) -> int:
        """The storage id of a trial (Optuna keeps it private)."""
        return trial._trial_id

    def study(self, **kwargs: Any) -> optuna.Study:
        """An Optuna study object over the same storage."""
        return optuna.Study(self.name, self.storage, **kwargs)

    @property
    def maximize(self) -> bool:
        return self.storage.get_study_directions(self.study_id)[0] == optuna.study.StudyDirection.MAXIMIZE

    # -- reading ---------------------------------------------------------------

    def trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        return self.storage.get_trial(trial_id)

    def trials(self, *states: optuna.trial.TrialState) -> list[optuna.trial.FrozenTrial]:
        """Every trial, or those in Optuna ``states`` (not copied: never modify)."""
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=states or None)

    def stop(self) -> dict[str, Any] | None:
        """Why the study must stop, or None."""
        return self._study_attrs().get(STOP_ATTR)

    def _study_attrs(self) -> dict[str, Any]:
        """The study's attributes, read at most every ``_FRESH_S``. Reading a
        journal first replays every record appended since (every trial's
        reports), under one lock per process: the trials of a worker process
        (hundreds of threads) share one read instead of each replaying the
        journal at every report. This process's own writes are seen at once."""
        cached = self._attrs
        if cached is not None and time.monotonic() - cached[0] < _FRESH_S:
            return cached[1]
        attrs = self.storage.get_study_user_attrs(self.study_id)
        self._attrs = (time.monotonic(), attrs)
        return attrs

    # -- writing ---------------------------------------------------------------

    def set_stop(self, reason: dict[str, Any] | None) -> None:
        self.storage.set_study_user_attr(self.study_id, STOP_ATTR, reason)
        self._attrs = None

    def contender(self) -> float | None:
        """The convergence a running trial must reach to keep its slot (None: nobody waits)."""
        # Read at a quantum's end only, and it must be the master's latest word.
        value = self.storage.get_study_user_attrs(self.study_id).get(CONTENDER_ATTR)
        return float(value) if value is not None else None  # "inf" is stored as a string

    def set_contender(self, value: float | None) -> None:
        stored = None if value is None else (str(value) if math.isinf(value) else value)
        self.storage.set_study_user_attr(self.study_id, CONTENDER_ATTR, stored)

    def resize_for(self, trial_id: int) -> int | None:
        """The GPU count the master asks a running trial to grow to (it then
        checkpoints and suspends, and resumes on them), or None."""
        value = (self._study_attrs().get(RESIZE_ATTR) or {}).get(str(trial_id))
        return int(value) if value is not None else None

    def set_resize(self, trial_id: int, gpus: int | None) -> None:
        """Ask trial ``trial_id`` to grow to ``gpus`` GPUs (None: withdraw it)."""
        asked = dict(self.storage.get_study_user_attrs(self.study_id).get(RESIZE_ATTR) or {})
        if gpus is None:
            asked.pop(str(trial_id), None)
        else:
            asked[str(trial_id)] = gpus
        self.storage.set_study_user_attr(self.study_id, RESIZE_ATTR, asked)
        self._attrs = None

    def create_trial(self, params: dict[str, Any],
                     distributions: dict[str, optuna.distributions.BaseDistribution]) -> tuple[int, int]:
        """Store a PENDING trial with ``params`` in one write; its id and number."""
        template = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params=params,
                                             distributions=distributions)
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        return trial_id, self.storage.get_trial_number_from_id(trial_id)

    def write_run(self, trial_id: int, run: RunRecord) -> None:
        self.write(trial_id, RUN_ATTR, run)

    def write(self, trial_id: int, key: str, value: Any) -> None:
        """One ``hpo`` attribute of a trial (records.py), in one write."""
        self.storage.set_trial_system_attr(trial_id, key, value)

    def note(self, trial_id: int, key: str, value: Any) -> None:
        """Like :meth:`write`, for what a worker writes beside a running trial
        (its start record, heartbeats): on a journal the append waits for no
        other thread of this process, and a note on a trial that ended
        meanwhile is dropped without an error, as a finished trial never changes."""
        storage = self.storage
        if not isinstance(storage, optuna.storages.JournalStorage):
            self.write(trial_id, key, value)
            return
        storage._backend.append_logs([_journal_log(
            storage, JournalOperation.SET_TRIAL_SYSTEM_ATTR, trial_id, system_attr={key: value},
            worker_id=_unchecked(storage))])

    def report(self, trial_id: int, step: int, metrics: dict[str, float], metric: str) -> None:
        """One step's metrics; the study's metric also as Optuna's intermediate
        value, which pruners and samplers read. Durable when it returns."""
        storage = self.storage
        if not isinstance(storage, optuna.storages.JournalStorage):
            if metric in metrics:
                storage.set_trial_intermediate_value(trial_id, step, metrics[metric])
            self.write(trial_id, report_key(step), metrics)
            return
        # A journal takes both records in one append (one fsync, one relay round).
        # The storage does not replay the journal here: the next read does, and
        # raises there as Optuna would have here for a trial finished meanwhile.
        logs = [_journal_log(storage, JournalOperation.SET_TRIAL_SYSTEM_ATTR, trial_id,
                             system_attr={report_key(step): metrics})]
        if metric in metrics:
            logs.insert(0, _journal_log(storage, JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE,
                                        trial_id, step=step, intermediate_value=metrics[metric]))
        storage._backend.append_logs(logs)

    def record_event(self, trial_id: int, kind: str, step: int | None, reason: str) -> None:
        """Write one decision on a trial; the master and workers both do."""
        event = event_record(kind, step, reason, socket.gethostname())
        self.write(trial_id, event_key(time.time_ns(), os.getpid()), event)

    def beat(self, trial_id: int) -> None:
        """The trial's worker is alive now."""
        self.note(trial_id, HEARTBEAT_ATTR, time.time())

    def abandon(self, trial_id: int) -> None:
        """A master that stops gives a running trial up: the next master resumes
        it at once instead of waiting for its heartbeat to go stale."""
        self.write(trial_id, HEARTBEAT_ATTR, {"abandoned_at": time.time()})

    def finish(self, trial_id: int, status: TrialStatus, value: float | list[float] | None,
               run: RunRecord | None = None) -> bool:
        """End a trial with ``status`` and its value (a list: one per objective),
        with its final ``run`` record when given (on a journal, both in one
        append); False when it had ended already (the first end wins: a
        finished trial never changes, nor does its record)."""
        values = None if value is None else list(value) if isinstance(value, list) else [value]
        storage = self.storage
        if run is not None and isinstance(storage, optuna.storages.JournalStorage):
            return self._finish_in_one_append(storage, trial_id, status, values, run)
        try:
            if run is not None:
                self.write_run(trial_id, run)
            storage.set_trial_state_values(trial_id, status.stored_as, values)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

    @staticmethod
    def _finish_in_one_append(storage: optuna.storages.JournalStorage, trial_id: int,
                              status: TrialStatus, values: list[float] | None, run: RunRecord) -> bool:
        ended = datetime.now(tz=timezone.utc).isoformat(timespec="microseconds")
        # Written as no storage's own records, Optuna's replay drops them without
        # an error if the trial had ended, rather than raise that in whichever
        # thread of this process reads next; so the append holds no lock (the
        # hundreds of trials of a worker process that end at once do not queue
        # behind each other's round trips), and the read after it says whether
        # this end is the one stored.
        unchecked = _unchecked(storage)
        storage._backend.append_logs([
            _journal_log(storage, JournalOperation.SET_TRIAL_SYSTEM_ATTR, trial_id,
                         system_attr={RUN_ATTR: run}, worker_id=unchecked),
            _journal_log(storage, JournalOperation.SET_TRIAL_STATE_VALUES, trial_id,
                         state=status.stored_as, values=values, datetime_complete=ended,
                         worker_id=unchecked)])
        # As the replay stores it: local time, naive.
        mine = datetime.fromisoformat(ended).astimezone().replace(tzinfo=None)
        # Another thread's read may have replayed this end already (trials of a
        # worker process end together): then no need to queue for a read.
        stored = storage._replay_result._trials.get(trial_id)
        if stored is None or not stored.state.is_finished():
            stored = storage.get_trial(trial_id)
        return stored.state == status.stored_as and stored.datetime_complete == mine

    def end_without_result(self, trial_id: int, reason: str, message: str) -> None:
        """End a trial no worker finished: "cancelled" (the study stopped before
        it ran) or "interrupted" (its configuration is proposed again)."""
        self._end(trial_id, ENDED_BY_ATTR, {"reason": reason, "message": message},
                  TrialStatus.CANCELLED)

    def fail(self, trial_id: int, error: ErrorRecord) -> None:
        """Record a trial whose task the engine could not run to its end as FAILED."""
        self._end(trial_id, RUN_ATTR, {**run_of(self.trial(trial_id)), "error": error},
                  TrialStatus.FAILED)

    def _end(self, trial_id: int, key: str, why: Any, status: TrialStatus) -> None:
        """Write why a trial ended, then end it, unless a worker finished it first."""
        try:
            self.write(trial_id, key, why)
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # the worker finished it meanwhile: its record wins
        self.finish(trial_id, status, None)


def _journal_log(storage: optuna.storages.JournalStorage, op: JournalOperation, trial_id: int,
                 worker_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """One record on ``trial_id`` as Optuna's JournalStorage writes it, issued by
    this process's worker id (so its replay refuses it as Optuna would) unless
    another is given."""
    return {"op_code": op, "worker_id": worker_id or storage._replay_result.worker_id,
            "trial_id": trial_id, **fields}


def _unchecked(storage: optuna.storages.JournalStorage) -> str:
    """A worker id no storage has: Optuna's replay refuses such a record on an
    ended trial without raising, in every process (its own records raise)."""
    return f"{storage._replay_result.worker_id}+hpo"
