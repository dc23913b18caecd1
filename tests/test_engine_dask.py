"""The dask engine on real scheduler and worker processes started by the test."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import hpo
from hpo.engines import DaskEngine
from hpo.errors import EngineError
from hpo.store.records import RUN_ATTR
from hpo.trial import SILENT_HEARTBEATS
from conftest import ROOT, stop_processes, toy_space
from leaks import owned_by_fixture

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test


@pytest.fixture(scope="module")
def mixed_cluster(tmp_path_factory):
    """A scheduler and two workers in their own processes; only one has a GPU."""
    tmp = tmp_path_factory.mktemp("dask")
    scheduler_file = tmp / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(scheduler_file), "--dashboard-address", ":0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    _wait_for(scheduler_file.exists)
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
              str(scheduler_file), "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
              "--no-dashboard", "--local-directory", str(tmp)]
    procs.append(subprocess.Popen([*worker, "--resources", "GPU=1 CPU=1", "--name", "gpu-worker"],
                                  env={**env, "CUDA_VISIBLE_DEVICES": "0"},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen([*worker, "--resources", "CPU=1", "--name", "cpu-worker"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file)) as client:
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        names = {w["name"]: pids[a] for a, w in client.scheduler_info()["workers"].items()}
    with owned_by_fixture(lambda: [p.pid for p in procs]):  # and the warm processes of its workers
        yield str(scheduler_file), names
    stop_processes(procs)


def _wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("scheduler did not start")
        time.sleep(0.1)


def _pids(result_dir) -> dict[int, int]:
    study = hpo.store.RunDir(result_dir).load_study()
    return {t.number: t.system_attrs[RUN_ATTR]["pid"] for t in study.trials}


def test_gpu_trials_run_only_on_the_worker_with_a_gpu(mixed_cluster, tmp_path):
    scheduler_file, pids = mixed_cluster
    space = toy_space("gpu", "hpo.examples.toy:sleep", resources={"gpus": 1},
                      fixed={"sleep_s": 0.1}, space={"x": [0, 1, 2, 3]})
    result = hpo.run(space, engine="dask", scheduler=scheduler_file, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 4
    assert set(_pids(tmp_path / "gpu").values()) == {pids["gpu-worker"]}
    study = hpo.store.RunDir(tmp_path / "gpu").load_study()
    assert all(t.system_attrs[RUN_ATTR]["gpus"] == ["0"] for t in study.trials)
    assert all(r.gpu_seconds > 0 for r in result.trials)


def test_cpu_trials_use_both_workers(mixed_cluster, tmp_path):
    scheduler_file, pids = mixed_cluster
    space = toy_space("cpu", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.3},
                      space={"x": [0, 1, 2, 3, 4, 5]})
    hpo.run(space, engine="dask", scheduler=scheduler_file, runs_dir=tmp_path, progress=False)
    assert set(_pids(tmp_path / "cpu").values()) == set(pids.values())


def test_a_worker_beats_as_often_as_its_master_asks_whatever_its_own_environment(
        mixed_cluster, tmp_path, monkeypatch):
    """The master judges a trial lost after missing three of its heartbeats;
    workers started without its HPO_HEARTBEAT_S (10 s by default) must beat
    that often too, or the master takes a healthy worker out of the cluster."""
    scheduler_file, pids = mixed_cluster
    monkeypatch.setenv("HPO_HEARTBEAT_S", "1")  # the master's; the workers started without it
    space = toy_space("beat", "hpo.examples.toy:curve", fixed={"steps": 16, "step_s": 0.5},
                      space={"quality": [1.0]})
    result = hpo.run(space, engine="dask", scheduler=scheduler_file, runs_dir=tmp_path, progress=False)
    (trial,) = result.trials
    assert trial.state is hpo.TrialStatus.COMPLETE and trial.attempt == 1 and trial.events == []
    from distributed import Client

    with Client(scheduler_file=scheduler_file) as client:
        assert len(client.scheduler_info()["workers"]) == len(pids)  # none taken out


def test_unsatisfiable_resources_are_refused_before_submitting(mixed_cluster, tmp_path):
    scheduler_file, _ = mixed_cluster
    space = toy_space("greedy", resources={"gpus": 2})
    with pytest.raises(EngineError, match="GPU=2"):
        hpo.run(space, engine="dask", scheduler=scheduler_file, runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "greedy").exists()  # refused before anything was recorded


def test_retries_map_to_dask_retries(dask_address, tmp_path):
    from hpo.trial import TrialTask

    task = TrialTask(storage=str(tmp_path / "journal.log"), study_name="s", trial_id=0, number=0,
                     config={"sleep_s": 3}, objective="hpo.examples.toy:sleep", metric="value",
                     checkpoint_dir=str(tmp_path / "trials" / "0"))
    with DaskEngine(dask_address, retries=3) as engine:
        future = engine.submit(task)
        retries = None
        for _ in range(100):  # submission reaches the scheduler asynchronously
            retries = engine.client.run_on_scheduler(
                lambda dask_scheduler, key=future.key:
                    dask_scheduler.tasks[key].retries if key in dask_scheduler.tasks else None)
            if retries is not None:
                break
            time.sleep(0.05)
        future.cancel()
    assert retries == 3


def test_embedded_cluster_gives_each_worker_its_own_gpus(tmp_path, monkeypatch):
    # Device ids are only labels to Dask and to the trial: faked ones exercise the path.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    space = toy_space("gpus", "hpo.examples.toy:sleep", resources={"gpus": 1},
                      fixed={"sleep_s": 0.5}, space={"x": [0, 1, 2, 3]})
    result = hpo.run(space, engine="dask", runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 4
    study = hpo.store.RunDir(tmp_path / "gpus").load_study()
    assigned = [t.system_attrs[RUN_ATTR]["gpus"] for t in study.trials]
    assert sorted(map(tuple, assigned)) == [("3",), ("3",), ("5",), ("5",)]
    spans = sorted((t.started_at, t.ended_at) for t in result.trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # both GPUs busy at once


def test_embedded_cluster_without_enough_gpus_refuses_gpu_studies(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(EngineError, match="shows 1"):
        hpo.run(toy_space("nogpu", resources={"gpus": 2}), engine="dask", runs_dir=tmp_path,
                progress=False)


def test_workers_and_scheduler_together_are_refused(tmp_path):
    with pytest.raises(hpo.UsageError, match="--workers"):
        hpo.run(toy_space("both"), engine="dask", scheduler="tcp://127.0.0.1:1", workers=2,
                runs_dir=tmp_path, progress=False)


def test_a_master_stopped_while_it_asks_the_scheduler_takes_no_worker_out(monkeypatch):
    """The watcher asks the scheduler how long it has heard nothing from the
    workers holding unstarted tasks. A master stopped (SIGSTOP) while the
    question is out hears, once continued, of a silence its stop made: that
    answer takes no worker out; the same silence does once the master has
    been awake for two silence windows (the first lets the scheduler catch
    up)."""
    from hpo.trial import Awake, silence_s

    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.01")
    engine = DaskEngine(scheduler="tcp://127.0.0.1:1")
    engine.client = type("Client", (), {"status": "running"})()
    stopped = {"during": True}
    taken: list[str] = []

    def unheard(keys):
        if stopped["during"]:
            time.sleep(20 * 0.01)  # the master stopped meanwhile: its looks were far apart
        return {"tcp://worker": (7.0, 0.0, keys)}

    monkeypatch.setattr(engine, "_unheard_holders", unheard)
    monkeypatch.setattr(engine, "_unanswering", lambda addresses, timeout: addresses)  # stopped
    monkeypatch.setattr(engine, "_take_out", lambda address, message: taken.append(address))
    awake = Awake(looks_every_s=0.01)
    awake.note()  # the look before the question: it had never slept
    engine._take_out_hung_holders(["k"], awake)
    assert taken == []

    stopped["during"] = False
    awake.since = time.time() - 1.5 * silence_s()  # after a sleep, one window is not enough
    awake.note()
    engine._take_out_hung_holders(["k"], awake)
    assert taken == []
    awake.since = time.time() - 3 * silence_s()
    for _ in range(SILENT_HEARTBEATS):
        awake.note()
        engine._take_out_hung_holders(["k"], awake)
    assert taken == ["tcp://worker"]


def test_a_silent_worker_that_answers_when_asked_is_not_taken_out(monkeypatch):
    """Dask heard nothing from a worker holding an unstarted task for a
    silence window (its event loop held up, or the scheduler starved): it
    goes only once it has left SILENT_HEARTBEATS questions in a row
    unanswered; one answer starts the count again."""
    from hpo.trial import Awake

    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.01")
    engine = DaskEngine(scheduler="tcp://127.0.0.1:1")
    engine.client = type("Client", (), {"status": "running"})()
    answers = iter([False] * (SILENT_HEARTBEATS - 1) + [True] + [False] * SILENT_HEARTBEATS)
    taken: list[str] = []
    monkeypatch.setattr(engine, "_unheard_holders", lambda keys: {"tcp://worker": (7.0, 0.0, keys)})
    monkeypatch.setattr(engine, "_unanswering",
                        lambda addresses, timeout: [] if next(answers) else addresses)
    monkeypatch.setattr(engine, "_take_out", lambda address, message: taken.append(address))
    awake = Awake(looks_every_s=10.0)
    looks = 0
    while not taken:
        awake.note()
        engine._take_out_hung_holders(["k"], awake)
        looks += 1
    assert looks == 2 * SILENT_HEARTBEATS and taken == ["tcp://worker"]


def test_a_scheduler_lost_while_a_silent_worker_is_taken_out_is_the_engines_loss():
    """The master gives up a trial fallen silent as its scheduler dies: that
    is the cluster's loss (the master leaves cleanly, exit 75, and the same
    command resumes), never a crash of the master."""
    from distributed.comm import CommClosedError

    from hpo.errors import EngineLost

    class Lost:
        status = "running"

        def run_on_scheduler(self, function, **kwargs):
            raise CommClosedError("in <TCP (closed) ConnectionPool.run_function>: ConnectionResetError")

    class Task:
        key, cancelled = "hpo-s-1-abc", False

        def cancel(self):
            self.cancelled = True
            return True

    engine = DaskEngine(scheduler="tcp://127.0.0.1:1")
    engine.client = Lost()
    task = Task()
    with pytest.raises(EngineLost, match="lost the Dask scheduler"):
        engine.abandon(task)
    assert task.cancelled
