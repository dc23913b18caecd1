"""Searchers: grid order and resume, seeded random, no duplicates in parallel asks."""

from __future__ import annotations

import importlib.util

import optuna
import pytest

from hpo.search import create_study, open_search
from hpo.space import parse_spec
from hpo.store import StudyStore

FINITE = {"optimizer": ["adam", "sgd", "rmsprop"], "units": [32, 64], "lr": [0.01, 0.1]}  # 12 points


def searcher(algorithm: str, space=None, storage=None, **search):
    spec = parse_spec({"name": "s", "metric": {"name": "value"},
                       "search": {"algorithm": algorithm, **search}, "space": space or FINITE})
    return open_search(spec, create_study(spec, storage or optuna.storages.InMemoryStorage()))


def ran(search, proposal, value: float) -> None:
    """The proposal's trial started (RUNNING, as its attempt's start makes it) and completed."""
    StudyStore.of(search.study).storage.set_trial_state_values(proposal.trial_id, optuna.trial.TrialState.RUNNING)
    search.study.tell(proposal.number, value)


def asked(search, n: int) -> list[dict]:
    proposals = [search.ask() for _ in range(n)]
    return [p.params if p else None for p in proposals]


def test_grid_goes_through_every_point_in_order_then_ends():
    search = searcher("grid")
    grid = parse_spec({"space": FINITE}).grid()
    assert asked(search, 13) == [grid[i] for i in range(12)] + [None]


def test_grid_resumes_after_the_points_already_stored():
    storage = optuna.storages.InMemoryStorage()
    first = asked(searcher("grid", storage=storage), 5)
    rest = asked(searcher("grid", storage=storage), 8)
    assert rest[-1] is None and len({str(p) for p in first + rest[:-1]}) == 12


def test_random_search_is_reproducible_by_seed():
    space = {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
             "units": {"type": "int", "low": 16, "high": 256}}
    one = asked(searcher("random", space, seed=7, max_trials=10), 10)
    two = asked(searcher("random", space, seed=7, max_trials=10), 10)
    other = asked(searcher("random", space, seed=8, max_trials=10), 10)
    assert one == two and one != other
    assert all(1e-4 <= p["lr"] <= 0.1 and 16 <= p["units"] <= 256 for p in one)


@pytest.mark.parametrize("algorithm", ["random", "bayesian"])
def test_parallel_asks_never_hand_out_duplicates(algorithm):
    # Nothing finishes between asks, as with 12 trials in flight at once.
    params = asked(searcher(algorithm, seed=1), 13)
    assert params[-1] is None
    assert len({tuple(sorted(p.items())) for p in params[:-1]}) == 12


def test_bayesian_learning_from_results_stays_duplicate_free():
    search = searcher("bayesian", seed=3)
    seen = []
    for _ in range(12):
        proposal = search.ask()
        seen.append(tuple(sorted(proposal.params.items())))
        score = {"adam": 1.0, "sgd": 0.2, "rmsprop": 0.8}[proposal.params["optimizer"]]
        ran(search, proposal, score + proposal.params["lr"])
    assert len(set(seen)) == 12 and search.ask() is None


def test_bayesian_tpe_concentrates_on_the_good_region():
    space = {"x": {"type": "float", "low": -10, "high": 10}}
    search = searcher("bayesian", space, seed=0, max_trials=40)
    for _ in range(40):
        proposal = search.ask()
        ran(search, proposal, -(proposal.params["x"] - 3) ** 2)
    late = [t.params["x"] for t in search.study.trials[-20:]]
    assert sum(abs(x - 3) < 2 for x in late) >= 8  # random search: 4 of 20 expected


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="GP sampler needs torch: pip install 'hpo[gp]'")
def test_gaussian_process_sampler():
    space = {"x": {"type": "float", "low": -5, "high": 5}}
    search = searcher("bayesian", space, sampler="gp", seed=0, max_trials=16)
    for _ in range(16):
        proposal = search.ask()
        ran(search, proposal, -proposal.params["x"] ** 2)
    xs = [t.params["x"] for t in search.study.trials]
    assert len(set(xs)) == 16
    # After its 10 random start-up trials the GP model closes in on x = 0
    # (random search would put 0.24 of 6 proposals within 0.2 of it).
    assert sum(abs(x) < 0.2 for x in xs[10:]) >= 4


# -- a user's Optuna sampler, driven as Optuna drives it ------------------------------

CONTINUOUS = {"x": {"type": "float", "low": 0.0, "high": 4.0}}


def with_sampler(sampler, storage=None, space=None):
    """The search ``hpo.run(sampler=...)`` opens."""
    spec = parse_spec({"name": "s", "metric": {"name": "value"},
                       "search": {"algorithm": "bayesian", "max_trials": 10}, "space": space or CONTINUOUS})
    study = create_study(spec, storage or optuna.storages.InMemoryStorage())
    return open_search(spec, study, sampler)


def ended_by_its_worker(search, proposal, value: float) -> optuna.trial.FrozenTrial:
    """The trial started and completed, written as a worker writes it (no study.tell)."""
    storage = StudyStore.of(search.study).storage
    storage.set_trial_state_values(proposal.trial_id, optuna.trial.TrialState.RUNNING)
    storage.set_trial_state_values(proposal.trial_id, optuna.trial.TrialState.COMPLETE, [value])
    return storage.get_trial(proposal.trial_id)


class Told(optuna.samplers.RandomSampler):
    """Random search that notes what after_trial was told, and writes on the
    trial then, as TPE's constraints_func does."""

    def __init__(self, seed=0):
        super().__init__(seed=seed)
        self.told = []

    def before_trial(self, study, trial):
        assert trial.state is optuna.trial.TrialState.RUNNING  # a new trial, as Optuna asks it

    def after_trial(self, study, trial, state, values):
        self.told.append((trial.number, state, values))
        study._storage.set_trial_system_attr(trial._trial_id, "constraints", [trial.params["x"] - 2])


def test_after_trial_is_told_once_and_its_writes_on_the_ended_trial_are_kept():
    storage = optuna.storages.InMemoryStorage()
    sampler = Told()
    search = with_sampler(sampler, storage)
    trial = ended_by_its_worker(search, search.ask(), 1.0)
    search.finished(trial)
    search.finished(trial)  # the master may learn it twice (engine and store)
    assert sampler.told == [(0, optuna.trial.TrialState.COMPLETE, [1.0])]
    # A finished trial never changes in the store; what after_trial wrote is
    # read back with it, by a resumed search's sampler too.
    assert "constraints" not in storage.get_trial(trial._trial_id).system_attrs
    resumed = with_sampler(Told(), storage)
    (seen,) = resumed._view.get_trials()
    assert seen.system_attrs["constraints"] == [trial.params["x"] - 2]
    resumed.finished(trial)  # an earlier run's trial: told already
    assert resumed._inner.told == []


def test_a_trial_ended_by_its_worker_reads_as_running_until_the_sampler_is_told():
    class Peeking(optuna.samplers.RandomSampler):
        seen = []

        def before_trial(self, study, trial):  # sampled on its trial, not ahead of it
            pass

        def after_trial(self, study, trial, state, values):
            pass

        def sample_independent(self, study, trial, name, distribution):
            if trial.number == 2:  # trial 1 ends meanwhile, as a worker's write lands
                ended_by_its_worker(search, second, 2.0)
                type(self).seen = [t.state for t in study.get_trials()]
            return super().sample_independent(study, trial, name, distribution)

    search = with_sampler(Peeking(seed=0))
    search.finished(ended_by_its_worker(search, search.ask(), 1.0))
    second = search.ask()
    search.ask()
    states = optuna.trial.TrialState
    assert Peeking.seen == [states.COMPLETE, states.RUNNING, states.RUNNING]
    search.ask()  # told before the next proposal
    assert Peeking.seen and search._view.get_trials()[1].state is states.COMPLETE


def test_before_trial_sees_the_new_trial_and_its_writes_reach_the_sampling():
    sampler = optuna.samplers.GridSampler({"x": [0.5, 1.5, 2.5]}, seed=0)
    search = with_sampler(sampler)
    proposals = [search.ask() for _ in range(3)]
    for proposal in proposals:  # the point GridSampler picked for the trial in before_trial
        grid_id = search.study._storage.get_trial(proposal.trial_id).system_attrs["grid_id"]
        assert proposal.params == {"x": sampler._all_grids[grid_id][0]}
    assert sorted(p.params["x"] for p in proposals) == [0.5, 1.5, 2.5]


def test_a_sampler_that_calls_study_stop_ends_the_asking():
    class StopAtOnce(optuna.samplers.RandomSampler):
        def after_trial(self, study, trial, state, values):
            study.stop()  # Optuna's own would raise outside optimize()

    search = with_sampler(StopAtOnce(seed=0))
    queued = search.ask()
    search.finished(ended_by_its_worker(search, search.ask(), 1.0))
    assert search.ask() is None and queued is not None


def test_a_users_sampler_has_the_last_word_on_a_duplicate():
    # Optuna's GridSampler on 2 of the space's 4 points: once both are handed
    # out it picks one again; hpo draws again, then runs the sampler's point
    # (as Optuna with two workers would), never one of its own choosing.
    sampler = optuna.samplers.GridSampler({"x": [0, 1]}, seed=0)
    search = with_sampler(sampler, space={"x": [0, 1, 2, 3]})
    params = [search.ask().params["x"] for _ in range(3)]
    assert sorted(params[:2]) == [0, 1] and params[2] in (0, 1)
