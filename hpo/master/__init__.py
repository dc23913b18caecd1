"""The master: the study loop and what it decides about trials.

- ``_loop``: :class:`Controller`, the loop that keeps ``parallel`` trials in
  flight until the budget, the space, the target or the time budget ends it;
- ``_lifecycle``: stop, cancel, suspend, and what an earlier run left behind;
- ``_scheduling``: which suspended trial gets the next free slot (FIFO,
  round-robin, SLAQ, convergence-aware);
- ``_pruning``: the relay's pruners (median, ASHA, Hyperband);
- ``_progress``: the progress line; ``_fail_fast``: the first trials all
  failing alike stop the study.

The allocator (:mod:`hpo.allocation`) is the master's too; the loop uses it
through its public face. Time and completions are read from the engine's
clock (``Engine.clock``).
"""

from hpo.master._fail_fast import MIN_SAME_FAILURES, FailFast, failures_to_stop
from hpo.master._lifecycle import (
    LOST_TASK_RETRIES,
    MASTER_DEATHS,
    NO_CHECKPOINT,
    InFlight,
    await_live_trials,
    cancel_pending,
    collect,
    fail_master_killers,
    fallen_silent,
    finished,
    machine_fault,
    never_started,
    nothing_left,
    resume_lost,
    saved_no_checkpoint,
    stop,
    stop_suspended,
    suspend_running,
    task_over,
    unfinished,
)
from hpo.master._loop import Controller
from hpo.master._progress import ProgressLine
from hpo.master._pruning import (
    AshaPruning,
    HyperbandPruning,
    MedianPruning,
    OptunaPruning,
    asha_pruning,
    hyperband_pruning,
    make_pruning,
    median_pruning,
)
from hpo.master._scheduling import (
    ConvergenceAware,
    Fifo,
    Policy,
    QuantumRule,
    RoundRobin,
    Slaq,
    Waiting,
    convergence,
    make_policy,
    milestones_passed,
    representative_loss,
    waiting_of,
)

__all__ = [
    "Controller", "InFlight", "task_over", "await_live_trials", "fail_master_killers", "MASTER_DEATHS",
    "nothing_left", "saved_no_checkpoint", "NO_CHECKPOINT", "fallen_silent", "machine_fault",
    "never_started", "unfinished", "finished", "collect", "stop", "cancel_pending", "suspend_running",
    "stop_suspended", "resume_lost", "LOST_TASK_RETRIES", "Waiting", "Policy", "Fifo", "RoundRobin",
    "ConvergenceAware", "Slaq", "QuantumRule", "make_policy", "waiting_of", "representative_loss",
    "convergence", "milestones_passed", "make_pruning", "MedianPruning", "AshaPruning",
    "HyperbandPruning", "OptunaPruning", "median_pruning", "asha_pruning", "hyperband_pruning",
    "ProgressLine", "FailFast", "MIN_SAME_FAILURES", "failures_to_stop",
]
