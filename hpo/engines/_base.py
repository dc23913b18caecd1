"""The engine interface: how trial tasks run (Parsl's executor shape).

An engine starts, submits trial tasks and returns opaque handles, says which
handles finished when it can, settles finished ones, cancels, and shuts down.
Trial outcomes are not passed back through the engine: the worker wrote them
to the store, which the master reads.
Nothing outside ``hpo.engines`` imports an engine class directly.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from hpo.trial import TrialTask

__all__ = ["Engine"]

Handle = Any


class Engine(abc.ABC):
    """Runs :func:`hpo.trial.run_trial` for each submitted :class:`TrialTask`."""

    name: str = "engine"
    #: Whether :meth:`wait` knows which tasks finished. COMPSs has no wait-any:
    #: there the master learns completion from the store instead.
    reports_completion: bool = True

    def __enter__(self) -> "Engine":
        try:
            self.start()
        except BaseException:
            self.shutdown()  # release what a half-done start acquired
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> None:
        """Acquire what the engine needs (a cluster, a client, the runtime)."""

    @property
    @abc.abstractmethod
    def slots(self) -> int:
        """How many trials can run at once."""

    @abc.abstractmethod
    def submit(self, task: TrialTask, priority: bool = False) -> Handle:
        """Start ``task`` (or queue it) and return a handle. A ``priority``
        task goes ahead of queued ones: the segment a scheduling policy chose."""

    @abc.abstractmethod
    def wait(self, handles: Sequence[Handle], timeout: float) -> list[Handle]:
        """Block up to ``timeout`` s; return the handles known to be finished."""

    @abc.abstractmethod
    def settle(self, handle: Handle) -> None:
        """Gather a finished task: raise if the task itself failed (not the
        trial: user errors are records), and release what the engine holds."""

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Cancel a task that has not started yet."""

    def shutdown(self) -> None:
        """Release what :meth:`start` acquired."""
