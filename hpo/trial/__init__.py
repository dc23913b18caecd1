"""Trials: the handle objectives receive and the task engines run.

- ``_task``: the :class:`TrialTask` the master fills and an engine ships;
- ``_run``: :func:`run_trial`, what a worker runs for it;
- ``_attempt``: one run of the objective in this process, and what it means;
- ``_isolated`` (and ``_child``): the objective in a process of its own,
  forked from a warm process (``_warm``) that imported it already;
- ``_handle``: the :class:`Trial` the objective gets;
- ``_pulse``: heartbeats, and the master's time awake to hear them;
  ``_local_stop``: stops asked by a signal; ``_ending``: an objective that
  ends the master's process (the inline engine);
- ``_clock``: the trial's time, real or simulated (:func:`now`, :meth:`Trial.elapse`);
- ``_cpus``, ``_malloc``, ``_log``, ``_objective``, ``_quantum``: cores, the
  C allocator's mmap threshold (a Dask worker's fixes it low), the trial's log,
  finding the objective, the time-shared trial's clock and its quantum rule
  (Hermes' convergence: the worker judges itself, the master ranks by it).
"""

from hpo.store.records import TrialStatus
from hpo.trial._attempt import TaskInterrupted
from hpo.trial._clock import Clock, RealClock, now, using_clock
from hpo.trial._ending import ended_the_interpreter
from hpo.trial._handle import Trial
from hpo.trial._local_stop import request_suspend, stop_grace_s, suspend_requested
from hpo.trial._log import LOG_NAME, log_path
from hpo.trial._objective import (
    Objective,
    objective_path,
    preflight,
    reference_of,
    refuse_trials_while_importing,
    resolve_objective,
)
from hpo.trial._pulse import (
    SILENT_HEARTBEATS,
    Awake,
    awake_since,
    fell_silent,
    heartbeat_s,
    note_awake,
    silence_s,
)
from hpo.trial._quantum import QuantumRule, convergence, milestones_passed, representative_loss
from hpo.trial._run import open_trial, run_trial
from hpo.trial._task import TrialOutcome, TrialTask
from hpo.trial._warm import close_warm_processes

# The name used before TrialStatus; kept for scripts written against it.
TrialState = TrialStatus

__all__ = ["Trial", "TrialStatus", "TrialTask", "TrialOutcome", "run_trial",
           "open_trial", "resolve_objective", "refuse_trials_while_importing", "objective_path",
           "preflight", "reference_of", "Objective", "heartbeat_s",
           "fell_silent", "SILENT_HEARTBEATS", "silence_s", "note_awake", "awake_since", "Awake",
           "ended_the_interpreter", "request_suspend", "suspend_requested",
           "stop_grace_s", "LOG_NAME", "log_path", "QuantumRule", "convergence", "milestones_passed",
           "representative_loss", "Clock", "RealClock", "now", "using_clock", "TaskInterrupted",
           "close_warm_processes"]
