"""What every Optuna sampler must get from ``hpo.run(sampler=...)``, as one
suite (after Optuna's ``optuna/testing/pytest_samplers.py``).

Optuna drives a sampler through hooks around each trial (``Study.ask``,
``optuna/study/_tell.py``): ``before_trial`` once the trial exists and
before it is sampled, ``after_trial(study, trial, state, values)`` once it
ended. Samplers rely on them: TPE, NSGA-II and GP store each trial's
constraints in ``after_trial``, GridSampler picks the trial's point in
``before_trial`` and stops the study in ``after_trial`` once its grid is
done. A test module joins an engine by subclassing :class:`SamplerConformance`
and supplying the ``kit`` (how hpo runs there) and ``case`` and
``constrained_case`` fixtures (which samplers to run). Every behaviour runs
real trials that write a real store.
"""

from __future__ import annotations

import abc
import importlib.util
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

import hpo
from hpo.store import RunDir
from hpo.search import MultiFidelitySampler

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
DISCRETE = {"x": [0, 1, 2, 3], "y": [-1, 0]}  # 8 points
CONTINUOUS = {"x": {"type": "float", "low": 0.0, "high": 4.0},
              "y": {"type": "float", "low": -2.0, "high": 1.0}}
TRIALS = 6


def constraints(trial: FrozenTrial) -> tuple[float]:
    """Feasible where x <= 2.5 (Optuna's convention: a value <= 0 is feasible)."""
    return (trial.params["x"] - 2.5,)


@dataclass(frozen=True)
class Case:
    """One sampler to run: ``make(constraints_func)`` builds it (the function
    is None where the sampler takes none)."""

    name: str
    make: Callable[[Callable[[FrozenTrial], tuple[float]] | None], BaseSampler]
    space: dict[str, Any] = field(default_factory=lambda: CONTINUOUS)
    constrained: bool = False
    needs: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """The modules it needs that are not installed."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]

    def __str__(self) -> str:
        return self.name


def _quiet(make: Callable[[], BaseSampler]) -> BaseSampler:
    with warnings.catch_warnings():  # experimental or deprecated arguments: a user's choice
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constraints_func: deprecated in Optuna 5 for Trial.set_constraint, still supported
        warnings.simplefilter("ignore", FutureWarning)
        return make()


S = optuna.samplers
CASES = [
    Case("random", lambda c: S.RandomSampler(seed=0)),
    Case("tpe", lambda c: _quiet(lambda: S.TPESampler(seed=0, n_startup_trials=2, constraints_func=c)),
         constrained=True),
    Case("tpe-multivariate", lambda c: _quiet(lambda: S.TPESampler(
        seed=0, n_startup_trials=2, multivariate=True, constant_liar=True, constraints_func=c)),
         constrained=True),
    Case("gp", lambda c: _quiet(lambda: S.GPSampler(seed=0, n_startup_trials=2, constraints_func=c)),
         constrained=True, needs=("torch", "scipy")),
    Case("nsga2", lambda c: _quiet(lambda: S.NSGAIISampler(seed=0, population_size=2, constraints_func=c)),
         constrained=True),
    Case("qmc", lambda c: _quiet(lambda: S.QMCSampler(seed=0, warn_independent_sampling=False))),
    Case("grid", lambda c: S.GridSampler(DISCRETE, seed=0), space=DISCRETE),
    Case("bruteforce", lambda c: _quiet(lambda: S.BruteForceSampler(seed=0)), space=DISCRETE),
    Case("cmaes", lambda c: S.CmaEsSampler(seed=0, n_startup_trials=2), needs=("cmaes",)),
    Case("multifidelity", lambda c: MultiFidelitySampler(seed=0, min_points=2)),
]
CONSTRAINED = [case for case in CASES if case.constrained]


def by_name(*names: str) -> list[Case]:
    return [case for case in CASES if case.name in names]


class Recorder(BaseSampler):
    """Wraps a sampler and records, in order, what it was asked: its hooks,
    its samples, and any finished trial it saw without constraints."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner
        self.events: list[tuple[str, int]] = []
        self.told: dict[int, tuple[TrialState, list[float] | None]] = {}
        self.unconstrained: set[int] = set()  # finished trials seen without constraints

    def infer_relative_search_space(self, study, trial):
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        self._sampling(study, trial)
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        self._sampling(study, trial)
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.events.append(("before", trial.number))
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.events.append(("after", trial.number))
        self.told[trial.number] = (state, None if values is None else list(values))
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()

    def _sampling(self, study, trial) -> None:
        self.events.append(("sample", -1 if trial is None else trial.number))
        for seen in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if "constraints" not in seen.system_attrs:
                self.unconstrained.add(seen.number)


class StopAfter(optuna.samplers.RandomSampler):
    """Random search that stops the study in ``after_trial`` once ``count``
    trials have finished, as a user's sampler may; it notes how many trials
    the study had then."""

    def __init__(self, count: int, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.count = count
        self.trials_at_stop: int | None = None

    def after_trial(self, study, trial, state, values):
        finished = study.get_trials(deepcopy=False, states=FINISHED)
        if self.trials_at_stop is None and len(finished) >= self.count:
            self.trials_at_stop = len(study.get_trials(deepcopy=False))
            study.stop()


class SamplerKit(abc.ABC):
    """How the suite runs hpo with a sampler on one engine."""

    parallel = 1

    @abc.abstractmethod
    def engine(self) -> dict[str, Any]:
        """``hpo.run``'s engine arguments."""

    def run(self, name: str, space: dict[str, Any], sampler: BaseSampler, runs_dir: Path,
            max_trials: int = TRIALS) -> list[FrozenTrial]:
        """Run ``space`` with ``sampler`` to its end; its trials as stored."""
        study = {"name": name, "objective": "hpo.examples.toy:quadratic",
                 "metric": {"name": "value", "direction": "maximize"},
                 "search": {"algorithm": "bayesian", "max_trials": max_trials,
                            "parallel": self.parallel, "seed": 0},
                 "space": space}
        hpo.run(study, sampler=sampler, runs_dir=runs_dir, progress=False, **self.engine())
        return stored_trials(runs_dir / name)


def stored_trials(run_dir: Path) -> list[FrozenTrial]:
    """The study's trials as a fresh reader of its store gets them, with what
    samplers wrote on them once they ended (:func:`hpo.search.sampler_view`)."""
    from hpo.search import sampler_view

    store = RunDir(run_dir).open_store(read_only=True)
    return sampler_view(store.study()).get_trials(deepcopy=False)


class SamplerConformance:
    """The behaviours; each runs with the subclass's ``kit`` and cases."""

    def test_before_and_after_trial_once_per_trial(self, kit: SamplerKit, case: Case, tmp_path):
        _skip_missing(case)
        sampler = Recorder(case.make(constraints if case.constrained else None))
        trials = kit.run(f"hooks-{case}", case.space, sampler, tmp_path)
        numbers = Counter(t.number for t in trials)
        assert len(trials) == TRIALS
        assert Counter(n for kind, n in sampler.events if kind == "before") == numbers
        assert Counter(n for kind, n in sampler.events if kind == "after") == numbers
        for trial in trials:  # as stored, the state and values after_trial was given
            assert sampler.told[trial.number] == (trial.state, trial.values)
        for number in numbers:  # before_trial first, after_trial last
            mine = [kind for kind, n in sampler.events if n == number]
            assert mine[0] == "before" and mine[-1] == "after" and mine.count("sample") >= 1

    def test_constraints_are_stored_on_every_finished_trial(self, kit: SamplerKit,
                                                            constrained_case: Case, tmp_path):
        case = constrained_case
        _skip_missing(case)
        sampler = Recorder(case.make(constraints))
        trials = kit.run(f"constraints-{case}", case.space, sampler, tmp_path)
        assert [t.state for t in trials] == [TrialState.COMPLETE] * TRIALS
        assert {t.number: t.system_attrs.get("constraints") for t in trials} == {
            t.number: list(constraints(t)) for t in trials}
        assert sampler.unconstrained == set()  # the sampler never saw one without

    def test_a_sampler_that_stops_the_study_in_after_trial_stops_it(self, kit: SamplerKit, tmp_path):
        sampler = StopAfter(3)
        trials = kit.run("stop", CONTINUOUS, sampler, tmp_path, max_trials=12)
        assert sampler.trials_at_stop is not None
        assert max(t.number for t in trials) < sampler.trials_at_stop < 12  # none asked after it
        assert all(t.state.is_finished() for t in trials)  # those asked before it ran to their end

    def test_grid_sampler_runs_the_points_it_picks_and_stops_after_its_grid(self, kit: SamplerKit,
                                                                           tmp_path):
        grid = {"x": [0, 1], "y": [-1, 0]}  # 4 of the space's 8 points
        sampler = NotingGrid(grid, seed=0)
        # A point is asked again only while it runs: at most 4 points times the
        # trials in flight (3 here), so the grid ends the study, not the budget.
        trials = kit.run("grid", DISCRETE, sampler, tmp_path, max_trials=20)
        assert {(t.params["x"], t.params["y"]) for t in trials} == {
            (x, y) for x in grid["x"] for y in grid["y"]}
        for trial in trials:  # the point before_trial picked for it
            x, y = sampler._all_grids[trial.system_attrs["grid_id"]]
            assert trial.params == {"x": x, "y": y}
        # A trial asked while the last points still ran may run one of them
        # again, as in Optuna with several workers; none is asked after.
        assert sampler.trials_at_stop is not None
        assert max(t.number for t in trials) < sampler.trials_at_stop


class NotingGrid(optuna.samplers.GridSampler):
    """Optuna's GridSampler, noting how many trials the study had when its
    ``after_trial`` stopped it (it does once every point was evaluated)."""

    trials_at_stop: int | None = None

    def after_trial(self, study, trial, state, values):
        super().after_trial(study, trial, state, values)
        if self.trials_at_stop is None and self.is_exhausted(study):
            self.trials_at_stop = len(study.get_trials(deepcopy=False))


def _skip_missing(case: Case) -> None:
    import pytest

    if case.missing():
        pytest.skip(f"{case} needs {', '.join(case.missing())}")
