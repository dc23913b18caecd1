"""Chaos run: kill Dask workers and the master mid-study; nothing may be lost.

A Dask scheduler and 3 worker processes run on 127.0.0.1, each started here
as a separate ``dask scheduler`` / ``dask worker`` process (``--no-nanny``:
a killed worker stays dead until this script starts a new one, as a node
failure would leave it). A study of short ``hpo.examples.toy:curve`` trials
(6 steps of 0.15 s, 3 in parallel; ``bench/_acked.py`` runs the curve and
writes down each report ``trial.report`` returned for) runs as a master
subprocess,
``python -m hpo run SPACE --engine dask --scheduler FILE --runs-dir DIR --quiet``.
At seeded random moments, while trials are in flight:

1. a worker running a trial is killed (SIGKILL) while the master runs: Dask
   runs the task again on another worker, the trial records attempt 2 and a
   ``retried`` event; a new worker is started;
2. the master is killed (SIGKILL) while trials run; its Dask tasks go with
   it, but trials already running on workers go on and finish (a Dask worker
   outlives its client);
3. at once, a worker still running one of the dead master's trials is killed
   too (a node failure taking a worker with the master): that trial falls
   silent; a new worker is started, and the master is started again with the
   same command, until it exits 0. It waits for the trials still running
   (fresh heartbeat), resumes the silent one as itself from its checkpoint
   (``resumed`` event, attempt 2), and starts the trials the dead master had
   queued but no worker started, as they are.
4. the master hangs: it is stopped (SIGSTOP, a frozen node) with trials in
   flight until its lease goes stale, and the same command is run again
   (what a user does when a study looks hung). The first is let go on
   (SIGCONT) either early, once the new master holds the study (at a
   moment drawn among step 1's, before step 2), or late, once the new
   master has ended the study (exit 0, its lease removed; this step then
   comes last, at step 6's moment, and step 6 takes this step's). Either
   way it must find another master took the study and exit 75 without
   writing anything more (late: the journal, its epoch file and the lease
   are checked unchanged), and the new master must not wait on the trials
   the first was running. By default the grid study's master wakes early
   and the random study's late (``--wake`` picks one for all);
5. from the start, a second master runs the same command at the same
   moment: one of the two is refused (exit 2, the study's lease is held);
6. later, the Dask scheduler is killed (SIGKILL) with trials in flight: the
   master exits 75 without failing any trial; a new scheduler and new
   workers start (the old workers are killed: their node is gone too) and
   the same command resumes.

With ``--kills K`` there are K worker kills: the last one is step 3, the
others step 1. A process is never killed inside a journal append (Optuna's
lock file would stay behind and be broken only after 30 s: a stall, not a
loss); ``--kill-in-lock`` allows it.

The same space and seed then run undisturbed on the same cluster. The check:
every configuration of the budget COMPLETE exactly once, nothing left
RUNNING or PENDING, config -> value equal to the undisturbed run's, and
every report acknowledged to a trial (``trial.report`` returned) among the
stored trial's intermediate values (a later attempt's report of the same
step counts). Done for grid search and for seeded random search over
continuous ranges.

Run: ``python bench/chaos.py [--trials 30] [--algorithm grid|random|both]
[--seed S] [--kills 2] [--wake early|late]``. A live status line goes to
stderr, a summary table to stdout; the exit status is 1 when anything was
lost or differs. The last line is ``lost=<configurations missing>
duplicated=<configurations run twice> acknowledged_missing=<acknowledged
reports not in the store>`` (all algorithms).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import optuna  # noqa: E402

import hpo  # noqa: E402
from hpo.store import EPOCH_SUFFIX, JOURNAL_FILE, RunDir  # noqa: E402
from hpo.trial import TrialStatus  # noqa: E402
from hpo.store.records import run_of  # noqa: E402
from _acked import ACKS_FILE  # noqa: E402

WORKERS = 3
STEPS, STEP_S = 6, 0.15
HEARTBEAT_S = 1.0  # a silence window (3 s) that a loaded 2-core machine keeps: Dask's own heartbeats there gap 2 s
MASTER_TIMEOUT_S = 300
WAKE = {"grid": "early", "random": "late"}  # when the hung master is let go on, by default


# --------------------------------------------------------------- the cluster


class Cluster:
    """A ``dask scheduler`` and ``WORKERS`` ``dask worker --no-nanny`` processes on 127.0.0.1.

    With ``--no-nanny`` the worker runs in the process this script started,
    so its PID is the one trials record and the one to kill; nothing restarts
    it but :meth:`restart_worker`.
    """

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.scheduler_file = workdir / "scheduler.json"
        self.scheduler: subprocess.Popen | None = None
        self.workers: dict[int, subprocess.Popen] = {}
        self.dead: list[subprocess.Popen] = []  # killed workers, reaped at stop
        self._started = 0

    def start(self) -> "Cluster":
        self.scheduler_file.unlink(missing_ok=True)
        self.scheduler = self._spawn(
            ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", str(self.scheduler_file), "--dashboard-address", "127.0.0.1:0"],
            "scheduler")
        _wait(self.scheduler_file.exists, 60, "the scheduler file")
        for _ in range(WORKERS):
            self._start_worker()
        self.wait_for_workers(WORKERS)
        return self

    def kill_scheduler(self) -> int:
        pid = self.scheduler.pid
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait()
        return pid

    def replace(self) -> None:
        """A new scheduler and new workers, the old workers killed (their node
        went with the scheduler's): their trials fall silent and are resumed."""
        for pid in list(self.workers):
            self.kill_worker(pid)
        self.start()

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.workdir / f"{log_name}.log", "ab")
        try:
            return subprocess.Popen([sys.executable, "-m", *args], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def _start_worker(self) -> int:
        self._started += 1
        name = f"worker-{self._started}"
        local = self.workdir / name
        local.mkdir()
        proc = self._spawn(
            ["distributed.cli.dask_worker", "--scheduler-file", str(self.scheduler_file),
             "--nworkers", "1", "--nthreads", "1", "--resources", "CPU=1", "--no-nanny",
             "--host", "127.0.0.1", "--no-dashboard", "--name", name, "--local-directory", str(local)],
            name)
        self.workers[proc.pid] = proc
        return proc.pid

    def wait_for_workers(self, n: int) -> None:
        from distributed import Client

        with Client(scheduler_file=str(self.scheduler_file), timeout=60) as client:
            client.wait_for_workers(n, timeout=120)

    def kill_worker(self, pid: int) -> None:
        proc = self.workers.pop(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.dead.append(proc)

    def restart_worker(self) -> int:
        return self._start_worker()

    def pids(self) -> list[int]:
        procs = [self.scheduler, *self.workers.values(), *self.dead]
        return [p.pid for p in procs if p is not None]

    def stop(self) -> None:
        """Workers first, then the scheduler, each by PID; SIGKILL after 30 s."""
        for proc in [*self.workers.values(), self.scheduler]:
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()


# ------------------------------------------------------------------ spaces


def space(algorithm: str, trials: int, seed: int, acks_dir: Path | None = None) -> dict[str, Any]:
    """``trials`` short curve trials: a grid of trials points, or random search
    over continuous ranges (no two configurations alike). The trials list the
    reports the store acknowledged in ``acks_dir``, if given."""
    if algorithm == "grid":
        rates = [0.3, 0.6, 0.9]
        per = math.ceil(trials / len(rates))
        params = {"quality": {"type": "float", "low": 0.5, "high": 1.0, "num": per},
                  "rate": rates[: math.ceil(trials / per)]}
    else:
        params = {"quality": {"type": "float", "low": 0.5, "high": 1.0},
                  "rate": {"type": "float", "low": 0.2, "high": 1.0, "log": True}}
    fixed: dict[str, Any] = {"steps": STEPS, "step_s": STEP_S}
    if acks_dir is not None:
        fixed["acks_dir"] = str(acks_dir)
    return {
        "name": f"chaos-{algorithm}", "objective": "_acked:curve",
        "metric": {"name": "value", "direction": "maximize"},
        "search": {"algorithm": algorithm, "max_trials": trials, "parallel": WORKERS, "seed": seed},
        "fixed": fixed,
        "space": params,
    }


# ------------------------------------------------------------- the store


def trials_of(run_dir: Path) -> list[optuna.trial.FrozenTrial]:
    """The study's trials as stored now ([] before the master created it)."""
    try:
        return RunDir(run_dir).load_study().get_trials(deepcopy=False)
    except (hpo.UsageError, KeyError, ValueError, FileNotFoundError, json.JSONDecodeError):
        return []


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _journal_locked(run_dir: Path) -> bool:
    return os.path.lexists(run_dir / (JOURNAL_FILE + ".lock"))


def store_state(run_dir: Path) -> tuple:
    """What a master writes to take or run the study: the journal (append
    only: its size and time), its epoch file and the lease."""
    def seen(path: Path) -> tuple | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    journal = run_dir / JOURNAL_FILE
    return (seen(journal), seen(Path(f"{journal}{EPOCH_SUFFIX}")), seen(run_dir / "master.lease"))


def acknowledged_missing(acks_dir: Path, run_dir: Path) -> tuple[int, list[str]]:
    """The reports the trials were told were stored (``trial.report``
    returned), and those of them the store does not hold: no intermediate
    value at that step of that trial (any attempt's)."""
    stored = {t.number: t.intermediate_values for t in trials_of(run_dir)}
    try:
        lines = (acks_dir / ACKS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return 0, []
    missing = []
    for line in lines:
        number, step, value = line.split()
        if int(step) not in stored.get(int(number), {}):
            missing.append(f"trial {number} step {step} ({value})")
    return len(lines), missing


# -------------------------------------------------------------- the run


@dataclass
class Outcome:
    """What one study (disturbed or not) left in its store."""

    algorithm: str
    completed: int = 0
    retried: int = 0
    resumed: int = 0
    cancelled_rerun: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)  # RUNNING / PENDING / SUSPENDED at the end
    other_states: dict[str, int] = field(default_factory=dict)
    results: dict[str, float] = field(default_factory=dict)
    equal: bool | None = None
    wall_s: float = 0.0
    kills: list[str] = field(default_factory=list)
    # (pid, whether the master was up) of each worker killed
    worker_kills: list[tuple[int, bool]] = field(default_factory=list)
    master_runs: int = 0
    twin_exit: int | None = None  # the refused one of two masters started at once (2)
    scheduler_exit: int | None = None  # the master's, after its scheduler was killed (75)
    hung_exit: int | None = None  # the hung master's, let go on after another took over (75)
    wake: str = ""  # when the hung master was let go on: "early" (the other running) or "late" (it ended)
    hung_wrote: bool | None = None  # whether the store changed once the late-woken master went on
    acknowledged: int = 0  # reports trial.report returned for
    acknowledged_missing: list[str] = field(default_factory=list)  # of those, the ones not stored
    master_pids: list[int] = field(default_factory=list)
    run_dir: Path | None = None
    retried_numbers: list[int] = field(default_factory=list)
    resumed_numbers: list[int] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.duplicated)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and not self.unfinished and not self.other_states
                and self.equal is not False and self.twin_exit in (None, 2)
                and self.scheduler_exit in (None, 75) and self.hung_exit in (None, 75)
                and self.hung_wrote is not True and not self.acknowledged_missing)


def examine(run_dir: Path, algorithm: str) -> Outcome:
    """Count what the store holds: completed, retried, resumed, cancelled and re-run."""
    out = Outcome(algorithm)
    trials = trials_of(run_dir)
    complete = Counter()
    cancelled = set()
    for t in trials:
        state = TrialStatus.of(t)
        record = hpo.TrialRecord.from_frozen(t)
        kinds = [e.get("kind") for e in record.events]
        if record.attempt > 1 or "retried" in kinds:
            out.retried_numbers.append(t.number)
        if "resumed" in kinds:
            out.resumed_numbers.append(t.number)
        if state is TrialStatus.COMPLETE:
            complete[_key(t.params)] += 1
            out.results[_key(t.params)] = t.value
        elif state is TrialStatus.CANCELLED:
            cancelled.add(_key(t.params))
        elif state in (TrialStatus.RUNNING, TrialStatus.PENDING, TrialStatus.SUSPENDED):
            out.unfinished.append(t.number)
        else:
            out.other_states[state.value] = out.other_states.get(state.value, 0) + 1
    out.completed = sum(complete.values())
    out.retried, out.resumed = len(out.retried_numbers), len(out.resumed_numbers)
    out.cancelled_rerun = len(cancelled & set(complete))
    out.duplicated = sorted(k for k, n in complete.items() if n > 1)
    return out


class Status:
    """The live status line on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live = enabled and sys.stderr.isatty()
        self._last: object = ""

    def show(self, line: str, key: object = None) -> None:
        """Redraw ``line`` on a terminal; elsewhere write it when ``key`` changes."""
        key = line if self.live or key is None else key
        if not self.enabled or key == self._last:
            return
        self._last = key
        sys.stderr.write(("\r" + line.ljust(110)) if self.live else line + "\n")
        sys.stderr.flush()

    def note(self, line: str) -> None:
        if self.enabled:
            sys.stderr.write(("\r" + " " * 110 + "\r" if self.live else "") + line + "\n")
            sys.stderr.flush()
            self._last = ""


@dataclass
class Study:
    """One study run as a master subprocess on the cluster."""

    cluster: Cluster
    spec: dict[str, Any]
    runs_dir: Path
    env: dict[str, str]
    label: str
    status: Status
    master: subprocess.Popen | None = None
    master_started: float = 0.0
    runs: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.spec["name"]

    def command(self) -> list[str]:
        path = self.runs_dir / "space.json"
        path.write_text(json.dumps(self.spec, indent=2))
        return [sys.executable, "-m", "hpo", "run", str(path), "--engine", "dask",
                "--scheduler", str(self.cluster.scheduler_file), "--runs-dir", str(self.runs_dir),
                "--quiet"]

    def start_master(self) -> None:
        self.master = self._spawn_master()

    def start_twin_masters(self) -> int:
        """Two masters at the same moment; one must be refused (exit 2). The
        one left running becomes the study's master; the other's exit status."""
        first, second = self._spawn_master(), self._spawn_master()
        _wait(lambda: first.poll() is not None or second.poll() is not None, 120, "one of two masters")
        refused, self.master = (first, second) if first.poll() is not None else (second, first)
        return refused.returncode

    def _spawn_master(self) -> subprocess.Popen:
        self.runs += 1
        self.master_started = time.time()
        log = open(self.runs_dir / f"master-{self.runs}.log", "ab")
        try:
            master = subprocess.Popen(self.command(), env=self.env, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self.pids.append(master.pid)
        return master

    def master_alive(self) -> bool:
        return self.master is not None and self.master.poll() is None

    def hang_master(self, late: bool, allow_in_lock: bool) -> tuple[int, int | None, bool | None]:
        """Stop the master until its lease is stale, run the same command
        again, let the first go on once the second holds the study or, when
        ``late``, once the second has ended. The first's exit status (it
        must find it lost the study: 75); when late, the second's exit
        status and whether the store changed after the first went on."""
        first, lease = self.master, self.run_dir / "master.lease"
        second_exit = before = None
        _kill_outside_append(lambda: first.send_signal(signal.SIGSTOP), self.run_dir, allow_in_lock)
        try:
            _wait(lambda: time.time() - lease.stat().st_mtime > 3 * HEARTBEAT_S + 0.5, 60,
                  "the stopped master's lease to go stale")
            self.master = second = self._spawn_master()
            _wait(lambda: _lease_pid(lease) == second.pid, 120, "the second master to hold the study",
                  self.master_alive)
            if late:
                second_exit = second.wait(timeout=MASTER_TIMEOUT_S)
                before = store_state(self.run_dir)
        finally:
            first.send_signal(signal.SIGCONT)
        first.wait(timeout=MASTER_TIMEOUT_S)
        return first.returncode, second_exit, (store_state(self.run_dir) != before if late else None)

    def kill_master(self) -> None:
        self.master.send_signal(signal.SIGKILL)
        self.master.wait()

    def stop(self) -> None:
        if self.master_alive():
            self.kill_master()

    def show(self, started: float) -> int:
        """Update the status line; the number of COMPLETE trials."""
        states = Counter(TrialStatus.of(t).value for t in trials_of(self.run_dir))
        done = states.get("COMPLETE", 0)
        self.status.show(
            f"[{self.label}] {done}/{self.spec['search']['max_trials']} complete | "
            f"{states.get('RUNNING', 0)} running | {states.get('PENDING', 0)} queued | "
            f"{states.get('CANCELLED', 0)} cancelled | master run {self.runs} | "
            f"{time.monotonic() - started:5.1f} s", key=(done, self.runs))
        return done

    def finish(self, started: float) -> None:
        """Wait for the master; run the same command again until it exits 0."""
        while True:
            deadline = time.monotonic() + MASTER_TIMEOUT_S
            while self.master.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.label}: the master ran over {MASTER_TIMEOUT_S} s")
                self.show(started)
                time.sleep(0.2)
            if self.master.returncode == 0:
                return
            if self.runs >= 5:
                raise RuntimeError(f"{self.label}: the master exited {self.master.returncode} "
                                   f"{self.runs} times; see {self.runs_dir}/master-*.log")
            self.status.note(f"[{self.label}] master exited {self.master.returncode}: same command again")
            self.start_master()


def _lease_pid(lease: Path) -> int | None:
    try:
        return json.loads(lease.read_text()).get("pid")
    except (OSError, ValueError):
        return None


def running_trials(run_dir: Path, min_steps: int = 1) -> list[optuna.trial.FrozenTrial]:
    """Trials a worker is running now, with at least ``min_steps`` reports."""
    return [t for t in trials_of(run_dir) if TrialStatus.of(t) is TrialStatus.RUNNING
            and len(t.intermediate_values) >= min_steps]


def _created_since(run_dir: Path, since: float) -> bool:
    return any(t.datetime_start and t.datetime_start.timestamp() >= since for t in trials_of(run_dir))


def _busy_workers(study: Study, allow_in_lock: bool, reported: int = 1, left: int = 3) -> list[int]:
    """The workers mid-trial: their PIDs are in the run record of a RUNNING
    trial that has reported at least ``reported`` steps and has at least
    ``left`` to go."""
    if not allow_in_lock and _journal_locked(study.run_dir):
        return []
    return sorted({run_of(t).get("pid")
                   for t in running_trials(study.run_dir, min_steps=reported)
                   if len(t.intermediate_values) <= STEPS - left} & set(study.cluster.workers))


def _victim(study: Study, rng: random.Random, allow_in_lock: bool) -> int | None:
    """A worker mid-trial, at least 3 steps to go."""
    pids = _busy_workers(study, allow_in_lock)
    return rng.choice(pids) if pids else None


def _kill_a_busy_worker(study: Study, cluster: Cluster, rng: random.Random,
                        allow_in_lock: bool) -> tuple[int, str]:
    """SIGKILL a worker mid-trial: its PID and the lock note. The worker is
    stopped first and killed only if its trial is still running then; else
    it goes on and another is picked (on a loaded machine, the wait for a
    moment outside an append can outlast a short trial)."""
    while True:
        pid = _wait(lambda: _victim(study, rng, allow_in_lock), 60, "a worker mid-trial",
                    study.master_alive)
        killed: list[int] = []

        def kill() -> None:
            os.kill(pid, signal.SIGSTOP)  # its trial can no longer end meanwhile
            # Two steps left on disk: the last report and the end may be on
            # their way to the relay already, a step more cannot be.
            if pid in _busy_workers(study, True, reported=1, left=2):
                cluster.kill_worker(pid)
                killed.append(pid)
            else:
                os.kill(pid, signal.SIGCONT)

        held = _kill_outside_append(kill, study.run_dir, allow_in_lock)
        if killed:
            return pid, held


def _kill_outside_append(kill, run_dir: Path, allow_in_lock: bool) -> str:
    """Call ``kill`` at a moment no process holds the journal's lock (unless
    allowed): a process killed inside an append leaves the lock file behind,
    which other writers break only after 30 s. Returns a note when a lock file
    is there right after the kill (then a stall of up to 30 s may follow)."""
    deadline = time.monotonic() + 5
    while not allow_in_lock and _journal_locked(run_dir) and time.monotonic() < deadline:
        time.sleep(0.0002)
    kill()
    return ", journal lock file present after the kill" if _journal_locked(run_dir) else ""


def chaos_run(cluster: Cluster, spec: dict[str, Any], runs_dir: Path, env: dict[str, str],
              rng: random.Random, kills: int, status: Status, allow_in_lock: bool = False,
              wake: str = "early") -> Outcome:
    """Run the study while killing ``kills`` workers and the master once, and
    hanging the master once (let go on ``wake``: early or late); restart them."""
    trials = spec["search"]["max_trials"]
    study = Study(cluster, spec, runs_dir, env, f"{spec['search']['algorithm']} chaos", status)
    # Seeded moments: numbers of completed trials after which a kill is due,
    # plus a random delay of up to one trial's length.
    early = sorted(rng.randint(max(1, trials // 10), max(1, trials * 2 // 5)) for _ in range(kills - 1))
    master_at = rng.randint(max(1, trials * 2 // 5) + 1, max(2, trials * 7 // 10))
    scheduler_at = rng.randint(master_at + 1, max(master_at + 1, trials * 17 // 20))
    hung_at = rng.randint(max(1, trials // 10), max(1, trials * 2 // 5))  # drawn last: same moments as before
    if wake == "early":
        plan = sorted([("worker", n) for n in early] + [("hung", hung_at)], key=lambda step: step[1]) \
            + [("master", master_at), ("scheduler", scheduler_at)]
    else:
        # The second master ends the study, so the hang comes last, and the
        # scheduler is killed at the hang's early moment instead.
        plan = sorted([("worker", n) for n in early] + [("scheduler", hung_at)], key=lambda step: step[1]) \
            + [("master", master_at), ("late", scheduler_at)]
    killed: list[str] = []
    worker_kills: list[tuple[int, bool]] = []
    done = 0
    started = time.monotonic()
    twin_exit = study.start_twin_masters()
    killed.append(f"a second master at once (exit {twin_exit})")
    scheduler_exit = hung_exit = hung_wrote = None
    try:
        for what, after in plan:
            _wait(lambda: _progress(study, started, after), MASTER_TIMEOUT_S,
                  f"{after} completed trials", study.master_alive)
            pause = rng.uniform(0, STEPS * STEP_S / 2)
            if what != "late":  # the late hang needs trials left for the second master
                time.sleep(pause)
            if what == "worker":
                pid, held = _kill_a_busy_worker(study, cluster, rng, allow_in_lock)
                worker_kills.append((pid, True))
                new = cluster.restart_worker()
                killed.append(f"worker {pid} (SIGKILL, master up{held}) -> new worker {new}")
            elif what == "hung":
                pid = study.master.pid
                hung_exit, _, _ = study.hang_master(False, allow_in_lock)
                killed.append(f"master {pid} hung (SIGSTOP) while a second took over, then let go "
                              f"on (exit {hung_exit})")
            elif what == "late":
                # The master at work: it holds the study and a worker runs one of its trials.
                _wait(lambda: _lease_pid(study.run_dir / "master.lease") == study.master.pid
                      and _busy_workers(study, allow_in_lock, reported=0, left=1), 120,
                      "a trial in flight", study.master_alive)
                pid = study.master.pid
                hung_exit, second_exit, hung_wrote = study.hang_master(True, allow_in_lock)
                killed.append(f"master {pid} hung (SIGSTOP) while a second ran the study to its end "
                              f"(exit {second_exit}), then let go on (exit {hung_exit}, "
                              f"{'wrote to the store' if hung_wrote else 'wrote nothing'})")
            elif what == "scheduler":
                # The master must be at work on the scheduler (it created a trial), not still connecting.
                _wait(lambda: _created_since(study.run_dir, study.master_started), 120,
                      "a trial created by the running master", study.master_alive)
                pid = cluster.kill_scheduler()
                study.master.wait(timeout=MASTER_TIMEOUT_S)
                scheduler_exit = study.master.returncode
                cluster.replace()
                killed.append(f"scheduler {pid} (SIGKILL; master exit {scheduler_exit}) -> new "
                              "scheduler and workers")
                study.start_master()
            else:
                # Trials in flight, one of them on the worker that dies with the master.
                victim = _wait(lambda: _victim(study, rng, allow_in_lock), 60, "trials in flight",
                               study.master_alive)
                pid = study.master.pid
                held = _kill_outside_append(study.kill_master, study.run_dir, allow_in_lock)
                killed.append(f"master {pid} (SIGKILL{held})")
                if kills:
                    # A node failure taking a worker with the master: one of the
                    # dead master's trials falls silent and must be resumed.
                    held = _kill_outside_append(lambda: cluster.kill_worker(victim), study.run_dir,
                                                allow_in_lock)
                    worker_kills.append((victim, False))
                    new = cluster.restart_worker()
                    killed.append(f"worker {victim} (SIGKILL, master down{held}) -> new worker {new}")
                study.start_master()
            status.note(f"[{study.label}] killed " + ", ".join(killed[done:]))
            done = len(killed)
        study.finish(started)
    finally:
        study.stop()
    out = examine(study.run_dir, spec["search"]["algorithm"])
    out.wall_s, out.kills, out.worker_kills = time.monotonic() - started, killed, worker_kills
    out.master_runs, out.master_pids, out.run_dir = study.runs, study.pids, study.run_dir
    out.twin_exit, out.scheduler_exit, out.hung_exit = twin_exit, scheduler_exit, hung_exit
    out.wake, out.hung_wrote = wake, hung_wrote
    if "acks_dir" in spec["fixed"]:
        out.acknowledged, out.acknowledged_missing = acknowledged_missing(
            Path(spec["fixed"]["acks_dir"]), study.run_dir)
    return out


def undisturbed_run(cluster: Cluster, spec: dict[str, Any], runs_dir: Path, env: dict[str, str],
                    status: Status) -> Outcome:
    study = Study(cluster, spec, runs_dir, env, f"{spec['search']['algorithm']} undisturbed", status)
    started = time.monotonic()
    study.start_master()
    try:
        study.finish(started)
    finally:
        study.stop()
    out = examine(study.run_dir, spec["search"]["algorithm"])
    out.wall_s, out.master_runs = time.monotonic() - started, study.runs
    out.master_pids, out.run_dir = study.pids, study.run_dir
    return out


def compare(chaos: Outcome, reference: Outcome) -> None:
    """Fill in what the disturbed run lost or got wrong against the reference."""
    chaos.missing = sorted(set(reference.results) - set(chaos.results))
    chaos.equal = chaos.results == reference.results


def _progress(study: Study, started: float, after: int) -> bool:
    return study.show(started) >= after


def _wait(condition, timeout: float, what: str, alive=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if alive is not None and not alive():
            raise RuntimeError(f"the master ended while waiting for {what}")
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def chaos_env() -> dict[str, str]:
    """The masters' and workers' environment: they import hpo from here and
    the objective from bench/."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path,
            "HPO_HEARTBEAT_S": str(HEARTBEAT_S), "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_all(workdir: Path, algorithms: list[str], trials: int, seed: int, kills: int,
            status: Status, allow_in_lock: bool = False, cluster: Cluster | None = None,
            wake: str | None = None) -> list[Outcome]:
    """The chaos run and the undisturbed run of each algorithm, on one cluster;
    the hung master wakes ``wake`` (default: by algorithm, ``WAKE``)."""
    env = chaos_env()
    own = cluster is None
    cluster = cluster or Cluster(workdir, env).start()
    rng = random.Random(seed)
    outcomes = []
    try:
        for algorithm in algorithms:
            chaos_dir, ref_dir = workdir / f"{algorithm}-chaos", workdir / f"{algorithm}-undisturbed"
            acks_dir = workdir / f"{algorithm}-acknowledged"
            for folder in (chaos_dir, ref_dir, acks_dir):
                folder.mkdir()
            chaos = chaos_run(cluster, space(algorithm, trials, seed, acks_dir), chaos_dir, env, rng,
                              kills, status, allow_in_lock, wake or WAKE[algorithm])
            reference = undisturbed_run(cluster, space(algorithm, trials, seed), ref_dir, env, status)
            compare(chaos, reference)
            if reference.lost or len(reference.results) != trials:
                chaos.equal = False  # the reference itself is wrong
            outcomes.append(chaos)
    finally:
        if own:
            cluster.stop()
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    head = ("algorithm", "completed", "retried", "resumed", "cancelled+rerun", "lost", "duplicated",
            "acknowledged", "ack missing", "twin exit", "hung master exit", "woke",
            "exit after scheduler kill", "equal", "wall_s")
    rows = [head] + [(o.algorithm, str(o.completed), str(o.retried), str(o.resumed),
                      str(o.cancelled_rerun), str(len(o.missing)), str(len(o.duplicated)),
                      str(o.acknowledged), str(len(o.acknowledged_missing)), str(o.twin_exit),
                      str(o.hung_exit), _woke(o), str(o.scheduler_exit), "yes" if o.equal else "no",
                      f"{o.wall_s:.1f}") for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _woke(o: Outcome) -> str:
    """When the hung master went on; when late, whether the store stayed as the second left it."""
    if o.wake != "late":
        return o.wake
    return "late, wrote" if o.hung_wrote else "late, wrote nothing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="trial budget of each study (30)")
    parser.add_argument("--algorithm", choices=("grid", "random", "both"), default="both")
    parser.add_argument("--seed", type=int, default=None, help="seed of the search and the kills (random)")
    parser.add_argument("--kills", type=int, default=2, help="worker kills per study (2)")
    parser.add_argument("--kill-in-lock", action="store_true",
                        help="allow killing a process inside a journal append (a 30 s stall)")
    parser.add_argument("--wake", choices=("early", "late"),
                        help="let the hung master go on while the second master runs (early) or "
                             "after it ended (late); default: early for grid, late for random")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the run directories and logs")
    args = parser.parse_args()
    if args.trials < 10 or args.kills < 0:
        parser.error("--trials must be at least 10 and --kills at least 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    algorithms = ["grid", "random"] if args.algorithm == "both" else [args.algorithm]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    print(f"chaos: {args.trials} trials of {STEPS} x {STEP_S} s, {WORKERS} dask workers, "
          f"{args.kills} worker kills, 1 hung master (woken {args.wake or 'early for grid, late for random'}) "
          f"and 1 master kill per study, seed {seed}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="hpo-chaos-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        outcomes = run_all(workdir, algorithms, args.trials, seed, args.kills, Status(True),
                           args.kill_in_lock, wake=args.wake)
    for o in outcomes:
        print(f"{o.algorithm}: " + "; ".join(o.kills) + f"; master ran {o.master_runs} times")
        for name, items in (("missing", o.missing), ("duplicated", o.duplicated),
                            ("acknowledged but not stored", o.acknowledged_missing)):
            if items:
                print(f"  {name}: {', '.join(items)}")
        if o.unfinished or o.other_states:
            print(f"  left unfinished: trials {o.unfinished}; other states: {o.other_states}")
        if not o.equal:
            print("  results differ from the undisturbed run")
    print()
    print(table(outcomes))
    print(f"lost={sum(len(o.missing) for o in outcomes)} "
          f"duplicated={sum(len(o.duplicated) for o in outcomes)} "
          f"acknowledged_missing={sum(len(o.acknowledged_missing) for o in outcomes)}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
