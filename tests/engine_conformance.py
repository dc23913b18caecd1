"""What every engine must do, as one suite (after Optuna's ``StorageTestCase``).

A test module joins an engine by subclassing :class:`EngineConformance` and
supplying a ``kit`` fixture: an :class:`EngineKit` that says how to make the
engine, run ``hpo`` with it in a child process, and lose a worker under a
running trial. Every behaviour runs real trials that write a real store.
"""

from __future__ import annotations

import abc
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import hpo
from hpo.engines import Engine, FollowsTasks, gather
from hpo.master import task_over
from hpo.search import create_study
from hpo.space import StudySpec, parse_spec
from hpo.store import RunDir, StudyRelay, StudyStore, open_storage
from hpo.store.records import run_of
from hpo.trial import TrialTask
from conftest import ROOT, STORAGE_SPY, toy_space, wait_for

DRIVER = Path(__file__).with_name("engine_driver.py")
# Short heartbeats: a restarted master knows a killed one's trial lost in 3 s.
CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HPO_HEARTBEAT_S": "1"}


class EngineKit(abc.ABC):
    """How the suite drives one engine; subclasses fill in the engine."""

    slots = 1  # trials the engine runs at once

    @abc.abstractmethod
    def engine(self, spec: StudySpec) -> Engine:
        """A fresh engine for ``spec``."""

    def run(self, space: dict[str, Any], runs_dir: Path) -> hpo.StudyResult:
        """Run ``space`` to its end in this process."""
        return hpo.run(space, engine=self.engine(parse_spec(space)), runs_dir=runs_dir,
                       progress=False)

    @abc.abstractmethod
    def command(self, space_file: Path, runs_dir: Path) -> list[str]:
        """``hpo run`` of ``space_file`` with this engine, as a child process."""

    def own_command(self, space_file: Path, runs_dir: Path) -> list[str]:
        """Like :meth:`command`, with every worker process started by the
        child itself (so that its environment reaches them)."""
        return self.command(space_file, runs_dir)

    def lose_worker(self, space_file: Path, runs_dir: Path, run_dir: Path) -> None:
        """Run the study and kill the process running its trial once it has
        reported 3 steps; return when the study has completed. Where trials
        run inside the master, the master dies with it and runs again."""
        study = subprocess.Popen(self.command(space_file, runs_dir), env=CHILD_ENV)
        wait_for(lambda: running_pid(run_dir, steps=3), what="3 reported steps")
        study.kill()
        assert study.wait(timeout=60) == -signal.SIGKILL
        again = subprocess.run(self.command(space_file, runs_dir), env=CHILD_ENV, timeout=180,
                               capture_output=True, text=True)
        assert again.returncode == 0, again.stderr


class EngineConformance:
    """The behaviours; each runs with the subclass's ``kit``."""

    def test_a_study_completes(self, kit: EngineKit, tmp_path):
        result = kit.run(toy_space("complete", search={"parallel": kit.slots}), tmp_path)
        assert result.counts["COMPLETE"] == 8 == len(result.trials)
        assert result.best.params == {"x": 2, "y": -1} and result.best.value == 0.0
        assert {tuple(sorted(t.params.items())) for t in result.trials} == {
            (("x", x), ("y", y)) for x in range(4) for y in (-1, 0)}  # each configuration once
        assert all(t.steps == 3 and t.attempt == 1 and t.host for t in result.trials)

    def test_every_write_goes_through_the_study_relay_once_and_in_order(self, kit, tmp_path,
                                                                        monkeypatch):
        relayed: list[dict[str, Any]] = []
        commit = StudyRelay._commit

        def counting(relay, records, written):
            relayed.extend(json.loads(json.dumps(r)) for r in records)
            return commit(relay, records, written)
        monkeypatch.setattr(StudyRelay, "_commit", counting)
        space = toy_space("relayed", fixed={"steps": 6}, search={"parallel": kit.slots})
        result = kit.run(space, tmp_path)
        assert result.counts["COMPLETE"] == 8 and all(t.steps == 6 for t in result.trials)
        journal = [json.loads(line) for line in (tmp_path / "relayed" / "journal.log").open()]
        assert relayed == journal  # every record, the study's creation included, once
        for trial in {r["trial_id"] for r in journal if "intermediate_value" in r}:
            steps = [r["step"] for r in relayed if r.get("trial_id") == trial and "step" in r]
            assert steps == list(range(6))  # every report once, in order

    def test_no_worker_or_trial_process_constructs_an_optuna_storage(self, kit, tmp_path):
        spy = tmp_path / "spy"
        spy.mkdir()
        space = toy_space("spied", fixed={"steps": 4}, search={"parallel": kit.slots},
                          resources={"time_limit_s": 60})  # isolated: a process per trial too
        space_file = write_space(tmp_path, space)
        env = {**CHILD_ENV, "HPO_TEST_STORAGE_SPY": str(spy),
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(STORAGE_SPY)])}
        master = subprocess.Popen(kit.own_command(space_file, tmp_path / "runs"), env=env,
                                  stderr=subprocess.PIPE, text=True)
        _, stderr = master.communicate(timeout=300)
        assert master.returncode == 0, stderr
        assert hpo.StudyResult.load(tmp_path / "runs" / "spied").counts["COMPLETE"] == 8
        built = {int(f.name): f.read_text().splitlines() for f in spy.iterdir()}
        assert set(built) == {master.pid}  # the master's replica; no worker's, no trial's
        assert {line.split()[1] for lines in built.values() for line in lines} == {"MainThread"}

    def test_a_study_completes_when_its_workers_cannot_reach_the_relay(self, kit, tmp_path):
        space = toy_space("unreachable", "hpo.examples.toy:curve", metric={"target": 0.9},
                          fixed={"steps": 12, "quality": 0.95, "rate": 2.0},
                          search={"parallel": kit.slots}, space={"step_s": [0.05, 0.3, 0.32, 0.34]})
        space_file = write_space(tmp_path, space)
        env = {**CHILD_ENV, "HPO_TEST_UNREACHABLE_RELAY": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(STORAGE_SPY)])}
        study = subprocess.run(kit.own_command(space_file, tmp_path / "runs"), env=env, timeout=300,
                               capture_output=True, text=True)
        assert study.returncode == 0, study.stderr
        assert "cannot be reached" in study.stderr and "control file" in study.stderr
        result = hpo.StudyResult.load(tmp_path / "runs" / "unreachable")
        assert result.stop["reason"] == "target"  # the stop reached them through the control file
        assert all(t.state in (hpo.TrialStatus.COMPLETE, hpo.TrialStatus.STOPPED,
                               hpo.TrialStatus.CANCELLED) for t in result.trials)
        assert result.counts["COMPLETE"] >= 1 and all((t.attempt or 0) <= 1 for t in result.trials)

    def test_resources_no_worker_offers_are_refused_before_anything_starts(self, kit, tmp_path):
        space = toy_space("toobig", resources={"gpus": 64})
        with pytest.raises(hpo.EngineError, match=r"resources.*64|64.*GPU"):
            kit.run(space, tmp_path)
        run_dir = tmp_path / "toobig"
        assert not (run_dir / "journal.log").exists() or hpo.StudyResult.load(run_dir).trials == []

    def test_submit_returns_a_future_done_when_its_task_is_over(self, kit, tmp_path):
        spec = parse_spec(toy_space("future", "hpo.examples.toy:sleep", space={"sleep_s": [0.0]}))
        (task,) = stored_tasks(spec, tmp_path / "future")
        with kit.engine(spec) as engine:
            follow_the_store(engine, task)
            future = engine.submit(task)
            assert isinstance(future, Future)
            settle_all(engine, [future])
            assert future.done() and not future.cancelled()
        (trial,) = RunDir(tmp_path / "future").open_store().trials()
        assert trial.state.name == "COMPLETE"

    def test_a_queued_task_is_cancelled(self, kit, tmp_path):
        spec = parse_spec(toy_space("cancel", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.5},
                                    space={"x": list(range(kit.slots + 3))}))
        tasks = stored_tasks(spec, tmp_path / "cancel")
        cancelled, later = tasks[-2], tasks[-1]
        with kit.engine(spec) as engine:
            follow_the_store(engine, tasks[0])
            handles = [engine.submit(task) for task in tasks[:-1]]
            handles.pop().cancel()  # queued behind a full set of running tasks
            # Queued after it: the queue runs in order, so once this task has
            # run to its end, the cancelled one would have started before it.
            handles.append(engine.submit(later))
            settle_all(engine, handles)
        ran = {t.number: bool(run_of(t)) for t in RunDir(tmp_path / "cancel").open_store().trials()}
        assert ran == {task.number: task is not cancelled for task in tasks}

    def test_a_task_over_while_the_master_waited_on_others_is_kept_for_a_later_wait(self, kit, tmp_path):
        spec = parse_spec(toy_space("asked", "hpo.examples.toy:sleep", search={"parallel": kit.slots},
                                    space={"sleep_s": [0.0, 1.0]}))
        quick, slow = stored_tasks(spec, tmp_path / "asked")
        with kit.engine(spec) as engine:
            follow_the_store(engine, quick)
            first, second = engine.submit(quick), engine.submit(slow)
            settle_all(engine, [second])  # the quick one ends meanwhile, not asked about
            settle_all(engine, [first])  # still there to be told

    def test_a_priority_task_goes_ahead_of_queued_ones(self, kit, tmp_path):
        spec = parse_spec(toy_space("priority", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.5},
                                    space={"x": list(range(kit.slots + 3))}))
        tasks = stored_tasks(spec, tmp_path / "priority")
        busy, queued, urgent = tasks[:kit.slots], tasks[kit.slots:-1], tasks[-1]
        with kit.engine(spec) as engine:
            follow_the_store(engine, tasks[0])
            handles = [engine.submit(task) for task in busy + queued]
            handles.append(engine.submit(urgent, priority=True))
            settle_all(engine, handles)
        store = RunDir(tmp_path / "priority").open_store()
        started = {t.number: run_of(t)["attempt_started_at"] for t in store.trials()}
        # Queued in order, the urgent task would start after every queued one;
        # it starts with the first slot that frees (several may free at once).
        order = sorted([*queued, urgent], key=lambda t: started[t.number])
        assert order.index(urgent) < kit.slots <= len(queued)

    def test_a_task_lost_with_its_worker_is_resumed(self, kit, tmp_path):
        space = toy_space("lost", "hpo.examples.toy:curve", fixed={"steps": 10, "step_s": 0.3},
                          search={"parallel": 1}, space={"quality": [1.0]})
        space_file = write_space(tmp_path, space)
        kit.lose_worker(space_file, tmp_path / "runs", tmp_path / "runs" / "lost")
        (trial,) = hpo.StudyResult.load(tmp_path / "runs" / "lost").trials  # counted once
        assert trial.state is hpo.TrialStatus.COMPLETE and trial.attempt == 2
        (retried,) = [e for e in trial.events if e["kind"] == "retried"]
        assert "lost with its worker" in retried["reason"]
        assert trial.steps == 10 and trial.metrics["value"] == pytest.approx(1 - 2.718281828 ** -5)

    def test_a_trial_past_its_time_limit_times_out_and_the_study_goes_on(self, kit, tmp_path):
        space = toy_space("limit", "hpo.examples.toy:sleep", resources={"time_limit_s": 6},
                          search={"parallel": kit.slots}, space={"sleep_s": [0.1, 3600.0]})
        # A child waited for, not killed, would outlast the test's timeout.
        result = kit.run(space, tmp_path)
        by_sleep = {t.params["sleep_s"]: t for t in result.trials}
        assert by_sleep[0.1].state is hpo.TrialStatus.COMPLETE
        assert by_sleep[3600.0].state is hpo.TrialStatus.TIMEOUT
        assert "time_limit_s=6" in by_sleep[3600.0].error

    def test_a_target_stop_ends_the_study_and_stops_running_trials(self, kit, tmp_path):
        # The fastest trial reaches the target; those running beside it stop at
        # their next report, those queued behind it are cancelled or stop at once.
        space = toy_space("target", "hpo.examples.toy:curve", metric={"target": 0.9},
                          fixed={"steps": 12, "quality": 0.95, "rate": 2.0},
                          search={"parallel": kit.slots}, space={"step_s": [0.05, 0.3, 0.32, 0.34]})
        result = kit.run(space, tmp_path)
        assert result.stop["reason"] == "target" and result.stop["trial"] == 0
        first, *others = sorted(result.trials, key=lambda t: t.number)
        assert first.state is hpo.TrialStatus.COMPLETE and first.steps == 12
        assert others and all(t.state in (hpo.TrialStatus.STOPPED, hpo.TrialStatus.CANCELLED)
                              and t.steps < 12 for t in others)

    def test_a_clean_stop_suspends_running_trials_and_the_same_command_resumes(self, kit, tmp_path):
        space = toy_space("clean", "hpo.examples.toy:curve", fixed={"steps": 8, "step_s": 0.4},
                          search={"parallel": kit.slots}, space={"quality": [1.0, 0.9, 0.8]})
        space_file, runs, run_dir = write_space(tmp_path, space), tmp_path / "runs", tmp_path / "runs" / "clean"
        study = subprocess.Popen(kit.command(space_file, runs), env=CHILD_ENV,
                                 stderr=subprocess.PIPE, text=True)
        wait_for(lambda: running_pid(run_dir, steps=2), what="2 reported steps")
        study.send_signal(signal.SIGTERM)
        _, stderr = study.communicate(timeout=60)
        assert study.returncode == 143 and "run the same command again to resume" in stderr
        stopped = hpo.StudyResult.load(run_dir)
        suspended = [t for t in stopped.trials if t.state is hpo.TrialStatus.SUSPENDED]
        assert suspended and all(t.events[-1]["kind"] == "suspended" for t in suspended)
        assert not [t for t in stopped.trials if t.state is hpo.TrialStatus.RUNNING]

        again = subprocess.run(kit.command(space_file, runs), env=CHILD_ENV, timeout=180,
                               capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        result = hpo.StudyResult.load(run_dir)
        complete = sorted(t.params["quality"] for t in result.trials if t.state is hpo.TrialStatus.COMPLETE)
        assert complete == [0.8, 0.9, 1.0]  # each configuration once; queued ones were cancelled
        assert result.counts["COMPLETE"] + result.counts["CANCELLED"] == len(result.trials)
        for trial in (t for t in result.trials if t.number in {s.number for s in suspended}):
            assert trial.attempt == 1 and trial.steps == 8  # resumed as itself, every step once
            assert [e["kind"] for e in trial.events] == ["suspended", "resumed"]


# -- helpers ---------------------------------------------------------------------------


def follow_the_store(engine: Engine, task: TrialTask) -> Engine:
    """Tell ``engine`` from the store which tasks are over, as the master
    does (COMPSs, which has no wait-any, asks)."""
    store = StudyStore(open_storage(task.storage), task.study_name)
    if isinstance(engine, FollowsTasks):
        engine.follow(lambda submitted: task_over(store, submitted))
    return engine


def stored_tasks(spec: StudySpec, run_path: Path) -> list[TrialTask]:
    """One stored trial and its task per grid point of ``spec``, as the master makes them."""
    run_dir = RunDir(run_path)
    url = run_dir.create(spec.to_dict(), None)
    store = StudyStore.of(create_study(spec, open_storage(url)))
    tasks = []
    for params in spec.grid():
        trial_id, number = store.create_trial(params, spec.distributions())
        tasks.append(TrialTask.for_trial(spec, run_dir, url, number, trial_id, params))
    return tasks


def settle_all(engine: Engine, futures: list[Future], timeout: float = 120) -> None:
    """Wait on ``futures`` through the engine's clock, as the master does, and gather each."""
    deadline = time.monotonic() + timeout
    pending = list(futures)
    while pending:
        assert time.monotonic() < deadline, "tasks did not finish"
        for future in engine.clock.wait(pending, 0.5):
            gather(future)
            pending.remove(future)


def write_space(folder: Path, space: dict[str, Any]) -> Path:
    path = folder / "space.json"
    path.write_text(json.dumps(space))
    return path


def running_pid(run_dir: Path, steps: int) -> int | None:
    """The process running a trial that has reported ``steps`` steps, if any."""
    try:
        trials = RunDir(run_dir).open_store().trials()
    except (hpo.UsageError, KeyError, ValueError):
        return None  # not created yet
    for trial in trials:
        run = run_of(trial)
        if run and not trial.state.is_finished() and len(trial.intermediate_values) >= steps:
            return run["pid"]
    return None


def child_command(*args: str) -> list[str]:
    """``hpo`` run through the test driver (which can stand the COMPSs double up)."""
    return [sys.executable, str(DRIVER), *args]
