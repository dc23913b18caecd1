"""The trial's clock: real time, or the simulated time of the thread that
runs the trial (:class:`hpo.engines.SimulatedEngine`).

What a trial measures against time (its quantum, the time it spends in
:meth:`Trial.elapse`) reads this clock, never ``time`` directly, so the same
objective runs for real and on simulated time, and takes the same decisions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["Clock", "RealClock", "clock", "now", "using_clock"]


class Clock(Protocol):
    """What a trial asks of time."""

    def now(self) -> float:
        """Seconds, monotonic."""

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""


class RealClock:
    """The machine's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


_REAL = RealClock()
_local = threading.local()


def clock() -> Clock:
    """The clock of the trial this thread runs."""
    return getattr(_local, "clock", _REAL)


def now() -> float:
    """The time of the trial this thread runs, in seconds: simulated on the
    simulated engine, else :func:`time.monotonic`."""
    return clock().now()


@contextmanager
def using_clock(chosen: Clock) -> Iterator[None]:
    """Run the block's trial on ``chosen`` (this thread only)."""
    before = getattr(_local, "clock", None)
    _local.clock = chosen
    try:
        yield
    finally:
        if before is None:
            del _local.clock
        else:
            _local.clock = before
