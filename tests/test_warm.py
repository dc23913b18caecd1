"""Warm trial processes (``hpo.trial._warm``): an isolated trial is forked
from a process that imported its objective already, and is used once.

Each objective here writes what its process saw (pid, parent, environment,
directory, a random draw) to a file of its own; the module notes the
process that imported it.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import hpo
from hpo.trial import TrialStatus
from conftest import toy_space

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

MODULE = '''
import json, os, random, signal, subprocess, sys, threading, time
from pathlib import Path

OUT = Path(__file__).parent / "seen"
OUT.mkdir(exist_ok=True)
(OUT / f"imported-{os.getpid()}").write_text("")
if os.environ.get("WARM_TEST_THREAD_AT_IMPORT"):
    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()


def probe(config, trial):
    x = config["x"]
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
            "leak": os.environ.get("WARM_TEST_LEAK"), "draw": random.random(),
            "threads": os.environ.get("OMP_NUM_THREADS"), "pgid": os.getpgid(0),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_share": os.environ.get("HPO_GPU_MEMORY_FRACTION")}
    (OUT / f"trial-{x}.json").write_text(json.dumps(seen))
    # What the trial may leave in its process: none of it may reach the next one.
    os.environ["WARM_TEST_LEAK"] = str(x)
    os.chdir("/")
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    if x == config.get("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    crashed = OUT / f"trial-{config.get('crash')}.json"
    if crashed.exists():  # is the warm process that forked the crashed trial still there?
        seen["crash_parent_alive"] = _alive(json.loads(crashed.read_text())["ppid"])
        (OUT / f"trial-{x}.json").write_text(json.dumps(seen))
    if config.get("side_by_side"):  # a trial waits until that many trials have started
        started = OUT / f"started-{x}"
        started.write_text("")
        deadline = time.monotonic() + 120
        while len(list(OUT.glob("started-*"))) < config["side_by_side"] and time.monotonic() < deadline:
            time.sleep(0.02)
    if x == config.get("hang"):
        sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)  # left behind: ended with it
        (OUT / f"sleeper-{x}").write_text(str(sleeper.pid))
        time.sleep(3600)
    return float(x)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "warm_probe.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    return folder


def _study(project: Path, tmp_path: Path, engine: str, scheduler: str | None = None, **fixed):
    space = toy_space("warm", "warm_probe:probe", search={"parallel": 1},
                      resources={"time_limit_s": fixed.pop("time_limit_s", 300)},
                      fixed=fixed, space={"x": [0, 1, 2, 3]})
    space_file = project / "space.json"
    space_file.write_text(json.dumps(space))
    return hpo.run(str(space_file), engine=engine, scheduler=scheduler, runs_dir=tmp_path / "runs",
                   progress=False)


def _seen(project: Path) -> tuple[dict[int, dict], list[int]]:
    out = project / "seen"
    trials = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("trial-*.json")}
    importers = [int(p.name.split("-")[1]) for p in out.glob("imported-*")]
    return trials, importers


# COMPSs both ways: a program run with plain python (each task runs at once,
# in the user's process) and under runcompss (the runtime's workers run them).
ENGINES = ["inline", "dask", "compss-sequential", "compss-runtime"]


@pytest.fixture
def engine(request, dask_address) -> tuple[str, str | None]:
    """An engine that runs isolated trials from warm processes, and its
    scheduler. The module's cluster is started ahead of any test: what it
    starts is not the test's to end."""
    if request.param == "dask":
        return "dask", dask_address
    if request.param.startswith("compss"):
        runtime = request.getfixturevalue("compss")
        if request.param == "compss-runtime":
            runtime.start(nodes=2, cpus_per_node=1)
        return "compss", None
    return request.param, None


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_isolated_trials_fork_from_warm_processes_that_imported_the_objective(project, tmp_path, engine):
    result = _study(project, tmp_path, *engine)
    engine_name, _ = engine
    assert [t.state for t in result.trials] == [TrialStatus.COMPLETE] * 4
    trials, importers = _seen(project)
    pids = {seen["pid"] for seen in trials.values()}
    assert len(pids) == 4  # a process per trial, each used once
    # The objective's module was imported by the warm processes, none of them a
    # trial's: a trial's process found it imported already.
    assert not pids & set(importers)
    assert {seen["ppid"] for seen in trials.values()} <= set(importers)
    # Each trial's process started as a fresh one would: its own process group,
    # the worker's directory, nothing a trial before it changed, its own random state.
    assert all(seen["pgid"] == seen["pid"] for seen in trials.values())
    cwds = {seen["cwd"] for seen in trials.values()}
    assert len(cwds) == 1 and cwds != {"/"} and (engine_name == "dask" or cwds == {str(tmp_path)})
    assert {seen["leak"] for seen in trials.values()} == {None}
    assert len({seen["draw"] for seen in trials.values()}) == 4
    assert {seen["threads"] for seen in trials.values()} == {"1"}


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_a_crashed_trial_takes_only_its_own_process_with_it(project, tmp_path, engine):
    result = _study(project, tmp_path, *engine, crash=1)
    by_x = {t.params["x"]: t for t in result.trials}
    assert by_x[1].state is TrialStatus.FAILED
    assert "exited with code -11" in by_x[1].error
    assert all(by_x[x].state is TrialStatus.COMPLETE for x in (0, 2, 3))
    trials, importers = _seen(project)
    assert {seen["ppid"] for seen in trials.values()} <= set(importers)
    assert len({seen["pid"] for seen in trials.values()}) == 4  # the crashed process served nothing more
    # The warm process that forked the crashed trial outlived it: the later
    # trials found it running (inline, one process forked them all).
    assert [trials[x]["crash_parent_alive"] for x in (2, 3)] == [True, True]
    assert engine[0] != "inline" or len(set(importers) - {os.getpid()}) == 1  # the master may check it


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_a_time_limit_ends_the_forked_trial_and_what_it_started(project, tmp_path, engine):
    result = _study(project, tmp_path, *engine, hang=2, time_limit_s=5)
    by_x = {t.params["x"]: t for t in result.trials}
    assert by_x[2].state is TrialStatus.TIMEOUT and "time_limit_s=5" in by_x[2].error
    assert all(by_x[x].state is TrialStatus.COMPLETE for x in (0, 1, 3))
    # The sleep it left in a session of its own ends with it; a warm process
    # served the trial after it.
    sleeper = int((project / "seen" / "sleeper-2").read_text())
    assert _ends(sleeper), f"the timed-out trial's sleep {sleeper} outlived it"
    trials, importers = _seen(project)
    assert trials[3]["ppid"] in importers


@pytest.mark.parametrize("engine_name", ["inline", "dask"])  # the engines that share a GPU
def test_trials_sharing_a_gpu_fork_with_their_gpu_and_memory_share(project, tmp_path, monkeypatch,
                                                                   engine_name):
    # A GPU's id, as the trials see it: nothing here touches a device.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    space = toy_space("warm", "warm_probe:probe", search={"parallel": 2},
                      resources={"gpus": "0.25 * (1 + x % 2)"}, space={"x": [0, 1, 2, 3]})
    (project / "space.json").write_text(json.dumps(space))
    result = hpo.run(str(project / "space.json"), engine=engine_name, runs_dir=tmp_path / "runs",
                     progress=False)  # dask: hpo's own cluster, one worker holding the GPU
    assert result.counts["COMPLETE"] == 4
    trials, importers = _seen(project)
    assert {seen["ppid"] for seen in trials.values()} <= set(importers)  # forked, each its own
    assert len({seen["pid"] for seen in trials.values()}) == 4
    # Set in each fork before any of the trial's code ran (CUDA reads both as
    # it initialises): a quarter or a half of GPU 0's memory, as its trial asked.
    assert {x: (seen["gpus"], seen["gpu_share"]) for x, seen in trials.items()} == {
        0: ("0", "0.25"), 1: ("0", "0.5"), 2: ("0", "0.25"), 3: ("0", "0.5")}


def _ends(pid: int, within_s: float = 60.0) -> bool:
    """Whether process ``pid`` ends (a zombie counts) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def two_slot_worker(tmp_path):
    """A Dask cluster of one worker process with two threads (two slots)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 2}) as cluster:
        yield cluster.scheduler_address


@pytest.mark.parametrize("where", ["dask", "compss-runtime"])
def test_trials_side_by_side_on_one_worker_fork_from_one_warm_process(project, tmp_path, where, request):
    if where == "dask":
        engine, scheduler = "dask", request.getfixturevalue("two_slot_worker")
    else:
        request.getfixturevalue("compss").start(nodes=1, cpus_per_node=2)
        engine, scheduler = "compss", None
    space = toy_space("warm", "warm_probe:probe", search={"parallel": 2},
                      resources={"time_limit_s": 300}, fixed={"side_by_side": 2},
                      space={"x": [0, 1, 2, 3]})
    (project / "space.json").write_text(json.dumps(space))
    result = hpo.run(str(project / "space.json"), engine=engine, scheduler=scheduler,
                     runs_dir=tmp_path / "runs", progress=False)
    # The first two trials waited for each other, so ran side by side on the
    # worker's two slots: one warm process forked all four (the second slot
    # paid no fresh start of its own).
    assert result.counts["COMPLETE"] == 4
    trials, importers = _seen(project)
    assert len({seen["pid"] for seen in trials.values()}) == 4
    assert len({seen["ppid"] for seen in trials.values()}) == 1
    assert set(importers) - {os.getpid()} == {trials[0]["ppid"]}


def test_without_warm_processes_each_trial_imports_its_objective(project, tmp_path, monkeypatch):
    monkeypatch.setenv("HPO_WARM_START", "0")
    _study(project, tmp_path, "inline")
    trials, importers = _seen(project)
    assert sorted(importers) == sorted(seen["pid"] for seen in trials.values())


def test_a_module_that_starts_a_thread_at_import_gets_fresh_processes(project, tmp_path, monkeypatch):
    # Forking a process of several threads copies one of them: not done.
    monkeypatch.setenv("WARM_TEST_THREAD_AT_IMPORT", "1")
    result = _study(project, tmp_path, "inline")
    assert result.counts["COMPLETE"] == 4
    trials, importers = _seen(project)
    pids = {seen["pid"] for seen in trials.values()}
    assert pids <= set(importers)
    # The master imports it to check it; one warm process tried, refused, not tried again.
    assert len(set(importers) - pids - {os.getpid()}) == 1
