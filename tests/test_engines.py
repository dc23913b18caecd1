"""Every engine through the conformance suite (tests/engine_conformance.py):
inline, Dask with several worker processes, and COMPSs' test double."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpo.engines import CompssEngine, DaskEngine, InlineEngine, SimulatedEngine
from conftest import wait_for
from engine_conformance import CHILD_ENV, EngineConformance, EngineKit, child_command, running_pid

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test


class InlineKit(EngineKit):
    slots = 1

    def engine(self, spec):
        return InlineEngine.from_spec(spec)

    def command(self, space_file: Path, runs_dir: Path) -> list[str]:
        return child_command("run", str(space_file), "--engine", "inline", "--quiet",
                             "--runs-dir", str(runs_dir))


class DaskKit(EngineKit):
    """The session's cluster: 2 worker processes, 1 thread and CPU=1 each."""

    slots = 2

    def __init__(self, address: str) -> None:
        self.address = address

    def engine(self, spec):
        return DaskEngine.from_spec(spec, scheduler=self.address)

    def command(self, space_file: Path, runs_dir: Path, address: str | None = None) -> list[str]:
        return child_command("run", str(space_file), "--engine", "dask", "--quiet",
                             "--scheduler", address or self.address, "--runs-dir", str(runs_dir))

    def own_command(self, space_file: Path, runs_dir: Path) -> list[str]:
        """The embedded cluster: 2 worker processes the study starts itself."""
        return child_command("run", str(space_file), "--engine", "dask", "--quiet", "--workers", "2",
                             "--runs-dir", str(runs_dir))

    def lose_worker(self, space_file: Path, runs_dir: Path, run_dir: Path) -> None:
        """A worker process dies under the trial; Dask runs its task on another."""
        from distributed import LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=":0", resources={"CPU": 1}) as cluster:
            study = subprocess.Popen(self.command(space_file, runs_dir, cluster.scheduler_address),
                                     env=CHILD_ENV)
            os.kill(wait_for(lambda: running_pid(run_dir, steps=3), what="3 reported steps"),
                    signal.SIGKILL)
            assert study.wait(timeout=120) == 0


class CompssKit(EngineKit):
    """The PyCOMPSs double in master mode: 2 nodes of 1 CPU, 2 trial slots."""

    slots = 2

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        runtime.start(nodes=self.slots, cpus_per_node=1)

    def engine(self, spec):
        return CompssEngine.from_spec(spec)

    def command(self, space_file: Path, runs_dir: Path) -> list[str]:
        return child_command("--compss-double", str(self.slots), "run", str(space_file),
                             "--engine", "compss", "--quiet", "--runs-dir", str(runs_dir))


class SimulatedKit(EngineKit):
    """Simulated time, 2 slots, in the master's process."""

    slots = 2

    def engine(self, spec):
        return SimulatedEngine.from_spec(spec, workers=self.slots)

    def command(self, space_file: Path, runs_dir: Path) -> list[str]:
        return child_command("run", str(space_file), "--engine", "simulated", "--workers", str(self.slots),
                             "--quiet", "--runs-dir", str(runs_dir))


class TestInline(EngineConformance):
    @pytest.fixture
    def kit(self):
        return InlineKit()


class TestDask(EngineConformance):
    @pytest.fixture
    def kit(self, dask_address):
        return DaskKit(dask_address)


class TestCompss(EngineConformance):
    @pytest.fixture
    def kit(self, compss, monkeypatch):
        monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")  # the nodes' cores, as in an allocation
        return CompssKit(compss)

    # The runtime keeps such a task Blocked for ever (as the double does) and
    # tells the application nothing of its workers' resources: the study waits.
    @pytest.mark.timeout(10)
    @pytest.mark.xfail(strict=True, reason="COMPSs gives the application no view of its "
                       "workers' resources to refuse a trial against")
    def test_resources_no_worker_offers_are_refused_before_anything_starts(self, kit, tmp_path):
        super().test_resources_no_worker_offers_are_refused_before_anything_starts(kit, tmp_path)


_NO_TIME_TO_CATCH = "a simulated study runs in no time: nothing is left running to interrupt"


class TestSimulated(EngineConformance):
    @pytest.fixture
    def kit(self):
        return SimulatedKit()

    @pytest.mark.skip(reason=_NO_TIME_TO_CATCH)
    def test_a_task_lost_with_its_worker_is_resumed(self, kit, tmp_path):
        pass

    @pytest.mark.skip(reason=_NO_TIME_TO_CATCH)
    def test_a_clean_stop_suspends_running_trials_and_the_same_command_resumes(self, kit, tmp_path):
        pass

    @pytest.mark.skip(reason="simulated slots offer what a trial asks: a GPU study is simulated "
                      "on a machine without GPUs")
    def test_resources_no_worker_offers_are_refused_before_anything_starts(self, kit, tmp_path):
        pass

    @pytest.mark.skip(reason="toy:sleep sleeps for real; the simulated time limit is "
                      "tests/test_simulated.py's")
    def test_a_trial_past_its_time_limit_times_out_and_the_study_goes_on(self, kit, tmp_path):
        pass
