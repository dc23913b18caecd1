"""Chaos: workers and the master killed mid-study on a real Dask cluster; nothing lost.

The scenario is bench/chaos.py's, with a fixed seed: a ``dask scheduler`` and
3 ``dask worker --no-nanny`` processes started here, 30 trials per study
(grid, then seeded random search over continuous ranges), a worker running a
trial killed with SIGKILL while the master runs, the master hung (SIGSTOP)
while a second one takes the study over, then the master killed with
SIGKILL together with a worker still running one of its trials; each killed
process is started again, the master until it exits 0. The store must then
hold every configuration COMPLETE exactly once, with the values of an
undisturbed run of the same space and seed on the same cluster. About 40 s
per algorithm on 2 cores.
"""

from __future__ import annotations

import sys

import optuna
import psutil
import pytest

import hpo
from hpo.trial import TrialStatus
from conftest import ROOT
from leaks import owned_by_fixture

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

sys.path.insert(0, str(ROOT / "bench"))
import chaos  # noqa: E402

SEED = 3  # the master dies after 21 completed trials: over the 20 tries random search allows


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The bench's cluster; afterwards no process it or the studies started may be left."""
    workdir = tmp_path_factory.mktemp("chaos")
    started = chaos.Cluster(workdir, chaos.chaos_env()).start()
    masters: list[int] = []
    try:
        with owned_by_fixture(started.pids):  # its restarted workers and scheduler too
            yield started, masters
    finally:
        started.stop()
        ours = set(started.pids()) | set(masters)
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid in ours or str(workdir) in " ".join(_cmdline(p))]
        for proc in left:
            proc.kill()  # by PID, only what this module started
        assert not left, f"processes left running: {[(p.pid, _cmdline(p)) for p in left]}"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("algorithm", ["grid", "random"])
def test_killed_workers_and_master_lose_nothing(cluster, tmp_path, algorithm):
    dask_cluster, masters = cluster
    (outcome,) = chaos.run_all(tmp_path, [algorithm], trials=30, seed=SEED, kills=2,
                               status=chaos.Status(False), cluster=dask_cluster)
    masters.extend(outcome.master_pids)
    assert [up for _, up in outcome.worker_kills] == [True, False]
    # Two masters started at once: one refused. A master hung while another
    # took over: once let go on, it left without writing (75). The scheduler
    # killed: the master left cleanly (75) and the same command, on a new
    # cluster, resumed.
    assert outcome.twin_exit == 2 and outcome.hung_exit == 75 and outcome.scheduler_exit == 75
    assert outcome.master_runs == 5

    # Every configuration of the budget complete exactly once, nothing left
    # running, pending, failed or suspended, the undisturbed run's values.
    assert outcome.lost == 0 and not outcome.missing and not outcome.duplicated
    assert outcome.completed == 30 and not outcome.unfinished and not outcome.other_states
    assert outcome.equal
    result = hpo.StudyResult.load(outcome.run_dir)
    complete = [t for t in result.trials if t.state is TrialStatus.COMPLETE]
    assert len({chaos._key(t.params) for t in complete}) == 30
    assert {t.state for t in result.trials} <= {TrialStatus.COMPLETE, TrialStatus.CANCELLED}

    # The worker killed under a running master: its trial ran again
    # elsewhere as a new attempt of the same trial (Dask ran the task again,
    # or, every other worker busy, the master saw its heartbeat stop first).
    (up_pid, _), (down_pid, _) = outcome.worker_kills
    retried = _lost_on(complete, up_pid)
    assert retried and all(t.attempt >= 2 for t, _ in retried)
    # The worker that died with the master: its trial fell silent and the
    # restarted master resumed it as itself, from its checkpoint.
    resumed = _lost_on(complete, down_pid)
    assert resumed and all(t.attempt >= 2 and before == "resumed" for t, before in resumed)
    study = hpo.store.RunDir(outcome.run_dir).load_study()
    for trial, _ in retried + resumed:  # every step of the curve reported
        assert sorted(study.trials[trial.number].intermediate_values) == list(range(chaos.STEPS))
    assert outcome.retried >= 2 and outcome.resumed >= 1


def _lost_on(trials: list[hpo.TrialRecord], pid: int) -> list[tuple[hpo.TrialRecord, str | None]]:
    """Trials whose retried event names the killed worker's PID, with the kind
    of the event just before it (the master's "resumed", or none)."""
    found = []
    for t in trials:
        kinds = [e["kind"] for e in t.events]
        for i, e in enumerate(t.events):
            if e["kind"] == "retried" and f"(pid {pid})" in e["reason"]:
                found.append((t, kinds[i - 1] if i else None))
    return found


@pytest.mark.parametrize("handed_out", [5, 20, 25, 29])
def test_resumed_random_search_proposes_what_an_uninterrupted_one_would(handed_out):
    # A restarted master makes a fresh seeded sampler, which draws the earlier
    # run's configurations again first; past 20 of them it used to give up and
    # hand out a duplicate.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for params in (None, {"quality": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2], "rate": [0.2, 0.4, 0.6, 0.8, 1.0]}):
        data = chaos.space("random", 30, SEED)
        if params:
            data["space"] = params  # finite: random draws collide
        spec = hpo.space.parse_spec(data)
        whole = _asks(spec, [30])
        interrupted = _asks(spec, [handed_out, 30 - handed_out])
        assert len(set(interrupted)) == 30 and set(interrupted) == set(whole)


def _asks(spec, runs: list[int]) -> list[str]:
    """Configurations proposed by consecutive runs (a new searcher each) on one store."""
    from hpo.search import create_study, open_search

    storage = optuna.storages.InMemoryStorage()
    proposed = []
    for n in runs:
        searcher = open_search(spec, create_study(spec, storage))
        proposed += [chaos._key(searcher.ask().params) for _ in range(n)]
    return proposed

