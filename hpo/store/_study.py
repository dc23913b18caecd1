"""One study in an Optuna storage, as the master and the readers see it.

:class:`StudyStore` is the only code that reaches Optuna's private
attributes (a study's storage and id, a trial's id): Optuna offers no public
way to write an attribute on a trial by id from code that never asked for
it, which is what the master does all the time. Trial processes never use
it: they write through their :class:`~hpo.store.TrialLink`.
"""

from __future__ import annotations

import math
import os
import socket
import time
from functools import lru_cache
from typing import Any

import optuna

from hpo.store._format import trial_creation
from hpo.store._journal import JournalFile
from hpo.store._protocol import split_relay
from hpo.store.records import (
    CONTENDER_ATTR,
    ENDED_BY_ATTR,
    HEARTBEAT_ATTR,
    RESIZE_ATTR,
    RUN_ATTR,
    STOP_ATTR,
    ErrorRecord,
    RunRecord,
    TrialStatus,
    event_key,
    event_record,
    run_of,
    study_decisions,
)

__all__ = ["StudyStore", "open_storage"]


@lru_cache(maxsize=8)
def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open (once per process) the storage behind ``url``, outside a running
    study's master (which reads it through its relay): a reader's, a tool's.

    ``url`` is a SQLAlchemy URL when it contains ``://``, else the path of a
    journal file (a relay's address in it is ignored).
    """
    if "://" in url:
        return optuna.storages.RDBStorage(split_relay(url)[0], engine_kwargs=database_kwargs(url))
    # Sets a torn tail aside before appending; refuses damage in the middle.
    return optuna.storages.JournalStorage(JournalFile(split_relay(url)[0]))


def database_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine arguments for the database at ``url``."""
    # Several processes may write one SQLite file: wait for the lock
    # instead of failing at once with "database is locked".
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


class StudyStore:
    """Reads and writes one study's trials; see :mod:`hpo.store.records` for
    the layout and who may write what."""

    def __init__(self, storage: optuna.storages.BaseStorage, name: str) -> None:
        self.storage = storage
        self.name = name
        self.study_id = storage.get_study_id_from_name(name)  # KeyError: no such study

    @classmethod
    def of(cls, study: optuna.Study) -> StudyStore:
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
        return self.decisions().get(STOP_ATTR)

    def decisions(self) -> dict[str, Any]:
        """The master's study attributes (stop, contender, resize). They are
        system attributes, kept out of the user's view (optuna-dashboard);
        a store of an earlier version kept them as user attributes."""
        return study_decisions(self.storage.get_study_user_attrs(self.study_id),
                               self.storage.get_study_system_attrs(self.study_id))

    # -- writing ---------------------------------------------------------------

    def set_stop(self, reason: dict[str, Any] | None) -> None:
        self.storage.set_study_system_attr(self.study_id, STOP_ATTR, reason)

    def contender(self) -> float | None:
        """The convergence a running trial must reach to keep its slot (None: nobody waits)."""
        # Read at a quantum's end only, and it must be the master's latest word.
        value = self.decisions().get(CONTENDER_ATTR)
        return float(value) if value is not None else None  # "inf" is stored as a string

    def set_contender(self, value: float | None) -> None:
        stored = None if value is None else (str(value) if math.isinf(value) else value)
        self.storage.set_study_system_attr(self.study_id, CONTENDER_ATTR, stored)

    def set_resize(self, trial_id: int, gpus: int | None) -> None:
        """Ask trial ``trial_id`` to grow to ``gpus`` GPUs (None: withdraw it)."""
        asked = dict(self.decisions().get(RESIZE_ATTR) or {})
        if gpus is None:
            asked.pop(str(trial_id), None)
        else:
            asked[str(trial_id)] = gpus
        self.storage.set_study_system_attr(self.study_id, RESIZE_ATTR, asked)

    def create_trial(self, params: dict[str, Any],
                     distributions: dict[str, optuna.distributions.BaseDistribution]) -> tuple[int, int]:
        """Store a PENDING trial with ``params`` in one write; its id and number."""
        return self.create_trials([(params, distributions)])[0]

    def create_trials(self, configurations: list[tuple[dict[str, Any], dict[str, Any]]]
                      ) -> list[tuple[int, int]]:
        """Store a PENDING trial for each ``(params, distributions)``; their
        ids and numbers. On a journal, all in one append (one fsync): a
        master filling a thousand slots waits once, not a thousand times."""
        templates = [optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, params=p,
                                               distributions=d) for p, d in configurations]
        storage = self.storage
        if not isinstance(storage, optuna.storages.JournalStorage) or len(templates) < 2:
            ids = [storage.create_new_trial(self.study_id, template_trial=t) for t in templates]
            return [(i, storage.get_trial_number_from_id(i)) for i in ids]
        with storage._thread_lock:
            replay = storage._replay_result
            records = [trial_creation(replay.worker_id, self.study_id, t) for t in templates]
            storage._backend.append_logs(records)
            storage._sync_with_backend()
            last = replay._last_created_trial_id_by_this_process
            ids = list(range(last - len(records) + 1, last + 1))  # one append: consecutive ids
            return [(i, replay.get_trial(i).number) for i in ids]

    def write_run(self, trial_id: int, run: RunRecord) -> None:
        self.write(trial_id, RUN_ATTR, run)

    def write(self, trial_id: int, key: str, value: Any) -> None:
        """One ``hpo`` attribute of a trial (records.py), in one write."""
        self.storage.set_trial_system_attr(trial_id, key, value)

    def note(self, trial_id: int, key: str, value: Any) -> bool:
        """Write a decision on a trial its attempt may end at any moment (an
        event, an allocation, giving it up); False when it ended first: its
        end stands, and the decision is moot."""
        try:
            self.write(trial_id, key, value)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

    def record_event(self, trial_id: int, kind: str, step: int | None, reason: str) -> bool:
        """Write one decision on a trial (the master and workers both do);
        False when the trial ended first (:meth:`note`)."""
        event = event_record(kind, step, reason, socket.gethostname())
        return self.note(trial_id, event_key(time.time_ns(), os.getpid()), event)

    def abandon(self, trial_id: int) -> bool:
        """A master that stops gives a running trial up: the next master resumes
        it at once instead of waiting for its heartbeat to go stale. False
        when it ended first (:meth:`note`)."""
        return self.note(trial_id, HEARTBEAT_ATTR, {"abandoned_at": time.time()})

    def finish(self, trial_id: int, status: TrialStatus, value: float | list[float] | None,
               run: RunRecord | None = None) -> bool:
        """End a trial no attempt runs with ``status`` and its value (a list:
        one per objective), with its final ``run`` record when given; False
        when it had ended already (the first end wins: a finished trial never
        changes, nor does its record)."""
        values = None if value is None else list(value) if isinstance(value, list) else [value]
        try:
            if run is not None:
                self.write_run(trial_id, run)
            self.storage.set_trial_state_values(trial_id, status.stored_as, values)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

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
        """Write why a trial ended, then end it, unless a worker finished it
        first: its record wins."""
        if self.note(trial_id, key, why):
            self.finish(trial_id, status, None)

