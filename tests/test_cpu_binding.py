"""A trial with ``cpus: N`` runs on N threads and, where its worker has more
cores, on N cores no other trial holds, as COMPSs binds its tasks."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

import hpo
from hpo.store import RunDir
from hpo.store.records import run_of
from hpo.trial._cpus import pin_cpus

needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


@needs_two_cores
def test_concurrent_trials_get_cores_of_their_own_and_give_them_back(tmp_path, monkeypatch):
    # Cores are claimed machine-wide: a claims folder of its own keeps other
    # hpo processes on this machine out of the count.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = os.sched_getaffinity(0)
    holding, release, seen = threading.Barrier(2), threading.Event(), []

    def trial():
        with pin_cpus(1) as cores:
            seen.append((cores, os.sched_getaffinity(0), os.environ["OMP_NUM_THREADS"]))
            holding.wait(10)
            release.wait(10)
        seen.append(os.sched_getaffinity(0))

    threads = [threading.Thread(target=trial) for _ in range(2)]
    for thread in threads:
        thread.start()
    holding_cores = _when(lambda: len(seen) == 2, lambda: [s[0] for s in seen])
    release.set()
    for thread in threads:
        thread.join(10)
    (a, pinned_a, omp), (b, pinned_b, _) = seen[:2]
    assert len(a) == len(b) == 1 and a != b  # one core each, not the same one
    assert pinned_a == set(a) and pinned_b == set(b) and omp == "1"
    assert holding_cores == [a, b]
    assert seen[2:] == [before, before]  # the threads run unpinned again


def test_a_trial_as_large_as_its_process_is_not_pinned():
    with pin_cpus(len(os.sched_getaffinity(0))) as cores:
        assert cores is None


def test_under_compss_the_runtime_binding_is_kept(monkeypatch):
    monkeypatch.setenv("COMPSS_BINDED_CPUS", "3,4")
    before = os.sched_getaffinity(0)
    with pin_cpus(2) as cores:
        assert cores == (3, 4) and os.sched_getaffinity(0) == before


@needs_two_cores
def test_a_one_cpu_dask_trial_trains_tensorflow_on_one_thread_and_one_core(tmp_path):
    pytest.importorskip("keras")
    from distributed import LocalCluster

    # One worker process with both cores (2 threads): two 1-CPU trials share it.
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 2},
                      env={"TMPDIR": str(tmp_path)}) as cluster:  # its own claims folder
        space = {"name": "bound", "objective": "hpo.examples.keras_digits:train",
                 "metric": {"name": "val_accuracy"}, "search": {"algorithm": "grid", "parallel": 2},
                 "resources": {"cpus": 1}, "fixed": {"num_epochs": 2},
                 "space": {"units": [16, 32]}}
        result = hpo.run(space, engine="dask", scheduler=cluster.scheduler_address,
                         runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 2
    runs = [run_of(t) for t in RunDir(tmp_path / "bound").load_study().trials]
    assert [(r["threads"], r["tensorflow_threads"]) for r in runs] == [(1, 1), (1, 1)]
    cores = [r["binded_cpus"] for r in runs]
    assert all(c is not None and len(c.split(",")) == 1 for c in cores)
    overlapped = runs[0]["started_at"] < runs[1]["ended_at"] and runs[1]["started_at"] < runs[0]["ended_at"]
    assert not overlapped or cores[0] != cores[1]


def _when(condition, value, timeout: float = 10):
    from conftest import wait_for

    wait_for(condition, timeout, "both trials bound")
    return value()
