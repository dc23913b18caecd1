"""Trials of different shapes: per-trial resources, shared and multi-GPU
trials on fake GPUs, multi-node trials, and the master's placement choices.

GPU ids are labels to Dask and to the trial (``CUDA_VISIBLE_DEVICES``): fake
ones exercise every path but the CUDA runtime itself. Nodes are Dask workers
listening on distinct loopback addresses (127.0.0.1, 127.0.0.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpo
from conftest import ROOT, stop_processes, toy_space
from hpo.allocation import Candidate, Device, Inventory, Node, Planner, RateCurve, TrialShape
from hpo.errors import SpaceError
from hpo.space import parse_spec
from hpo.store import RunDir
from hpo.store.records import RUN_ATTR, allocations_of

# -- shapes from the configuration ------------------------------------------------


def test_resources_may_be_parameters_or_expressions():
    spec = parse_spec({"resources": {"gpus": "gpus", "cpus": "2 * max(1, gpus)", "memory_gb": 4},
                       "space": {"gpus": [0.25, 1, 2], "lr": [0.1, 0.01]}})
    assert spec.shape_of({"gpus": 0.25, "lr": 0.1}) == TrialShape(cpus=2, gpus=0.25, memory_gb=4.0)
    assert spec.shape_of({"gpus": 2, "lr": 0.1}) == TrialShape(cpus=4, gpus=2, memory_gb=4.0)
    smallest, largest = spec.shape_bounds
    assert (smallest.gpus, largest.gpus, largest.cpus) == (0.25, 2, 4)
    assert parse_spec(spec.to_dict()) == spec


@pytest.mark.parametrize("resources, words", [
    ({"gpus": "g"}, ["$.resources.gpus", "1.5", "g=1.5"]),  # a share must be < 1, or whole
    ({"gpus": "gg"}, ["$.resources.gpus", "'gg' is not a parameter"]),
    ({"gpus": "g", "nodes": 2}, ["whole GPUs", "2 nodes"]),
    ({"cpus": "__import__('os')"}, ["$.resources.cpus", "not allowed"]),
    ({"nodes": 0}, ["$.resources.nodes", ">= 1"]),
])
def test_bad_shapes_are_refused_with_the_place_and_the_fix(resources, words):
    with pytest.raises(SpaceError) as info:
        parse_spec({"resources": resources, "space": {"g": [0.5, 1.5]}}, source="s.json")
    assert info.value.fix
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# -- the master's ledger and choices ----------------------------------------------


def two_nodes(speeds=(1.0, 1.0, 0.5, 0.25)) -> Inventory:
    return Inventory([Node(f"n{i}", worker=f"w{i}", cpus=16,
                           devices=[Device(str(j), s) for j, s in enumerate(speeds)]) for i in range(2)])


def test_shares_pack_onto_the_fullest_gpu_and_whole_gpus_stay_free():
    inventory = Inventory([Node("n", cpus=16, devices=[Device("0"), Device("1")])])
    quarters = [inventory.place(TrialShape(gpus=0.25)) for _ in range(4)]
    assert {p.devices for p in quarters} == {("0",)}  # four on one GPU
    assert inventory.place(TrialShape(gpus=1)).devices == ("1",)
    assert inventory.place(TrialShape(gpus=0.25)) is None  # both full now


def test_a_multi_node_trial_gets_distinct_hosts():
    inventory = Inventory([Node("a", "w1", 4, [Device("0")]), Node("a", "w2", 4, [Device("0")]),
                           Node("b", "w3", 4, [Device("0")])])
    placement = inventory.place(TrialShape(gpus=1, nodes=2))
    assert sorted(placement.hosts) == ["a", "b"]
    assert inventory.place(TrialShape(gpus=1, nodes=2)) is None  # one host left


def test_the_fastest_gpu_goes_to_the_trial_that_gains_most():
    inventory = Inventory([Node("n", cpus=8, devices=[Device("slow", 0.25), Device("fast", 1.0)])])
    planner = Planner("longest_first", speed_aware=True, inventory=inventory)
    for number, predicted in enumerate([10.0, 100.0]):  # proposed short one first
        planner.add(Candidate(number, number, {}, TrialShape(gpus=1), predicted_s=predicted))
    first = planner.starts(1)[0]
    assert (first.candidate.number, first.placement.devices) == (1, ("fast",))
    second = planner.starts(1)[0]
    assert (second.candidate.number, second.placement.devices) == (0, ("slow",))


def test_longest_first_starts_the_longest_predicted_trials():
    planner = Planner("longest_first", inventory=two_nodes((1.0,)))
    for number, predicted in enumerate([5.0, 50.0, 20.0, 40.0]):
        planner.add(Candidate(number, number, {}, TrialShape(gpus=1), predicted_s=predicted))
    assert [s.candidate.number for s in planner.starts(2)] == [1, 3]


def ideal(rate):
    return RateCurve({1: rate}, gpus_per_node=4, scaling=lambda m: m * 0.95 ** (m - 1))


def test_the_rate_allocation_builds_a_flotilla_and_packs_it_on_nodes():
    # FLEET: the fastest on one GPU sets the pace (176/s); the others get
    # the GPUs that bring them to it; the counts fill the two nodes whole.
    planner = Planner("rate", inventory=two_nodes((1.0,) * 4))
    for number, rate in enumerate([176.0, 88.0, 60.0]):
        planner.add(Candidate(number, number, {}, TrialShape(gpus=1), curve=ideal(rate)))
    starts = {s.candidate.number: s for s in planner.starts(8)}
    counts = {n: s.shape.gpus for n, s in starts.items()}
    assert counts[0] == 1 and counts[1] == 3 and counts[2] == 4  # 88*3*.95^2 >= 176 > 88*2*.95
    assert sum(counts.values()) == 8
    assert all(len(s.placement.hosts) == 1 for s in starts.values())  # nobody split over nodes
    assert starts[2].placement.devices == ("0", "1", "2", "3")  # a whole node
    assert "rate allocation" in starts[1].reason


def test_free_gpus_grow_a_running_trial_when_it_saves_time():
    planner = Planner("rate", inventory=two_nodes((1.0,) * 4))
    for number in range(8):  # alike trials: one GPU each fills the cluster
        planner.add(Candidate(number, number, {}, TrialShape(gpus=1), curve=ideal(50.0)))
    assert [s.shape.gpus for s in planner.starts(8)] == [1] * 8
    assert planner.grow({0: (ideal(50.0), 1, 100_000.0, None)}) is None  # nothing free
    for number in range(1, 8):
        planner.release(number)  # the others finished
    assert planner.grow({0: (ideal(50.0), 1, 100.0, None)}) is None  # 2 s left: not worth a restart
    assert planner.grow({0: (ideal(50.0), 1, 100_000.0, 5.0)}) == (0, 4)  # 2,000 s left: up to a node
    planner.release(0)  # it suspended, checkpointed, and comes back
    planner.add(Candidate(0, 0, {}, TrialShape(gpus=1), resume=True))
    regrown = planner.starts(8)[0]
    assert regrown.shape.gpus == 4 and "grown to 4" in regrown.reason


# -- on a real Dask cluster: two "nodes" of four fake GPUs ---------------------------


@pytest.fixture(scope="module")
def gpu_nodes(tmp_path_factory):
    """A scheduler and two workers standing for nodes (distinct loopback
    addresses), each declaring four GPUs of speeds 1, 1, 0.5, 0.25."""
    tmp = tmp_path_factory.mktemp("nodes")
    scheduler_file = tmp / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HPO_HEARTBEAT_S": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(scheduler_file), "--dashboard-address", ":0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while not scheduler_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for host in ("127.0.0.1", "127.0.0.2"):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
             "--nthreads", "8", "--host", host, "--no-dashboard", "--local-directory", str(tmp),
             "--resources", "GPU=4 CPU=16", "--name", f"node-{host}"],
            env={**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3", "HPO_GPU_SPEEDS": "1,1,0.5,0.25"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file)) as client:
        client.wait_for_workers(2, timeout=120)
    yield str(scheduler_file)
    stop_processes(procs)


def _seen(run_dir: Path) -> dict[int, dict]:
    return {int(p.parent.name): json.loads(p.read_text()) for p in run_dir.glob("trials/*/seen.json")}


def test_shared_whole_and_multi_gpu_trials_each_see_exactly_their_gpus(gpu_nodes, tmp_path):
    space = toy_space("mixed", "hpo.examples.toy:devices", resources={"gpus": "g"},
                      search={"algorithm": "grid", "parallel": 16}, fixed={"sleep_s": 1.5},
                      space={"g": [0.25, 1, 2], "x": list(range(6))})
    result = hpo.run(space, engine="dask", scheduler=gpu_nodes, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 18
    study = RunDir(tmp_path / "mixed").load_study()
    seen = _seen(tmp_path / "mixed")
    intervals = []
    for trial in study.trials:
        g, run, got = trial.params["g"], trial.system_attrs[RUN_ATTR], seen[trial.number]
        devices = got["CUDA_VISIBLE_DEVICES"].split(",")
        assert devices == run["gpus"] == got["gpus"]  # what the master chose is what it saw
        assert len(devices) == (1 if g < 1 else g)
        assert float(got["HPO_GPU_MEMORY_FRACTION"]) == (g if g < 1 else 1.0)
        assert allocations_of(trial)[0]["gpus"] == g
        intervals += [(got["hosts"][0], d, g if g < 1 else 1.0, got["started"], got["ended"])
                      for d in devices]
    for host, device, _, start, end in intervals:  # no GPU ever holds more than itself
        busy = sum(share for h, d, share, s, e in intervals if (h, d) == (host, device) and s <= start < e)
        assert busy <= 1.0 + 1e-9, (host, device, start)
    shared = [(h, d, s, e) for h, d, share, s, e in intervals if share < 1]
    assert any(a[:2] == b[:2] and b[2] < a[3] and a[2] < b[3]
               for i, a in enumerate(shared) for b in shared[i + 1:])  # quarters ran side by side


def test_a_two_node_trial_receives_two_distinct_hosts(gpu_nodes, tmp_path):
    space = toy_space("wide", "hpo.examples.toy:devices", resources={"gpus": 3, "nodes": 2},
                      search={"algorithm": "grid", "parallel": 2}, fixed={"sleep_s": 0.5},
                      space={"x": [0, 1]})
    result = hpo.run(space, engine="dask", scheduler=gpu_nodes, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 2
    for got in _seen(tmp_path / "wide").values():
        assert sorted(got["hosts"]) == ["127.0.0.1", "127.0.0.2"]
        assert len(got["CUDA_VISIBLE_DEVICES"].split(",")) == 3
    spans = sorted((g["started"], g["ended"]) for g in _seen(tmp_path / "wide").values())
    assert spans[1][0] >= spans[0][1]  # 3 of 4 GPUs on both nodes each: one after the other


def test_a_shape_no_node_offers_is_refused_before_anything_runs(gpu_nodes, tmp_path):
    space = toy_space("huge", "hpo.examples.toy:devices", resources={"gpus": 2, "nodes": 3},
                      space={"x": [0]})
    result = hpo.run(space, engine="dask", scheduler=gpu_nodes, runs_dir=tmp_path, progress=False)
    assert result.counts["FAILED"] == 1
    trial = RunDir(tmp_path / "huge").load_study().trials[0]
    assert "no node offers" in str(trial.system_attrs) and not _seen(tmp_path / "huge")


# -- under COMPSs (the test double, as strict as the runtime) -------------------------


def test_compss_declares_one_task_per_shape_and_a_multinode_task(compss, tmp_path):
    compss.start(nodes=2, cpus_per_node=4, gpus_per_node=2)
    space = toy_space("shapes", "hpo.examples.toy:devices", search={"algorithm": "grid", "parallel": 2},
                      resources={"gpus": "g", "cpus": "2 * g", "nodes": "n"}, fixed={"sleep_s": 0.1},
                      space={"g": [1, 2], "n": [1, 2]})
    result = hpo.run(space, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 4
    assert {s["function"]: (s["resources"]["cpus"], s["resources"]["gpus"], s["nodes"])
            for s in compss.submitted} == {
        "compss_trial__cpus2_gpus1_mem0mb_timeout0s": (2, 1, 1),
        "compss_trial__cpus4_gpus2_mem0mb_timeout0s": (4, 2, 1),
        "compss_trial__cpus2_gpus1_mem0mb_timeout0s_nodes2": (2, 1, 2),
        "compss_trial__cpus4_gpus2_mem0mb_timeout0s_nodes2": (4, 2, 2),
    }
    assert compss.declared["compss_trial__cpus4_gpus2_mem0mb_timeout0s_nodes2"]["constraint"] == {
        "processors": [{"processorType": "CPU", "computingUnits": 4},
                       {"processorType": "GPU", "computingUnits": 2}]}
    study = RunDir(tmp_path / "shapes").load_study()
    seen = _seen(tmp_path / "shapes")
    for trial in study.trials:  # a @multinode trial learns its nodes from COMPSS_HOSTNAMES
        assert len(seen[trial.number]["hosts"]) == trial.params["n"]
    wide = [seen[t.number]["hosts"] for t in study.trials if t.params["n"] == 2]
    assert all(sorted(h) == ["node0", "node1"] for h in wide)


def test_compss_refuses_a_share_of_a_gpu(compss, tmp_path):
    compss.start(nodes=1, cpus_per_node=4, gpus_per_node=1)
    with pytest.raises(hpo.UsageError, match="whole devices"):
        hpo.run(toy_space("quarter", resources={"gpus": 0.25}), runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "quarter").exists()


def test_the_rate_allocation_grows_a_trial_onto_gpus_that_free_up(gpu_nodes, tmp_path):
    # Eight alike trials take one GPU each (the flotilla's pace is theirs);
    # one trains ten times longer: once the others end, nobody waits and it
    # resumes from its checkpoint on more GPUs.
    trial = {"rate": 80.0, "efficiency": 0.95, "quality": 0.5, "batch_size": 8, "samples": 80}
    configs = [{**trial, "epochs": 2}] * 7 + [{**trial, "epochs": 20, "quality": 0.9}]
    space = toy_space("grow", "hpo.examples.emulated_gpu:train", resources={"gpus": 1},
                      search={"algorithm": "grid", "parallel": 8}, fixed={"configs": configs},
                      allocation={"policy": "rate", "cost_model": "hpo.examples.emulated_gpu:cost",
                                  "profile_batches": 10},
                      space={"i": list(range(8))})
    result = hpo.run(space, engine="dask", scheduler=gpu_nodes, runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8
    long = next(t for t in RunDir(tmp_path / "grow").load_study().trials if t.params["i"] == 7)
    counts = [a["gpus"] for a in allocations_of(long)]
    assert counts[0] == 1 and counts[-1] > 1, counts
    assert sorted(long.intermediate_values) == list(range(20))  # every epoch once, resumed
    assert any("grow to" in e.get("reason", "") for e in long.system_attrs.values()
               if isinstance(e, dict))
    # The dashboard's Allocation view: every trial's predicted against actual
    # time, and each GPU's busy time, the grown trial's on all its GPUs.
    from hpo.dashboards.allocation import allocation, gpu_busy
    from hpo.dashboards.data import load_snapshot
    from hpo.dashboards.views import ALLOCATION, views_of

    snap = load_snapshot(tmp_path / "grow")
    assert ALLOCATION in views_of(snap)
    points = [t for t in allocation(snap).data if t.type == "scatter" and t.name == "complete"]
    assert len(points[0].x) == 8
    last = allocations_of(long)[-1]
    assert all(gpu_busy(snap)[(last["hosts"][0], gpu)] > 0 for gpu in last["devices"])


def test_a_trial_profiles_its_first_batches_as_fleet_does():
    trial = hpo.Trial(0, {}, gpus=["0"], profile_batches=48)
    for _ in range(48):
        trial.batch(32)
    assert trial.profile is None  # 47 batch times so far: the first batch end starts the clock
    trial.batch(32)
    profile = trial.profile
    assert (profile["batches"], profile["averaged"], profile["unit"]) == (48, 20, "samples/s")
    assert profile["rate"] == pytest.approx(32 / profile["batch_s"])
    trial.batch(32)  # later batches cost nothing and change nothing
    assert trial.profile is profile


def test_the_cost_model_refuses_what_will_not_fit_and_sets_time_limits(gpu_nodes, tmp_path):
    base = {"rate": 80.0, "efficiency": 0.95, "quality": 0.5, "batch_size": 8, "samples": 80, "epochs": 4}
    configs = [{**base, "weights": 10**9}, {**base, "profile_error": -0.8}, base]
    space = toy_space("model", "hpo.examples.emulated_gpu:train", resources={"gpus": 1},
                      search={"algorithm": "grid", "parallel": 3}, fixed={"configs": configs},
                      allocation={"policy": "longest_first", "gpu_memory_gb": 1.0,
                                  "cost_model": "hpo.examples.emulated_gpu:cost", "time_limit_factor": 3},
                      space={"i": [0, 1, 2]})
    result = hpo.run(space, engine="dask", scheduler=gpu_nodes, runs_dir=tmp_path, progress=False)
    state = {t.params["i"]: t.state.value for t in result.trials}
    # 10^9 weights: 8 GB of weights and gradients on a 1 GB GPU, refused before it ran;
    # a model that thinks the trial 5 times faster than it is gives it too short a limit (3x its 0.8 s).
    assert state == {0: "FAILED", 1: "TIMEOUT", 2: "COMPLETE"}, state
    refused = next(t for t in result.trials if t.params["i"] == 0)
    assert "PredictedOutOfMemory" in refused.error and not refused.started_at


class _Model:
    """A cost model that predicts 100 samples/s on one GPU of speed 1."""

    def trial_s(self, config, gpus=1, speed=1.0):
        return 10.0 / speed

    def step_s(self, config, gpus=1, speed=1.0):
        return 0.08 / speed

    def rate(self, config, gpus=1, speed=1.0):
        return 100.0 * gpus * speed


def test_measured_rates_refine_a_gpus_speed(tmp_path):
    import optuna

    from hpo.allocation._allocator import Allocator
    from hpo.store import StudyStore
    from hpo.store.records import PROFILE_ATTR

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="speeds")
    store = StudyStore.of(study)
    spec = parse_spec({"resources": {"gpus": 1}, "space": {"x": [0]}})
    inventory = Inventory([Node("n", cpus=4, devices=[Device("0", speed=1.0)])])
    allocator = Allocator(store, Planner("longest_first", inventory=inventory), _Model(),
                          lambda *args, **kwargs: None, spec)
    trial_id, number = store.create_trial({"x": 0}, spec.distributions())
    allocator.propose(number, trial_id, {"x": 0})
    assert len(allocator.starts(1)) == 1
    assert allocations_of(store.trial(trial_id))[0]["predicted_rate"] == 100.0  # recorded on the trial
    # The GPU declared as speed 1 trained it at 25 samples/s: it is slower than said.
    store.write(trial_id, f"{PROFILE_ATTR}1", {"rate": 25.0, "unit": "samples/s", "batch_s": 0.32})
    allocator.finished(number, store.trial(trial_id))
    assert inventory.nodes[0].devices[0].speed == pytest.approx(0.625)  # halfway to 0.25
    assert inventory.free_gpus() == 1
    # A later master resumes it: its allocation is added to the first, not written over it.
    later = Allocator(store, Planner("longest_first", inventory=inventory), _Model(),
                      lambda *args, **kwargs: None, spec)
    later.resume(store.trial(trial_id), -1, "left unfinished by an earlier run")
    assert len(later.starts(1)) == 1
    assert [a["reason"] for a in allocations_of(store.trial(trial_id))][1] == \
        "left unfinished by an earlier run"


def test_speed_aware_growth_keeps_a_trial_on_gpus_of_one_speed():
    planner = Planner("rate", speed_aware=True, inventory=two_nodes())  # speeds 1, 1, 0.5, 0.25
    planner.add(Candidate(0, 0, {}, TrialShape(gpus=1), predicted_s=100.0, curve=ideal(50.0)))
    (start,) = planner.starts(8)
    assert start.shape.gpus == 2 and start.placement.speed == 1.0  # the fast pair, not 4 mixed
    assert planner.grow({0: (ideal(50.0), 2, 100_000.0, 1.0)}) is None  # no faster GPU to add
    planner.add(Candidate(1, 1, {}, TrialShape(gpus=2), resume=True))
    (other,) = planner.starts(8)
    assert other.placement.hosts != start.placement.hosts and other.placement.speed == 1.0
    planner.add(Candidate(2, 2, {}, TrialShape(gpus=4), resume=True))
    assert planner.starts(8) == []  # four GPUs: no node has them free
    planner.release(0)
    (mixed,) = planner.starts(8)
    assert mixed.placement.devices == ("0", "1", "2", "3")  # no node has 4 of one speed: mixed


def test_the_keras_callback_profiles_the_training_rate():
    import keras
    import numpy as np

    from hpo.keras import HpoCallback

    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    trial = hpo.Trial(0, {}, gpus=["0"], profile_batches=10)
    model.fit(np.zeros((256, 4)), np.zeros(256), batch_size=8, epochs=1, verbose=0,
              callbacks=[HpoCallback(trial, batch_size=8)])
    assert (trial.profile["batches"], trial.profile["unit"]) == (10, "samples/s")
    assert trial.profile["rate"] == pytest.approx(8 / trial.profile["batch_s"])
