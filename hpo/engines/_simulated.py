"""Runs a study on simulated time, in the master's process.

The master, its policies and the store are the real ones; only time is
simulated. Each trial runs :func:`hpo.trial.run_trial` in a thread of its
own whose clock is the engine's: the objective says what each step costs
with :meth:`hpo.Trial.elapse`, and the engine lets simulated time pass in
order of those costs, one trial at a time, while the master waits on it
(discrete-event simulation with threads). The master reads and waits on the
same clock (the engine's ``clock``), so pruners, quanta, time limits and the
study's time budget decide on simulated time. What hpo itself costs is added as
:class:`SimulatedCosts`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from hpo.engines._base import Engine, MasterClock
from hpo.errors import UsageError
from hpo.trial import TaskInterrupted, TrialOutcome, TrialStatus, TrialTask, run_trial, using_clock

__all__ = ["SimulatedEngine", "SimulatedCosts", "MAX_SLOTS"]

MAX_SLOTS = 4096


@dataclass(frozen=True)
class SimulatedCosts:
    """What hpo adds to a trial's own time, in seconds. The defaults are this
    project's measurements (docs/performance.md): a trial's dispatch and
    durable end on its slot (4 ms), a trial process's start (232 ms,
    ``bench/trial_start.py``), and a small model's checkpoint save and restore
    (2.6 and 2.7 ms). A GPU trial's start is seconds: set it."""

    dispatch_s: float = 0.004  # every task, before its objective starts
    start_s: float = 0.232  # a resumed segment's process start
    save_s: float = 0.0026  # a suspended segment's checkpoint save
    restore_s: float = 0.0027  # a resumed segment's checkpoint restore

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value >= 0 or value == float("inf"):
                raise UsageError(f"simulated cost {name}={value!r}: must be a number of seconds >= 0.\n"
                                 "  fix: give each cost in seconds, e.g. start=7")

    @classmethod
    def parse(cls, text: str) -> SimulatedCosts:
        """From ``"dispatch=0.004,start=7,save=1.2,restore=0.9"`` (seconds;
        names left out keep their defaults)."""
        fields = {"dispatch": "dispatch_s", "start": "start_s", "save": "save_s", "restore": "restore_s"}
        given: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            if name.strip() not in fields:
                raise UsageError(f"--simulated-costs: unknown cost {name.strip()!r} in {text!r}.\n"
                                 f"  fix: use {', '.join(fields)} (seconds), e.g. start=7,save=1.2")
            try:
                given[fields[name.strip()]] = float(value)
            except ValueError:
                raise UsageError(f"--simulated-costs: {item!r} is not NAME=SECONDS.\n"
                                 "  fix: e.g. --simulated-costs start=7,save=1.2") from None
        return cls(**given)

    def describe(self) -> str:
        return (f"dispatch {self.dispatch_s * 1e3:g} ms a trial; per suspended segment: save "
                f"{self.save_s * 1e3:g} ms, process start {self.start_s * 1e3:g} ms, restore "
                f"{self.restore_s * 1e3:g} ms")


class _Shutdown(BaseException):
    """Raised in a trial still asleep when the engine shuts down (not an
    ``Exception``: no objective's handler takes it for its own)."""


class SimulatedTime(MasterClock):
    """The engine's clock, shared by the master and the trial threads.

    A trial thread is *busy* while it runs code, asleep while it waits in
    :meth:`sleep`. Time moves only in :meth:`advance`, when no thread is
    busy: to the earliest wake-up, whose thread runs alone until it sleeps
    again or ends. That keeps the order of events (and so every decision)
    the same from run to run.
    """

    poll_s = 60.0  # the master wakes at each trial's end anyway: no need to poll often

    def __init__(self) -> None:
        self._now = 0.0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._asleep: list[tuple[float, int, threading.Event, list[bool]]] = []
        self._order = itertools.count()
        self._busy = 0
        self._closed = False

    def now(self) -> float:
        return self._now

    def busy(self) -> None:
        """A trial thread is about to start."""
        with self._lock:
            self._busy += 1

    def done(self) -> None:
        """A trial thread has ended."""
        with self._lock:
            self._busy -= 1
            self._idle.notify_all()

    def sleep(self, seconds: float, deadline: float = float("inf")) -> None:
        """Wait until ``seconds`` of simulated time have passed; at
        ``deadline``, raise :class:`TaskInterrupted` (its time limit)."""
        event, cut = threading.Event(), [False]
        with self._lock:
            if self._closed:
                raise _Shutdown()
            wake = self._now + seconds
            if wake > deadline:
                wake, cut[0] = deadline, True
            heapq.heappush(self._asleep, (wake, next(self._order), event, cut))
            self._busy -= 1
            self._idle.notify_all()
        event.wait()
        if self._closed:
            raise _Shutdown()
        if cut[0]:
            raise TaskInterrupted("TimeOutError")

    def advance(self, until: float, over: Any) -> None:
        """Let time pass, one wake-up at a time, until ``over()`` is true or
        ``until`` is reached with nothing left before it."""
        with self._lock:
            while True:
                while self._busy > 0:
                    self._idle.wait()
                if over():
                    return
                if not self._asleep or self._asleep[0][0] > until:
                    self._now = max(self._now, until) if until != float("inf") else self._now
                    return
                wake, _, event, _ = heapq.heappop(self._asleep)
                self._now = max(self._now, wake)
                self._busy += 1
                event.set()

    def wait(self, futures: Collection[Future], timeout: float) -> set[Future]:
        """Let up to ``timeout`` s of simulated time pass, until one of
        ``futures`` is done (the master waiting on its trials)."""
        self.advance(self._now + timeout, lambda: any(f.done() for f in futures))
        return {f for f in futures if f.done()}

    def close(self) -> None:
        """Wake every sleeper to end (a study stopped with trials asleep)."""
        with self._lock:
            self._closed = True
            for *_, event, _ in self._asleep:
                event.set()
            self._asleep.clear()


class _TrialClock:
    """A trial thread's view of :class:`SimulatedTime` (with its time limit)."""

    def __init__(self, time: SimulatedTime, deadline: float) -> None:
        self._time, self._deadline = time, deadline

    def now(self) -> float:
        return self._time.now()

    def sleep(self, seconds: float) -> None:
        self._time.sleep(seconds, self._deadline)


class SimulatedEngine(Engine):
    """``slots`` (1 to 4,096) trials at once, on simulated time.

    Objectives spend time with :meth:`hpo.Trial.elapse` (a real sleep on
    other engines); anything else they do takes no simulated time. Trials run
    in the master's process, one at a time in order of simulated time, so a
    study of thousands of trials takes seconds. A trial past its
    ``time_limit_s`` of simulated time times out.

    Examples
    --------
    >>> import hpo, tempfile
    >>> from hpo.engines import SimulatedEngine
    >>> result = hpo.run({"objective": "hpo.examples.toy:curve", "metric": {"name": "value"},
    ...                   "fixed": {"steps": 5, "step_s": 60}, "space": {"rate": [0.5, 1.0]}},
    ...                  engine=SimulatedEngine(slots=2), runs_dir=tempfile.mkdtemp(), progress=False)
    >>> result.counts["COMPLETE"]
    2
    """

    name = "simulated"

    def __init__(self, slots: int = 1, costs: SimulatedCosts | None = None) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise UsageError(f"simulated engine: slots={slots!r}; it runs 1 to {MAX_SLOTS} trials at once.\n"
                             "  fix: pass --workers N with N in that range")
        self._slots = slots
        self.costs = costs or SimulatedCosts()
        self.clock: SimulatedTime = SimulatedTime()
        self._queue: list[tuple[int, int, TrialTask, Future]] = []
        self._order = itertools.count()
        self._running = 0
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec, *, scheduler=None, workers=None) -> SimulatedEngine:
        if scheduler:
            raise UsageError("--scheduler is for the dask engine, not 'simulated'.\n"
                             "  fix: drop it; --workers sets the simulated slots")
        return cls(workers or spec.search.parallel or 1)

    @property
    def slots(self) -> int:
        return self._slots

    def submit(self, task: TrialTask, priority: bool = False) -> Future:
        # The objective runs in this process, on the engine's clock, never in a
        # process of its own: a time limit is simulated time too.
        task = replace(task, in_master=True, isolate=False)
        future: Future = Future()
        with self._lock:
            heapq.heappush(self._queue, (0 if priority else 1, next(self._order), task, future))
        self._start_queued()
        return future

    def _start_queued(self) -> None:
        """Start queued tasks on the free slots."""
        while True:
            with self._lock:
                if self._running >= self._slots or not self._queue:
                    return
                _, _, task, future = heapq.heappop(self._queue)
                if not future.set_running_or_notify_cancel():
                    continue
                self._running += 1
            self.clock.busy()
            threading.Thread(target=self._run, args=(task, future), daemon=True,
                             name=f"hpo-simulated-{task.number}").start()

    def _run(self, task: TrialTask, future: Future) -> None:
        started = self.clock.now()
        limit = task.time_limit_s if task.time_limit_s is not None else float("inf")
        clock = _TrialClock(self.clock, started + limit)
        try:
            with using_clock(clock):
                clock.sleep(self._start_cost(task))
                outcome = run_trial(task)
                if outcome.state is TrialStatus.SUSPENDED:
                    clock.sleep(self.costs.save_s)
            future.set_result(outcome)
        except _Shutdown:
            future.set_result(TrialOutcome(task.number, TrialStatus.RUNNING))
        except TaskInterrupted:  # its time limit came during hpo's own costs
            future.set_result(TrialOutcome(task.number, TrialStatus.RUNNING))
        except BaseException as exc:  # an infrastructure fault: the master settles it
            future.set_exception(exc)
        finally:
            with self._lock:
                self._running -= 1
            self._start_queued()  # the next one starts at this moment
            self.clock.done()

    def _start_cost(self, task: TrialTask) -> float:
        resumed = task.after_segment >= 0
        return self.costs.dispatch_s + (self.costs.start_s + self.costs.restore_s if resumed else 0.0)

    def shutdown(self) -> None:
        with self._lock:
            for *_, future in self._queue:
                future.cancel()
            self._queue.clear()
        self.clock.close()
