"""The master loop: keep ``parallel`` trials in flight until the study is done.

Asynchronous, not batch-synchronous: as soon as one trial finishes, the next
configuration is asked and submitted. The engine says which tasks finished;
results are always read from the store, which the worker wrote before its
task ended.

The study ends when the budget (``max_trials``) is used, the space is
exhausted, the metric reaches its ``target``, or the wall-clock budget
(``timeout_s``) runs out. What happens to trials then is
:mod:`hpo.master._lifecycle`'s business; which suspended trial runs next is
:mod:`hpo.master._scheduling`'s.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import optuna

from hpo.allocation import Allocator, PassThrough, make_allocator
from hpo.data import remove_copies
from hpo.engines import Abandons, Engine, FollowsTasks, HasInventory, ReachesEveryWorker, SubmitsMany
from hpo.errors import EngineLost, StopRequested
from hpo.master import _lifecycle as lifecycle
from hpo.master._fail_fast import FailFast
from hpo.master._lifecycle import InFlight
from hpo.master._progress import ProgressLine
from hpo.master._pruning import make_pruning
from hpo.master._scheduling import Policy, QuantumRule, Waiting, make_policy, waiting_of
from hpo.results import StudyResult
from hpo.search import Searcher, create_study, open_search, startup_trials
from hpo.space import StudySpec
from hpo.store import MasterLease, RunDir, StudyRelay, StudyStore, context_of, relay_interface
from hpo.store.records import TrialStatus, run_of, status_of
from hpo.trial import Objective, TrialTask

__all__ = ["Controller"]



@dataclass
class Controller:
    """Runs one study of ``spec`` on ``engine``, storing everything in ``run_dir``.

    ``objective``, ``sampler`` and ``pruner`` replace what the space names.
    """

    spec: StudySpec
    run_dir: RunDir
    storage_url: str
    engine: Engine
    objective: str | Objective | None = None
    sampler: optuna.samplers.BaseSampler | None = None
    pruner: optuna.pruners.BasePruner | None = None
    progress: bool = True
    lease: MasterLease | None = None  # this master's hold on the study: its relay fences writes by it
    _in_flight: dict[int, InFlight] = field(default_factory=dict, init=False)
    _allocator: Allocator | PassThrough | None = field(default=None, init=False)  # set as the study runs
    _store: StudyStore | None = field(default=None, init=False)
    _relay: StudyRelay | None = field(default=None, init=False)
    _writers_url: str = field(default="", init=False)

    @cached_property
    def _policy(self) -> Policy:
        return make_policy(self.spec.scheduling.policy)

    @cached_property
    def _quantum(self) -> QuantumRule | None:
        """The quanta trials run in; None when each runs to its end (FIFO)."""
        if not self._policy.time_shares:
            return None
        return QuantumRule.of(self.spec.scheduling, self.spec.metric.direction == "maximize")

    def run(self) -> StudyResult:
        """Run the study to its end, through the study's relay: the one reader
        and sequencer of its store while the master runs."""
        spec = self.spec
        pruning = make_pruning(spec.early_stopping_settings, maximize=spec.metric.direction == "maximize",
                               study_name=spec.name, metric=spec.metric.name, pruner=self.pruner)
        host, advertised = relay_interface(self.engine.local)
        with StudyRelay(self.storage_url, spec.name, pruning=pruning, control=self.run_dir.control_file,
                        host=host, advertised=advertised, lease=self.lease) as relay:
            study = create_study(spec, relay.storage)
            # Fencing: from now on a master of an earlier run writes nothing more.
            relay.claim(relay.storage.get_study_id_from_name(spec.name))
            if hasattr(pruning, "attach"):  # an Optuna pruner object reads the replica
                pruning.attach(study)
            self._writers_url = relay.writers_url
            self._relay = relay
            result = self._run(study, relay)
            # A master that slept through another's run of the study may find
            # nothing left to do, and write nothing: it still says so (exit 75).
            relay.verify()
            # Readers (hpo status, the dashboard) start from it instead of
            # replaying the whole journal; a small study writes none.
            relay.save_snapshot()
            return result

    def _run(self, study: optuna.Study, relay: StudyRelay) -> StudyResult:
        store = self._store = StudyStore.of(study)
        if isinstance(self.engine, FollowsTasks):  # it has no wait-any: it asks the replica
            self.engine.follow(lambda task: lifecycle.task_over(store, task, relay.heard_until()))
        lifecycle.await_live_trials(store, self.progress, relay.heard_until)
        lifecycle.fail_master_killers(store)
        if (store.stop() or {}).get("reason") == "target":
            return StudyResult.from_store(store, self.spec.metric.name)  # already done
        store.set_stop(None)
        store.set_contender(None)
        searcher = open_search(self.spec, study, self.sampler)
        with self.engine:
            inventory = self.engine.inventory if isinstance(self.engine, HasInventory) else lambda: None
            self._allocator = make_allocator(self.spec, inventory, store,
                                             self.objective or self.spec.objective,
                                             self.run_dir.path / "layer_costs.json", self._task)
            try:
                self._loop(searcher, store)
            except (KeyboardInterrupt, StopRequested) as exc:
                name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else str(exc)
                lifecycle.suspend_running(store, self.engine, self._in_flight, name, relay.settle)
                raise
            except EngineLost as exc:  # nothing to tell the trials: nothing reaches them
                raise EngineLost(f"{exc}; {len(self._in_flight)} trials were in flight") from None
            self._remove_staged_data(store)
        return StudyResult.from_store(store, self.spec.metric.name)

    def _remove_staged_data(self, store: StudyStore) -> None:
        """The study is over: the data its nodes staged goes, unless
        ``data.keep`` (a study stopped to be resumed keeps it for the next run)."""
        data = self.spec.data
        if data is None or data.keep:
            return
        runs = [run_of(trial) for trial in store.trials()]
        hosts = {host for run in runs
                 for host in [run.get("host"), *(a.get("host") for a in run.get("previous", []))] if host}
        reach = self.engine.run_on_every_worker if isinstance(self.engine, ReachesEveryWorker) else None
        remove_copies(data, self.spec.name, hosts, reach, verbose=self.progress)

    def _loop(self, searcher: Searcher, store: StudyStore) -> None:
        # Never more in flight than the engine can run: trials prepared beyond
        # its slots would only wait, created in the store, past any time budget.
        parallel = self._parallel()
        allocator = self._allocator
        if allocator is None or self._relay is None:
            raise RuntimeError("hpo internal error: set by run() and _run()")
        window = parallel + allocator.ahead(parallel, self._queued(parallel))
        progress = ProgressLine(self.spec.max_trials, self.spec.metric.name, enabled=self.progress,
                                slots=parallel)
        clock = self.engine.clock
        deadline = clock.now() + (self.spec.search.timeout_s or float("inf"))
        stopping = exhausted = False
        tally = _Tally.of(store)
        failing = FailFast.of(store, parallel)  # the first trials all failing alike stop the study
        misconfigured = False
        maximize = store.maximize
        # Trials an earlier run left suspended or lost go on first, from their checkpoints.
        leftovers = {w.number: w for w in (waiting_of(t, maximize) for t in lifecycle.unfinished(store))}
        # Then those it created and no worker started, as they are.
        queued = {t.number: t for t in lifecycle.never_started(store)}
        if self.progress and (tally.counted or leftovers or queued):
            _say_resuming(self.spec.max_trials, tally, len(leftovers), len(queued))
        waiting: dict[int, Waiting] = {}
        contender: list[float | None] = [None]  # as last published
        looked = [clock.now()]  # when the running trials' heartbeats were last looked at

        def opened() -> int:
            return (tally.counted + len(self._in_flight) + len(waiting) + len(leftovers) + len(queued)
                    + allocator.pending)

        def may_open() -> bool:
            return (not stopping and not exhausted and opened() < self.spec.max_trials
                    and self._room_for_new(searcher, tally.counted, len(waiting), opened() - tally.counted))

        while True:
            if self._relay.broken is not None:  # the store takes no more writes: stop here
                raise self._relay.stopped()
            while not stopping and len(self._in_flight) + allocator.pending < window:
                if leftovers:
                    self._resume(store, leftovers, "left unfinished by an earlier run")
                elif queued and not stopping:
                    self._start_queued(queued.pop(min(queued)))
                elif may_open():
                    room = min(window - len(self._in_flight) - allocator.pending,
                               self.spec.max_trials - opened())
                    exhausted = not self._start_new(searcher, 1 if searcher.adaptive else room)
                elif waiting:
                    self._resume(store, waiting)
                else:
                    break
            if not stopping:
                self._submit_all(allocator.starts(parallel - len(self._in_flight)))
                for number in allocator.refused:
                    tally.add(number, TrialStatus.FAILED, None, maximize)
                allocator.refused.clear()
                allocator.grow({n: f.trial_id for n, f in self._in_flight.items()})
            self._publish(store, contender, may_open(), [*waiting.values(), *leftovers.values()])
            progress.update(*tally.line(len(self._in_flight)))  # what was just submitted
            if not self._in_flight:
                if allocator.pending and not stopping:
                    raise RuntimeError(f"{allocator.pending} trials wait and none can start")
                break
            wait_s = clock.poll_s if stopping else min(  # woken at the deadline, not after
                clock.poll_s, max(deadline - clock.now(), 0.001))
            ended = lifecycle.finished(self.engine, self._in_flight, wait_s, self._relay.settle)
            silent = [n for n in lifecycle.fallen_silent(store, self._in_flight, looked, clock.now(),
                                                         self._relay.heard_until()) if n not in ended]
            if silent:  # a master that was itself stopped may have lost the study meanwhile
                self._relay.verify()
            for number in silent:
                self._give_up(self._in_flight[number].future)
            for number in [*ended, *silent]:
                flight = self._in_flight.pop(number)
                trial = (store.trial(flight.trial_id) if number in silent  # abandoned: nothing to gather
                         else lifecycle.collect(store, flight))
                allocator.finished(number, trial)
                state, value = status_of(trial), trial.values[0] if trial.values else None
                if state is TrialStatus.SUSPENDED:
                    waiting[number] = waiting_of(trial, maximize)
                    continue
                if state is TrialStatus.RUNNING:  # its task ended without a result
                    fault = lifecycle.machine_fault(trial)
                    if fault is not None:  # a full disk: the next trials would meet it too
                        raise fault
                    if lifecycle.resume_lost(store, trial, self.spec.retries.engine):
                        leftovers[number] = waiting_of(trial, maximize)
                        continue
                    trial = store.trial(store.trial_id(trial))
                    state = status_of(trial)
                tally.add(number, state, value, maximize)
                searcher.finished(trial)  # the sampler's after_trial, as Optuna's tell calls it
                if not stopping and failing.add(trial, state) and tally.counted < self.spec.max_trials:
                    stopping = misconfigured = self._stop(store, {"reason": "same_failure"})
                if not stopping and self._reached_target(state, trial.values):
                    stopping = self._stop(store, {"reason": "target", "trial": number, "value": value})
            if not stopping and clock.now() > deadline:
                stopping = self._stop(store, {"reason": "timeout_s", "timeout_s": self.spec.search.timeout_s})
            progress.update(*tally.line(len(self._in_flight)))
        if stopping:
            held = allocator.drain()
            never = [c.trial_id for c in held if not c.resume] + [store.trial_id(t) for t in queued.values()]
            for trial_id in never:  # created, never started: its configuration is not used up
                store.end_without_result(trial_id, "cancelled", "study stopped")
            lifecycle.stop_suspended(store, [w.trial_id for w in [*waiting.values(), *leftovers.values()]]
                                     + [c.trial_id for c in held if c.resume], store.stop() or {})
        progress.close()
        if misconfigured:
            raise failing.error(self.spec.source, self.run_dir.path, self.spec.metric.name)

    def _start_new(self, searcher: Searcher, room: int = 1) -> bool:
        """Submit up to ``room`` new proposed configurations (stored together
        where the search allows); False when the space is exhausted."""
        proposals = searcher.ask_many(max(room, 1))
        if self._allocator is None:
            raise RuntimeError("hpo internal error: self._allocator is not None")
        for proposal in proposals:
            self._allocator.propose(proposal.number, proposal.trial_id, proposal.params, new=True)
        return bool(proposals)

    def _start_queued(self, trial: optuna.trial.FrozenTrial) -> None:
        """Start a trial an earlier run created and never started."""
        if self._allocator is None:
            raise RuntimeError("hpo internal error: self._allocator is not None")
        self._allocator.propose(trial.number, StudyStore.trial_id(trial), dict(trial.params))

    def _room_for_new(self, searcher: Searcher, finished: int, waiting: int, unfinished: int) -> bool:
        """Whether a new trial may take a slot now. New trials come first,
        until a sampler that learns has enough to learn from (its random
        start-up); then at most twice the slots are open (running or
        suspended), so suspended trials finish and teach it instead of
        waiting behind the rest of the budget."""
        if not (self._policy.time_shares and searcher.adaptive):
            return True
        learnt_from = finished + waiting
        return learnt_from < startup_trials(self.spec.max_trials) or unfinished < 2 * self._parallel()

    def _parallel(self) -> int:
        """Trials run at once: the space's ``parallel``, at most the engine's slots."""
        return min(self.spec.search.parallel or self.engine.slots, self.engine.slots)

    def _publish(self, store: StudyStore, published: list[float | None], new_waits: bool,
                 waiting: list[Waiting]) -> None:
        """Tell running trials what they must beat to keep their slots: a new
        trial waiting to start beats anyone; else the policy says."""
        value = self._policy.contender(waiting, new_waits)
        if value != published[0]:
            store.set_contender(value)
            published[0] = value

    def _resume(self, store: StudyStore, waiting: dict[int, Waiting], why: str | None = None) -> None:
        """Run the next segment of the suspended trial the policy picks."""
        policy = self._policy
        chosen = policy.pick(list(waiting.values()))
        # One whose attempt, given up as silent, ended it meanwhile is still
        # handed out: its task is refused at its start, and gathered as ended.
        store.record_event(chosen.trial_id, "resumed", None,
                           why or policy.why(chosen, list(waiting.values())))
        del waiting[chosen.number]
        stored = store.trial(chosen.trial_id)
        if self._allocator is None:
            raise RuntimeError("hpo internal error: self._allocator is not None")
        self._allocator.resume(stored, run_of(stored).get("segment", -1), why)

    def _submit_all(self, starts: list[tuple[TrialTask, bool]]) -> None:
        """Hand ``starts`` (task, priority) to the engine in order, each run
        of one priority in one go (the engine may batch them)."""
        while starts:
            priority = starts[0][1]
            count = next((i for i, (_, p) in enumerate(starts) if p != priority), len(starts))
            tasks = [task for task, _ in starts[:count]]
            starts = starts[count:]
            submitted_at = time.time()  # before the hand-over: a task may start at once
            for task, future in zip(tasks, self._submit_many(tasks, priority)):
                self._in_flight[task.number] = InFlight(task, future, submitted_at)

    @cached_property
    def _batches(self) -> SubmitsMany | None:
        """The engine, where it takes many tasks in one message (a protocol's
        isinstance is slow to ask at every submit)."""
        return self.engine if isinstance(self.engine, SubmitsMany) else None

    def _submit_many(self, tasks: list[TrialTask], priority: bool) -> list[Future]:
        if self._batches is not None:
            return self._batches.submit_many(tasks, priority)
        return [self.engine.submit(task, priority) for task in tasks]

    def _give_up(self, future: Future) -> None:
        """Give up the task of a trial fallen silent (it runs again elsewhere)."""
        if isinstance(self.engine, Abandons):
            self.engine.abandon(future)
        else:
            future.cancel()

    def _task(self, number: int, trial_id: int, params: dict[str, Any],
              after_segment: int = -1, new: bool = False, **allocation: Any) -> TrialTask:
        """The task of a trial, with what the replica holds of it (its
        process never reads the store; a ``new`` trial holds nothing yet)."""
        if self._store is None:
            raise RuntimeError("hpo internal error: set by _run(), before the allocator asks")
        context = None if new else context_of(self._store.trial(trial_id))
        return TrialTask.for_trial(self.spec, self.run_dir, self._writers_url, number, trial_id,
                                   params, quantum=self._quantum, after_segment=after_segment,
                                   objective=self.objective, context=context,
                                   master=self.lease.token if self.lease else None,
                                   end_waits=False, **allocation)  # the loop settles ends

    def _queued(self, parallel: int) -> int:
        """How many trials to prepare ahead and queue in the engine.

        A slot that frees then starts its next trial at once instead of waiting
        for the master. Grid and random search lose nothing by asking early
        (one per slot); Bayesian search would propose with less information
        (one in all). None when queued tasks could start early, i.e. when the
        engine has more slots than ``parallel``, or a time-sharing policy
        chooses which trial takes a slot as it frees.
        """
        if parallel < self.engine.slots or self._policy.time_shares:
            return 0
        return parallel if self.spec.search.algorithm in ("grid", "random") else 1

    def _reached_target(self, state: TrialStatus, values: list[float] | None) -> bool:
        return state is TrialStatus.COMPLETE and self.spec.reaches_target(values)

    def _stop(self, store: StudyStore, reason: dict[str, Any]) -> bool:
        lifecycle.stop(store, self._in_flight, reason)
        return True


@dataclass
class _Tally:
    """Counts for the budget and the progress line."""

    counted: int = 0
    failed: int = 0
    best: tuple[int, float] | None = None

    @classmethod
    def of(cls, store: StudyStore) -> _Tally:
        tally = cls()
        maximize = store.maximize
        for trial in store.trials():
            state = status_of(trial)
            if state.is_finished:
                tally.add(trial.number, state, trial.values[0] if trial.values else None, maximize)
        return tally

    def add(self, number: int, state: TrialStatus, value: float | None, maximize: bool) -> None:
        if state is TrialStatus.CANCELLED:
            return  # its configuration was not used up
        self.counted += 1
        self.failed += state in (TrialStatus.FAILED, TrialStatus.TIMEOUT)
        if state is TrialStatus.COMPLETE:
            # Ties go to the lower trial number, as in the leaderboard and the
            # summary (StudyResult.best), whatever order trials finish in.
            if value is None:
                raise RuntimeError("hpo internal error: a COMPLETE trial has its value")
            sign = -1.0 if maximize else 1.0
            if self.best is None or (sign * value, number) < (sign * self.best[1], self.best[0]):
                self.best = (number, value)

    def line(self, running: int) -> tuple[int, int, int, tuple[int, float] | None]:
        return self.counted, running, self.failed, self.best


def _say_resuming(budget: int, tally: _Tally, unfinished: int, queued: int) -> None:
    """What a run of a study an earlier run began takes up, and what is left."""
    left = max(budget - tally.counted - unfinished - queued, 0)
    print(f"hpo: resuming: {tally.counted} of up to {budget} trials done ({tally.failed} failed); "
          f"{unfinished} unfinished go on from their checkpoints, {queued} created and never "
          f"started run now, up to {left} new", file=sys.stderr, flush=True)
