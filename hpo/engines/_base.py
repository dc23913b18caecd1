"""The engine interface: how trial tasks run, in Parsl's executor shape.

An engine starts, takes trial tasks with :meth:`Engine.submit` and returns a
:class:`concurrent.futures.Future` for each, says how many run at once, and
shuts down. The master waits on the futures through the engine's
:class:`MasterClock` (the wall clock, or an engine's simulated one), gathers a
finished task with ``future.result()`` (it raises when the task itself
failed, never for the trial: user errors are records) and cancels a queued
one with ``future.cancel()``.

What only some engines can do is a capability of its own, a protocol the
master checks with ``isinstance``: :class:`SubmitsMany`, :class:`Abandons`,
:class:`ReachesEveryWorker`, :class:`HasInventory`, :class:`FollowsTasks`.
Trial outcomes are not passed back through the engine: the worker wrote
them to the store, which the master reads. An engine opens no store. Engines
are chosen by name through :data:`hpo.registry.ENGINES`, or passed as objects
to ``hpo.run``.

A new engine passes ``tests/engine_conformance.py`` by supplying a fixture.
"""

from __future__ import annotations

import abc
import concurrent.futures
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hpo.errors import UsageError
from hpo.trial import TrialTask

if TYPE_CHECKING:
    from hpo.allocation import Inventory
    from hpo.space import StudySpec

__all__ = ["Engine", "MasterClock", "WallClock", "gather", "SubmitsMany", "ReachesEveryWorker",
           "FollowsTasks", "HasInventory", "Abandons"]


class MasterClock(abc.ABC):
    """What the master reads time from and waits on futures with: its
    deadlines, heartbeat checks and waits go through its engine's clock, so
    an engine that simulates time (and its tasks) moves it."""

    #: The longest the master waits before looking at the clock again (its
    #: deadlines, silent trials), in the clock's seconds.
    poll_s: float = 0.5

    @abc.abstractmethod
    def now(self) -> float:
        """Seconds, monotonic."""

    @abc.abstractmethod
    def wait(self, futures: Collection[Future], timeout: float) -> set[Future]:
        """Block up to ``timeout`` s until one of ``futures`` is done; the done ones."""


class WallClock(MasterClock):
    """Real time: ``time.monotonic`` and :func:`concurrent.futures.wait`."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, futures: Collection[Future], timeout: float) -> set[Future]:
        if not futures:
            return set()
        done, _ = concurrent.futures.wait(futures, timeout, concurrent.futures.FIRST_COMPLETED)
        return done


def gather(future: Future) -> None:
    """Take a finished task's end: raise what made the task itself fail (an
    engine fault); a cancelled task has nothing to gather."""
    if not future.cancelled():
        future.result()


class Engine(abc.ABC):
    """Runs :func:`hpo.trial.run_trial` for each submitted :class:`TrialTask`."""

    name: str = "engine"
    #: What the master reads time from and waits with.
    clock: MasterClock = WallClock()

    @property
    def local(self) -> bool:
        """Whether every task runs on this machine (the store's relay then
        listens on 127.0.0.1 only)."""
        return True

    @classmethod
    def from_spec(cls, spec: StudySpec, *, scheduler: str | None = None,
                  workers: int | None = None) -> Engine:
        """The engine configured for the study ``spec``; ``scheduler`` and
        ``workers`` are the command line's ``--scheduler`` and ``--workers``,
        which only some engines take."""
        if scheduler or workers:
            flag = "--scheduler" if scheduler else "--workers"
            raise UsageError(f"{flag} is for the dask engine, not {cls.name!r}.\n"
                             "  fix: add --engine dask, or drop it")
        return cls()

    def __enter__(self) -> Engine:
        # Re-entrant: hpo.run starts the engine before recording anything (an
        # unreachable scheduler is refused first); the controller enters again.
        self._entered = getattr(self, "_entered", 0) + 1
        if self._entered > 1:
            return self
        try:
            self.start()
        except BaseException:
            self._entered = 0
            self.shutdown()  # release what a half-done start acquired
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered -= 1
        if self._entered == 0:
            self.shutdown()

    def start(self) -> None:
        """Acquire what the engine needs (a cluster, a client, the runtime)."""

    @property
    @abc.abstractmethod
    def slots(self) -> int:
        """How many trials can run at once."""

    @abc.abstractmethod
    def submit(self, task: TrialTask, priority: bool = False) -> Future:
        """Start ``task`` (or queue it); its future is done when the task is
        over (finished, failed or cancelled). A ``priority`` task goes ahead
        of queued ones: the segment a scheduling policy chose. Cancelling
        the future cancels the task if it has not started (a running one is
        left to end: its trial is told to stop through the store)."""

    def shutdown(self) -> None:
        """Release what :meth:`start` acquired."""


@runtime_checkable
class SubmitsMany(Protocol):
    """An engine that takes several tasks in one message (Dask's
    ``Client.map``), as the master does filling its slots."""

    def submit_many(self, tasks: Sequence[TrialTask], priority: bool = False) -> list[Future]:
        """:meth:`Engine.submit` for each of ``tasks``, in order."""


@runtime_checkable
class ReachesEveryWorker(Protocol):
    """An engine that can run a function on every worker it has now (Dask's
    ``client.run``), as the master does at a study's end to remove its
    staged data from the nodes. COMPSs cannot: it runs nothing on a chosen node."""

    def run_on_every_worker(self, function: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """``function(*args)`` on each worker, by the worker's address."""


@runtime_checkable
class Abandons(Protocol):
    """An engine that can give up a running task whose trial fell silent (its
    worker hung or was cut off, yet the engine still counts on it), e.g. by
    taking the worker out (Dask). The master runs the trial again elsewhere,
    and the attempt, should it come back, is fenced off by the store; an
    engine without it has the task cancelled."""

    def abandon(self, future: Future) -> None:
        """Give up ``future``'s task and what holds it."""


@runtime_checkable
class HasInventory(Protocol):
    """An engine that lets the master choose where each trial goes (its task
    then names the GPU ids and the hosts). COMPSs binds GPUs itself."""

    def inventory(self) -> Inventory:
        """The nodes and GPUs trials run on."""


@runtime_checkable
class FollowsTasks(Protocol):
    """An engine with no wait-any of its own (COMPSs) that asks the master,
    from its replica of the store, whether a task is over (its trial
    finished, suspended again, or fell silent), to complete its futures."""

    def follow(self, is_over: Callable[[TrialTask], bool]) -> None:
        """Keep ``is_over`` to ask."""
