"""The engine interface: how trial tasks run (Parsl's executor shape).

An engine starts, submits trial tasks and returns opaque handles, says which
handles finished, settles finished ones, cancels, and shuts down. What only
some engines can do is a capability of its own, a protocol the master checks
with ``isinstance``: :class:`Abandons`, :class:`ReachesEveryWorker`,
:class:`HasInventory`, :class:`FollowsTasks`. Trial
outcomes are not passed back through the engine: the worker wrote them to the
store, which the master reads. An engine opens no store. Engines are chosen by name through
:data:`hpo.registry.ENGINES`, or passed as objects to ``hpo.run``.

A new engine passes ``tests/engine_conformance.py`` by supplying a fixture.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hpo.errors import UsageError
from hpo.trial import TrialTask

if TYPE_CHECKING:
    from hpo.allocation import Inventory
    from hpo.space import StudySpec

__all__ = ["Engine", "ReachesEveryWorker", "FollowsTasks", "HasInventory", "Abandons"]

Handle = Any


class Engine(abc.ABC):
    """Runs :func:`hpo.trial.run_trial` for each submitted :class:`TrialTask`."""

    name: str = "engine"

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

    #: The longest the master waits on the engine before looking at its clock
    #: again (its deadlines, silent trials), in the engine's seconds.
    poll_s: float = 0.5

    def now(self) -> float:
        """The master's clock, in seconds (monotonic): its deadlines and
        heartbeat checks read it here, so an engine that simulates time
        (and its tasks) can advance it."""
        return time.monotonic()

    @abc.abstractmethod
    def submit(self, task: TrialTask, priority: bool = False) -> Handle:
        """Start ``task`` (or queue it) and return a handle. A ``priority``
        task goes ahead of queued ones: the segment a scheduling policy chose."""

    def submit_many(self, tasks: Sequence[TrialTask], priority: bool = False) -> list[Handle]:
        """Start several tasks at once (a master filling its slots); an engine
        that can hand them over in one go does."""
        return [self.submit(task, priority) for task in tasks]

    @abc.abstractmethod
    def wait(self, handles: Sequence[Handle], timeout: float) -> list[Handle]:
        """Block up to ``timeout`` s until one of ``handles`` is over; return
        those that are over (finished, failed or cancelled)."""

    @abc.abstractmethod
    def settle(self, handle: Handle) -> None:
        """Gather a finished task: raise if the task itself failed (not the
        trial: user errors are records), and release what the engine holds."""

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Cancel a task that has not started yet (a running one is left to end)."""

    def shutdown(self) -> None:
        """Release what :meth:`start` acquired."""


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

    def abandon(self, handle: Handle) -> None:
        """Give up ``handle``'s task and what holds it."""


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
    finished, suspended again, or fell silent)."""

    def follow(self, is_over: Callable[[TrialTask], bool]) -> None:
        """Keep ``is_over`` to ask."""
