"""The compss engine against the PyCOMPSs test double, which is as strict as
the runtime (see tests/compss_double/README.md for the rules and their sources)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading

import psutil
import pytest

import hpo
import hpo.trial._run
from conftest import COMPSS_DOUBLE, ROOT, toy_space, trial_processes, wait_for
from engine_conformance import stored_tasks
from hpo.engines import CompssEngine, default_engine_name, gather
from hpo.space import parse_spec
from hpo.store import RunDir
from hpo.store.records import RUN_ATTR, TrialStatus, run_of, status_of

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

CPU_TASK = "compss_trial__cpus2_gpus0_mem0mb_timeout0s"


@pytest.fixture(autouse=True)
def quick_heartbeat(monkeypatch):
    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.5")  # a silent (lost) task is noticed in 1.5 s


def trial_children() -> list[psutil.Process]:
    return trial_processes(os.getpid())


# -- what the runtime is told ---------------------------------------------------------


def test_gpu_trials_reach_the_runtime_with_the_study_values(compss, tmp_path):
    # The runtime read its environment before the study started: only literal
    # values reach it, and CPUs must not be counted twice.
    compss.start(nodes=1, cpus_per_node=4, gpus_per_node=1)
    space = toy_space("gpu", "hpo.examples.toy:sleep", search={"parallel": 1},
                      resources={"cpus": 4, "gpus": 1, "memory_gb": 3, "time_limit_s": 100},
                      space={"x": [1, 2]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 2
    assert {s["function"] for s in compss.submitted} == {"compss_trial__cpus4_gpus1_mem3072mb_timeout160s"}
    assert [s["resources"] for s in compss.submitted] == [{"cpus": 4, "gpus": 1, "memory_gb": 3}] * 2
    declared = compss.declared["compss_trial__cpus4_gpus1_mem3072mb_timeout160s"]
    assert declared["constraint"] == {
        "processors": [{"processorType": "CPU", "computingUnits": 4},
                       {"processorType": "GPU", "computingUnits": 1}],
        "memory_size": "3",
    }
    assert declared["task"] == {"returns": 1, "on_failure": "IGNORE", "time_out": 160, "priority": False}


@pytest.mark.parametrize("memory_gb, reserved", [(1.5, 2), (0.5, 1)])
def test_fractional_memory_is_rounded_up_to_what_the_binding_keeps(compss, capsys, tmp_path,
                                                                   memory_gb, reserved):
    """The binding would cut "1.5" to 1 GB and "0.5" to none: hpo asks for
    whole GB, rounded up, and says so."""
    compss.start(nodes=1, cpus_per_node=2)
    space = toy_space("mem", search={"parallel": 1}, resources={"memory_gb": memory_gb},
                      space={"x": [1, 2], "y": [0]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 2
    assert [s["resources"]["memory_gb"] for s in compss.submitted] == [reserved] * 2
    warned = capsys.readouterr().err
    assert warned.count(f'"memory_gb": {memory_gb:g}: COMPSs reserves whole GB') == 1, warned
    assert f"hpo asks for {reserved} GB per trial" in warned


def test_cpu_trials_declare_computing_units_only(compss):
    compss.start()
    CompssEngine(cpus=2).start()
    assert compss.declared[CPU_TASK]["constraint"] == {"computing_units": 2}
    assert compss.declared[CPU_TASK + "_first"]["task"]["priority"] is True


def test_a_worker_finds_each_task_by_name_without_the_master_settings():
    # A COMPSs worker imports the task module in a fresh process and looks the
    # name up: the shape in the name declares the same task there.
    name = "compss_trial__cpus3_gpus1_mem1024mb_timeout70s_first"
    code = ("import json, hpo.engines._compss_tasks as tasks\n"
            f"getattr(tasks, {name!r})\n"
            "from pycompss import runtime\n"
            f"print(json.dumps(runtime.declared[{name!r}]))\n"
            "print(hasattr(tasks, 'compss_trial__cpus3'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{COMPSS_DOUBLE}:{ROOT}", "PATH": "/usr/bin:/bin"})
    declared, unknown = out.stdout.splitlines()
    declared = json.loads(declared)
    assert declared["constraint"] == {"processors": [
        {"processorType": "CPU", "computingUnits": 3}, {"processorType": "GPU", "computingUnits": 1}],
        "memory_size": "1"}
    assert declared["task"] == {"returns": 1, "on_failure": "IGNORE", "time_out": 70, "priority": True}
    assert unknown == "False"  # a name that carries no shape is not a task


@pytest.mark.parametrize("cpus, gpus, visible, slots", [
    (4, 0, "", 4 * 12),          # 48 cores per node, 4 CPUs a trial: 12 a node
    (4, 1, "0,1,2,3", 4 * 4),    # 4 GPUs per node bound it first
    (64, 0, "", 4),              # never less than one a node
])
def test_default_slots_come_from_the_nodes_cores(compss, monkeypatch, cpus, gpus, visible, slots):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "48")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    compss.start(nodes=4, cpus_per_node=48, gpus_per_node=4)
    engine = CompssEngine(cpus=cpus, gpus=gpus)
    engine.start()
    assert engine.slots == slots


@pytest.mark.parametrize("resources, nodes, slots", [
    ({"cpus": 48, "nodes": 3}, 6, 2),        # 3-node trials on 6 nodes: two at once
    ({"cpus": 4, "nodes": 3}, 6, 24),        # 12 places a node, each trial on 3 of them
    ({"cpus": 1, "memory_gb": 10}, 1, 20),   # 200 GB a node: 20 trials, not 48
    ({"cpus": 1, "memory_gb": 7.5}, 2, 2 * 25),  # reserved as 8 GB (whole GB, rounded up)
    ({"cpus": 8, "memory_gb": 10}, 1, 6),    # the CPUs bind first
])
def test_default_slots_count_memory_and_nodes_per_trial(compss, monkeypatch, resources, nodes, slots):
    """The slots are the trials that fit at once by CPUs, GPUs, memory and
    nodes per trial, on nodes of 48 cores and 200 GB (SLURM's figures)."""
    from hpo.space import parse_spec

    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "48")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", str(200 * 1024))  # MB, as SLURM gives it
    compss.start(nodes=nodes, cpus_per_node=48)
    space = toy_space("fit", resources=resources)
    del space["search"]["parallel"]
    engine = CompssEngine.from_spec(parse_spec(space))
    engine.start()
    assert engine.slots == slots


@pytest.mark.parametrize("parallel, slots", [(2, 8), (20, 20)])
def test_slots_are_what_fits_or_a_larger_parallel(compss, monkeypatch, parallel, slots):
    """Fewer slots than fit would let queued tasks start beside the running
    ones; a larger figure is trusted (the worker nodes may be larger)."""
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "4")
    compss.start(nodes=2, cpus_per_node=4)  # 8 one-CPU trials fit
    engine = CompssEngine(cpus=1, slots=parallel)
    engine.start()
    assert engine.slots == slots


def test_a_study_without_parallel_fills_every_core(compss, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    compss.start(nodes=2, cpus_per_node=2)  # 2 nodes of 2 cores: 4 one-CPU trials at once
    space = toy_space("fill", "hpo.examples.toy:sleep", fixed={"sleep_s": 1.0}, space={"x": [0, 1, 2, 3]})
    del space["search"]["parallel"]
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 4
    latest_start = max(t.started_at for t in result.trials)
    assert all(t.ended_at > latest_start for t in result.trials)  # all four ran together


def test_parallel_below_what_the_nodes_hold_is_what_runs_at_once(compss, tmp_path):
    """COMPSs starts a task as soon as a node has room: trials queued ahead of
    the slots would run beside the others, more than ``parallel`` at once."""
    compss.start(nodes=2, cpus_per_node=2)  # room for 4 one-CPU trials
    space = toy_space("one", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.2},
                      search={"parallel": 1}, space={"x": [0, 1, 2, 3]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 4
    spans = sorted((t.started_at, t.ended_at) for t in result.trials)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))  # one after another


# -- failures never end the study -----------------------------------------------------


def test_a_task_whose_wrapper_fails_is_resumed_and_never_ends_the_study(compss, monkeypatch, tmp_path):
    compss.start(nodes=1, cpus_per_node=1)
    real = hpo.trial._run.run_here

    def store_unreachable_for_x0(task, token, context):
        if task.config["x"] == 0:
            raise OSError("the store is unreachable from this worker")
        return real(task, token, context)

    monkeypatch.setattr(hpo.trial._run, "run_here", store_unreachable_for_x0)
    space = toy_space("broken", search={"parallel": 1}, space={"x": [0, 1], "y": [-1]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert compss.ended is None  # the runtime never ended the application
    lost, fine = sorted(result.trials, key=lambda t: t.params["x"])
    assert fine.state is TrialStatus.COMPLETE
    assert lost.state is TrialStatus.FAILED and lost.attempt == 3
    assert lost.error.startswith("Lost: its task ended without a result 3 times")
    assert [e["kind"] for e in lost.events].count("interrupted") == 3


def test_the_runtime_time_out_is_a_timeout_and_ends_the_child(compss, monkeypatch, tmp_path):
    compss.start(nodes=1, cpus_per_node=1)
    # COMPSs' time_out is the trial's limit plus a grace; shrink it below the
    # trial's own limit, so that the runtime's TimeOutError comes first.
    monkeypatch.setattr(importlib.import_module("hpo.engines._compss_tasks"), "_TIME_OUT_GRACE_S", -8)
    space = toy_space("slow", "hpo.examples.toy:sleep", search={"parallel": 1},
                      resources={"time_limit_s": 10}, space={"sleep_s": [60, 0.1]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    slow, quick = sorted(result.trials, key=lambda t: -t.params["sleep_s"])
    assert slow.state is TrialStatus.TIMEOUT
    # Ended by COMPSs' time_out (2 s), not by the trial's own limit (10 s), which says otherwise.
    assert slow.error == "TimeOutError: the engine ended the task at its time_out (time_limit_s=10)"
    assert quick.state is TrialStatus.COMPLETE
    assert trial_children() == []  # the trial's process went with its task
    assert compss.ended is None


def test_a_cancelled_running_task_is_resumed_not_failed(compss, tmp_path):
    compss.start(nodes=1, cpus_per_node=1)
    space = toy_space("cancel", search={"parallel": 1}, fixed={"steps": 30, "step_s": 0.1},
                      space={"x": [2], "y": [-1]})
    done = {}
    study = threading.Thread(target=lambda: done.update(
        result=hpo.run(space, runs_dir=tmp_path, progress=False)))
    study.start()
    run_dir = RunDir(tmp_path / "cancel")
    wait_for(lambda: run_dir.study_file.exists() and any(
        status_of(t) is TrialStatus.RUNNING for t in run_dir.load_study().trials), what="a running trial")
    # As the runtime does at its wall-clock limit: CancelError inside the task.
    from pycompss.api.api import compss_cancel_group
    compss_cancel_group(next(iter(compss.groups)))
    study.join(timeout=60)
    (trial,) = done["result"].trials
    assert trial.state is TrialStatus.COMPLETE and trial.attempt == 2
    interrupted = [e for e in trial.events if e["kind"] == "interrupted"]
    assert len(interrupted) == 1 and "cancelled (CancelError)" in interrupted[0]["reason"]
    stored = run_dir.load_study().trials[0]
    assert run_of(stored)["previous"][0]["error"]["type"] == "Lost"
    assert compss.ended is None


# -- modes ------------------------------------------------------------------------------


def test_sequential_mode_runs_the_study_with_values_unchanged(compss, tmp_path):
    # pycompss importable, program run with plain python: tasks run at once.
    from pycompss.api.api import compss_wait_on

    assert default_engine_name() == "dask"
    result = hpo.run(toy_space("seq"), engine="compss", runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8 and result.best.params == {"x": 2, "y": -1}
    marker = object()
    assert compss_wait_on(marker) is marker
    assert compss.submitted == []  # nothing went through the (absent) runtime


def test_under_the_runtime_trials_run_asynchronously(compss, tmp_path):
    compss.start(nodes=2, cpus_per_node=2)
    assert default_engine_name() == "compss"
    space = toy_space("async", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.3},
                      resources={"cpus": 2}, space={"x": [0, 1, 2, 3, 4, 5]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)  # engine auto -> compss
    assert result.counts["COMPLETE"] == 6
    assert compss.waited_unfinished == 0  # completion came from the store
    assert all(s["resources"]["cpus"] == 2 for s in compss.submitted)
    spans = sorted((t.started_at, t.ended_at) for t in result.trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # two trials overlapped


def test_target_stop_cancels_the_queued_groups(compss, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")  # the master knows its node as the runtime's: one slot
    compss.start(nodes=1, cpus_per_node=1)
    run_dir = RunDir(tmp_path / "target")
    real = hpo.trial._run.run_here

    def stopped_with_nothing_pending() -> bool:
        store = run_dir.open_store()
        return bool(store.stop()) and not any(
            status_of(t) is TrialStatus.PENDING for t in store.trials())

    def hold_the_cpu() -> None:
        # Until the master has acted on the target (no trial left PENDING).
        try:
            wait_for(stopped_with_nothing_pending, timeout=60, what="the queued trial cancelled")
        except AssertionError:
            pass  # the assertions below say what went wrong

    def target_then_hold(task, token, context):
        outcome = real(task, token, context)
        if task.config["x"] == 9:
            # Before this task frees the node's one CPU, a priority task takes
            # it: trial 1 is still queued, never started, when the target stops
            # the study (else it could start before the master read trial 0).
            compss.scheduler().submit("hold", hold_the_cpu, (), {"priority": True},
                                      {"cpus": 1, "gpus": 0})
        return outcome

    monkeypatch.setattr(hpo.trial._run, "run_here", target_then_hold)
    space = toy_space("target", "hpo.examples.toy:sleep", fixed={"sleep_s": 0.5},
                      metric={"target": 9}, search={"parallel": 1},
                      space={"x": [9, 1, 2, 3, 4, 5, 6, 7]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.stop["reason"] == "target" and result.stop["trial"] == 0
    assert result.counts["COMPLETE"] == 1 and result.counts["CANCELLED"] >= 1
    assert result.counts["CANCELLED"] == len(result.trials) - 1 < 7
    # The queued trials' groups were cancelled: none of them ever started.
    study = run_dir.load_study()
    later = [t for t in study.trials if t.number > 0]
    assert later and all(status_of(t) is TrialStatus.CANCELLED for t in later)
    assert all(RUN_ATTR not in t.system_attrs for t in later)
    assert RUN_ATTR in study.trials[0].system_attrs


def test_compss_engine_without_pycompss_is_a_clear_error(tmp_path):
    with pytest.raises(hpo.UsageError, match="runcompss"):
        hpo.run(toy_space("nocompss"), engine="compss", runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "nocompss").exists()  # rejected before anything was created


def test_a_store_the_engine_cannot_read_ends_its_task_with_the_stores_error(compss, tmp_path):
    """COMPSs has no wait-any: the engine asks the master's replica whether a
    task is over. When that read fails, the task's future carries the error,
    which the master gathers as the store's failure (it leaves; the trial
    stays resumable), never as the trial's."""
    compss.start(nodes=1, cpus_per_node=1)
    spec = parse_spec(toy_space("unread", "hpo.examples.toy:sleep", space={"sleep_s": [0.0]}))
    (task,) = stored_tasks(spec, tmp_path / "unread")

    def unreadable(_task):
        raise hpo.StoreUnavailable("the journal cannot be read")

    with CompssEngine.from_spec(spec) as engine:
        engine.follow(unreadable)
        future = engine.submit(task)
        assert engine.clock.wait([future], 60) == {future}
        with pytest.raises(hpo.StoreUnavailable, match="cannot be read"):
            gather(future)
