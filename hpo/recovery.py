"""Trials that did not end by themselves: what the master finds and does.

A master that starts on an existing study meets what an earlier run left:
trials still running somewhere (their heartbeat is fresh: wait for them),
trials lost with their worker or master (resumed as themselves from their
checkpoints), suspended trials (resumed), and trials created but never
started (cancelled; their configurations are proposed again). The master also
ends trials itself: cancelled when the study stops, failed when the engine
could not run their task.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import optuna

from hpo.trial import TrialState
from hpo.trial._state import ENDED_BY_ATTR, HEARTBEAT_ATTR, RUN_ATTR
from hpo.trial._task import heartbeat_s

__all__ = ["await_live_trials", "cancel_never_started", "unfinished", "end_trial", "fail_lost_trial"]


def cancel_never_started(storage: optuna.storages.BaseStorage, study_name: str) -> None:
    """Trials an earlier master created but no worker started are ended; their
    configurations are proposed again. Started ones are resumed instead."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return  # a new study
    for trial in storage.get_all_trials(study_id, deepcopy=False,
                                        states=(optuna.trial.TrialState.RUNNING,)):
        if TrialState.of(trial) is TrialState.PENDING:
            end_trial(storage, trial._trial_id, "interrupted", "never started by an earlier run")


def unfinished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials started by an earlier run and not finished: suspended, or lost."""
    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if TrialState.of(t) in (TrialState.SUSPENDED, TrialState.RUNNING)]


def _last_sign_of_life(trial: optuna.trial.FrozenTrial) -> float:
    run = trial.user_attrs.get(RUN_ATTR) or {}
    beat = trial.user_attrs.get(HEARTBEAT_ATTR)
    started = run.get("segment_started_at") or run.get("started_at") or 0.0
    if isinstance(beat, dict):  # given up by a master that stopped; alive if started since
        return started if started > beat["abandoned_at"] else 0.0
    return max(beat or 0.0, started)


def await_live_trials(storage: optuna.storages.BaseStorage, study_name: str, progress: bool) -> None:
    """Trials an earlier master left running may still run somewhere (a Dask
    worker outlives its client): wait until they finish or their heartbeat
    goes stale, so that no trial ever runs twice at once."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return  # a new study
    stale_after = 3 * heartbeat_s()
    told = False
    while True:
        running = [t for t in storage.get_all_trials(study_id, deepcopy=False,
                                                     states=(optuna.trial.TrialState.RUNNING,))
                   if TrialState.of(t) is TrialState.RUNNING
                   and time.time() - _last_sign_of_life(t) < stale_after]
        if not running:
            return
        if progress and not told:
            print(f"hpo: {len(running)} trials of an earlier run are still running (heartbeat); "
                  f"waiting until they finish or fall silent for {stale_after:g} s", file=sys.stderr)
            told = True
        time.sleep(min(1.0, stale_after / 10))


def end_trial(storage: optuna.storages.BaseStorage, trial_id: int, reason: str, message: str) -> None:
    """End a trial without a result: "cancelled" or "interrupted" (see ENDED_BY_ATTR)."""
    _fail(storage, trial_id, ENDED_BY_ATTR, {"reason": reason, "message": message})


def fail_lost_trial(storage: optuna.storages.BaseStorage, trial_id: int, message: str) -> None:
    """Record a trial whose task the engine could not run to the end as FAILED."""
    run = dict(storage.get_trial(trial_id).user_attrs.get(RUN_ATTR) or {})
    _fail(storage, trial_id, RUN_ATTR, {**run, "error": {"type": "EngineError", "message": message}})


def _fail(storage: optuna.storages.BaseStorage, trial_id: int, key: str, value: Any) -> None:
    """Write why a trial ended, then end it as FAIL, unless a worker finished it first."""
    try:
        storage.set_trial_user_attr(trial_id, key, value)
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # the worker finished it meanwhile: its record wins
