"""Heartbeats: a running attempt says it is alive every ``heartbeat_s()`` of
its master (the period travels with its task: a worker's own environment may
say otherwise), so that the master can tell a trial still running elsewhere
from a lost one.

The master judges silence by the time it was awake to hear: a master that
was itself stopped (SIGSTOP, Ctrl-Z then fg, swapping, a stalled file
system) heard nothing while it slept, its relay and its embedded Dask
scheduler included, and counts silence only from when it woke
(:func:`note_awake`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import optuna

from hpo.store import TrialLink
from hpo.store.records import TrialStatus, last_sign_of_life, status_of

__all__ = ["beating", "heartbeat_s", "fell_silent", "SILENT_HEARTBEATS", "silence_s", "note_awake", "Awake"]

# Heartbeats a started trial may miss before it counts as lost.
SILENT_HEARTBEATS = 3


def heartbeat_s() -> float:
    """Seconds between heartbeats (``HPO_HEARTBEAT_S``, default 10)."""
    return float(os.environ.get("HPO_HEARTBEAT_S", "10"))


def silence_s() -> float:
    """Seconds of silence after which a started trial counts as lost."""
    return SILENT_HEARTBEATS * heartbeat_s()


def fell_silent(trial: optuna.trial.FrozenTrial, heard_until: float | None = None) -> bool:
    """Whether a started trial missed ``SILENT_HEARTBEATS`` heartbeats while
    this process was awake to hear them (or was given up): its worker or
    master is gone, and nothing will finish it. ``heard_until`` (wall
    clock, default now): the time up to which the store reading it holds
    every heartbeat sent (the relay's :meth:`~hpo.store.StudyRelay.heard_until`)."""
    if status_of(trial) is not TrialStatus.RUNNING:
        return False
    seen = last_sign_of_life(trial)
    if not seen:  # given up: nothing to wait for
        return True
    heard = time.time() if heard_until is None else heard_until
    return heard - max(seen, _awake.since) >= silence_s()


class Awake:
    """When its owner last looked at its trials (monotonic), and since when
    it has been awake (wall clock, 0.0: it never slept). A gap between two
    looks far above how often the owner looks (``looks_every_s``), and
    longer than a heartbeat, is sleep: a stopped process stops every study
    it runs."""

    def __init__(self, looks_every_s: float) -> None:
        self.looks_every_s = looks_every_s
        self.looked: float | None = None
        self.since = 0.0

    def note(self) -> float:
        """Its owner looks now; since when (wall clock) it has been awake."""
        now = time.monotonic()
        if self.looked is not None and now - self.looked > max(heartbeat_s(), 2 * self.looks_every_s):
            self.since = time.time()
        self.looked = now
        return self.since


# The master's loop looks at least twice a second (hpo.master waits half a
# second at most).
_awake = Awake(looks_every_s=0.5)


def awake_since() -> float:
    """Since when (wall clock) the master's loop has seen this process awake
    (0.0: it never slept), without looking now."""
    return _awake.since


def note_awake() -> float:
    """The master looks at its trials now: if it slept, silence counts from
    now. Since when (wall clock) it has been awake."""
    return _awake.note()


@contextmanager
def beating(link: TrialLink, period_s: float) -> Iterator[None]:
    """Beat for the attempt of ``link`` every ``period_s`` while the block
    runs (its start record counts as the first beat). No beat is written
    after the block."""
    pulse = _Pulse.here()
    beat = _Beat(link, period_s)
    pulse.add(beat)
    try:
        yield
    finally:
        pulse.remove(beat)


class _Beat:
    __slots__ = ("link", "period_s", "due")

    def __init__(self, link: TrialLink, period_s: float) -> None:
        self.link, self.period_s, self.due = link, period_s, time.monotonic() + period_s


class _Pulse:
    """The one thread of a process that writes the heartbeats of the attempts
    it runs (a thread per trial cost each trial its start-up)."""

    _here: _Pulse | None = None
    _making = threading.Lock()

    @classmethod
    def here(cls) -> _Pulse:
        with cls._making:
            if cls._here is None or cls._here._pid != os.getpid():  # a forked child starts its own
                cls._here = cls()
            return cls._here

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._changed = threading.Condition()
        self._beats: list[_Beat] = []
        self._writing: _Beat | None = None
        threading.Thread(target=self._serve, name="hpo-heartbeat", daemon=True).start()

    def add(self, beat: _Beat) -> None:
        with self._changed:
            self._beats.append(beat)
            self._changed.notify_all()

    def remove(self, beat: _Beat) -> None:
        """Stop beating for ``beat`` once a beat under way for it is written."""
        with self._changed:
            try:
                while self._writing is beat:
                    self._changed.wait()
            finally:  # even when the runtime interrupts the wait: never beat for it again
                self._beats.remove(beat)

    def _serve(self) -> None:
        with self._changed:
            while True:
                beat = self._next()
                if beat is None:
                    continue
                beat.due = time.monotonic() + beat.period_s
                self._writing = beat
                self._changed.release()
                try:
                    beat.link.beat(time.time())
                except Exception:
                    pass  # a store hiccup must not end the trial; a halt shows at its next report
                finally:
                    self._changed.acquire()
                    self._writing = None
                    self._changed.notify_all()

    def _next(self) -> _Beat | None:
        """The attempt whose beat is due; else wait until one is."""
        now = time.monotonic()
        due = min(self._beats, key=lambda b: b.due, default=None)
        if due is not None and due.due <= now:
            return due
        self._changed.wait(None if due is None else due.due - now)
        return None
