"""A read-only snapshot of a study's store, and the reader that keeps it fresh.

Everything the dashboard and the report draw comes from one :class:`Snapshot`:
the trials as :class:`TrialView` (a :class:`~hpo.results.TrialRecord` plus the
run-record facts the views need: process, slots, earlier attempts, reported
steps). :class:`StoreReader` opens the store without ever writing to it and
re-reads it only when it changed; trials that finished are immutable in an
Optuna storage, so their views are built once and reused on every refresh,
which keeps a live refresh of a 100,000-trial study cheap.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import optuna

from hpo.results import StudyResult, TrialRecord, record_fields
from hpo.store import RunDir, StudyStore, gc_paused, is_placeholder, records_read
from hpo.store.records import allocations_of, grouped_attrs, run_of

__all__ = ["TrialView", "Snapshot", "StoreReader", "load_snapshot", "VIEWS_EVERY"]

# Journal records a reader replays beyond its views snapshot before it writes
# a new one (journal.log.views, dashboards/view_cache.py); writing 100,000
# trials' views takes a few seconds, replaying 20,000 records about one.
VIEWS_EVERY = 20_000


@dataclass(frozen=True)
class TrialView(TrialRecord):
    """A trial as the views need it; ``reports`` are ``(step, {metric: value})``
    in step order (the dicts are shared with the storage, never modified)."""

    pid: int | None = None
    cpus: int = 1
    gpus: int = 0
    previous: tuple[Mapping[str, Any], ...] = ()
    reports: tuple[tuple[int, dict[str, float]], ...] = ()
    stop_reason: str | None = None
    attempt_started_at: float | None = None
    # Its shape: GPUs (a share of one below 1) on each of its nodes; and each
    # allocation the master gave it (records.allocations_of), in order.
    gpu_count: float = 0
    nodes: int = 1
    allocations: tuple[dict[str, Any], ...] = ()
    # The parameters' Optuna distributions (shared with the storage), for the
    # importance evaluators.
    distributions: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # What the user's own code (objective, sampler) set on the trial, hpo's keys left out.
    user_attrs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_frozen(cls, trial: optuna.trial.FrozenTrial) -> TrialView:
        reports, events, segments = grouped_attrs(trial)
        run = run_of(trial)
        gpus = run.get("gpus")
        return cls(
            **record_fields(trial, len(reports), events, segments),
            pid=run.get("pid"), cpus=int(run.get("cpus") or 1),
            gpus=len(gpus) if isinstance(gpus, list) else int(gpus or 0),
            previous=tuple(p for p in run.get("previous") or () if isinstance(p, dict)),
            reports=tuple(reports), distributions=trial.distributions,
            stop_reason=run.get("stop_reason"),
            attempt_started_at=run.get("attempt_started_at"),
            gpu_count=float(run.get("gpu_count") or (len(gpus) if isinstance(gpus, list) else 0)),
            nodes=int(run.get("nodes") or 1), allocations=tuple(allocations_of(trial)),
            user_attrs=users_own(trial.user_attrs),
        )

    @property
    def worker(self) -> str:
        """Where the trial (its last attempt) ran: ``host:pid``."""
        return worker_label(self.host, self.pid)


def users_own(attrs: dict[str, Any]) -> dict[str, Any]:
    """User attributes without hpo's (stores written before they moved kept them there)."""
    return {k: v for k, v in attrs.items() if not k.startswith("hpo:")}


def worker_label(host: str | None, pid: Any, worker: Any = None) -> str:
    """One timeline row: a named worker, else the process on its host."""
    if worker not in (None, ""):
        return str(worker)
    return f"{host or '?'}:{pid}" if pid is not None else (host or "?")


# eq=False: hashed by identity, so views can be memoised per snapshot.
@dataclass(frozen=True, eq=False)
class Snapshot:
    """The study at one moment: settings from ``study.json`` and every trial."""

    run_dir: str
    name: str
    metric: str
    direction: Literal["maximize", "minimize"]
    trials: tuple[TrialView, ...]
    taken_at: float
    # Slots the study may use at once (search.parallel), when set.
    slots: int | None = None
    stop: dict[str, Any] | None = None
    version: str = ""
    spec: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: ``(metric, direction)`` of each objective of a multi-objective study; else empty.
    objectives: tuple[tuple[str, Literal["maximize", "minimize"]], ...] = ()
    #: The study's user attributes (hpo's own left out).
    user_attrs: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def result(self) -> StudyResult:
        """The same ranking, counts and cost as ``hpo status``."""
        return StudyResult(self.name, self.metric, self.direction, list(self.trials), self.stop,
                           objectives=list(self.objectives))

    @cached_property
    def ranked(self) -> list[TrialView]:
        # The result ranks the TrialViews it was given: the same objects come back.
        return self.result.ranked()  # type: ignore[return-value]

    @cached_property
    def by_number(self) -> dict[int, TrialView]:
        return {t.number: t for t in self.trials}

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    @cached_property
    def param_names(self) -> list[str]:
        names = dict.fromkeys(self.spec.get("space") or {})
        for trial in self.trials:
            names.update(dict.fromkeys(trial.params))
        return list(names)


class StoreReader:
    """Reads one run directory's store, read-only, re-reading only when it changed.

    The journal is read with Optuna's own replay (the format stays Optuna's
    business), and the storage object is kept, so each refresh reads only the
    lines appended since the last one. Thread-safe: Dash serves callbacks from
    several threads.
    """

    def __init__(self, run_dir: str | Path, write_views: bool = True,
                 views_later_s: float | None = None, read_now: bool = True) -> None:
        self.run_dir = RunDir(Path(run_dir))
        info = self.run_dir.read()  # UsageError naming the fix when this is no run directory
        self.spec: dict[str, Any] = info.get("spec") or {}
        self._files = self.run_dir.store_files()
        url = self.run_dir.storage_url()
        self._journal = None if "://" in url else url
        self._write_views = write_views and self._journal is not None
        # None: write the views snapshot inside snapshot(); else in a thread this
        # many seconds later (the dashboard serves its first view first).
        self._views_later_s = views_later_s
        self._pending = False  # a write is scheduled
        self._writing = False  # ... and under way: readers take the last snapshot meanwhile
        self._lock = threading.Lock()
        self._views: dict[int, tuple[optuna.trial.FrozenTrial, TrialView]] = {}
        # Views of the trials the views snapshot holds (finished there), by number.
        self._finished: dict[int, TrialView] = {}
        self._views_at = 0  # the journal record the views snapshot stands at
        # read_now=False: the store is read by the first snapshot() (the
        # dashboard serves its page meanwhile; callbacks wait for the read).
        self._store: StudyStore | None = None
        if read_now:
            self._opened()
        self._snapshot: Snapshot | None = None
        self._signature: tuple | None = None

    def _opened(self) -> StudyStore:
        if self._store is None:
            with gc_paused():
                self._store = self._open()
        return self._store

    def _open(self) -> StudyStore:
        """The store read-only, from the views snapshot when one matches."""
        from hpo.dashboards import view_cache  # it builds on TrialView, defined here

        cached = view_cache.load(self._journal) if self._journal else None
        if cached is None:
            return self.run_dir.open_store(read_only=True)
        seed, self._finished = cached
        self._views_at = seed[0].records
        return self.run_dir.open_store(read_only=True, seed=seed)

    def signature(self) -> tuple:
        """Changes whenever the store may have changed (size and mtime of its files)."""
        if not self._files:  # a database server: no cheap change test, re-read every time
            return ("now", time.time())
        return tuple((f, s.st_size, s.st_mtime_ns) for f in self._files if (s := _stat(f)) is not None)

    def snapshot(self) -> Snapshot:
        """The current snapshot; the cached one when the store has not changed."""
        if self._writing and self._snapshot is not None:
            return self._snapshot  # a views snapshot is being written: this one is still right
        with self._lock:
            self._opened()
            signature = self.signature()
            if self._snapshot is None or signature != self._signature:
                with gc_paused():
                    fresh = self._read()
                    if self._views_due():
                        self._views_now_or_later(fresh)
                # Same content (a database re-read, a touched file): keep the old
                # snapshot, and with it every view already drawn from it.
                if self._snapshot is None or fresh.version != self._snapshot.version:
                    self._snapshot = fresh
                self._signature = signature
            return self._snapshot

    def write_views_snapshot(self) -> bool:
        """Write the views snapshot of the store as read now; False when it
        could not be written (a database store, a read-only directory)."""
        with self._lock:
            self._opened()
            snap = self._snapshot if self._snapshot is not None else self._read()
            return self._journal is not None and self._save_views(snap)

    def _views_now_or_later(self, snap: Snapshot) -> None:
        if self._views_later_s is None:
            self._save_views(snap)
        elif not self._pending:
            self._pending = True
            timer = threading.Timer(self._views_later_s, self._save_views_later)
            timer.daemon = True  # Ctrl-C must not wait for it: the snapshot is optional
            timer.start()

    def _save_views_later(self) -> None:
        try:
            with self._lock, gc_paused():
                self._writing = True
                if self._snapshot is not None and self._views_due():
                    self._save_views(self._snapshot)
        finally:
            self._writing = self._pending = False

    def _save_views(self, snap: Snapshot) -> bool:
        from hpo.dashboards import view_cache  # it builds on TrialView, defined here

        if self._journal is None or self._store is None:
            raise RuntimeError("hpo internal error: _views_due() said so")

        if view_cache.save(self._journal, self._store, list(snap.trials)):
            self._views_at = records_read(self._store.storage)[0]
            return True
        return False

    def _views_due(self) -> bool:
        """Whether many records came after the views snapshot (geometrically
        more as the study grows, so that writing stays in proportion)."""
        if self._store is None:
            raise RuntimeError("hpo internal error: a snapshot was read")
        total, _ = records_read(self._store.storage)
        return self._write_views and total - self._views_at >= max(VIEWS_EVERY, self._views_at // 2)

    def outline(self) -> Snapshot:
        """The study as its settings describe it, with no trial: what the page's
        frame (title, tabs, columns) needs, known before the store is read."""
        metrics = _metrics_of(self.spec)
        return self._snapshot_of([], metrics[0].get("direction", "maximize"), None)

    def _read(self) -> Snapshot:
        store = self._store
        if store is None:
            raise RuntimeError("hpo internal error: opened first (snapshot(), write_views_snapshot())")
        # A trial's number is its place in the study; a placeholder stands for
        # a finished trial whose view came with the views snapshot.
        views = [self._finished[n] if is_placeholder(t) else self._view(t)
                 for n, t in enumerate(store.trials())]
        attrs = users_own(store.storage.get_study_user_attrs(store.study_id))
        return self._snapshot_of(views, "maximize" if store.maximize else "minimize", store.stop(), attrs)

    def _snapshot_of(self, views: list[TrialView], direction: Literal["maximize", "minimize"],
                     stop: dict[str, Any] | None, user_attrs: dict[str, Any] | None = None) -> Snapshot:
        spec = self.spec
        metrics = _metrics_of(spec)
        return Snapshot(
            run_dir=str(self.run_dir.path), name=spec.get("name", self.run_dir.path.name),
            metric=metrics[0].get("name", "value"),
            objectives=tuple((m["name"], m.get("direction", "maximize")) for m in metrics)
            if len(metrics) > 1 else (),
            direction=direction, trials=tuple(views), taken_at=time.time(),
            slots=(spec.get("search") or {}).get("parallel"),
            stop=stop, version=_version(views, user_attrs or {}), spec=spec, user_attrs=user_attrs or {},
        )

    def _view(self, trial: optuna.trial.FrozenTrial) -> TrialView:
        # The journal replaces a trial's object when the trial changes, and a
        # trial seen finished never changes again (Optuna refuses updates):
        # either way the view built then is still right.
        trial_id = StudyStore.trial_id(trial)
        cached = self._views.get(trial_id)
        if cached is not None and (cached[0] is trial or cached[0].state.is_finished()):
            return cached[1]
        view = TrialView.from_frozen(trial)
        self._views[trial_id] = (trial, view)
        return view


def _metrics_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's objectives: its "metric" object, or its list of them."""
    metric: Any = spec.get("metric") or {}  # as the space file has it
    return metric if isinstance(metric, list) and metric else [metric]


def _version(views: list[TrialView], user_attrs: dict[str, Any]) -> str:
    """Changes when anything a view draws changes (a trial, a step, an ending,
    a user attribute)."""
    content = hash((tuple((v.number, v.state, v.value, v.steps, v.attempt, v.ended_at,
                           len(v.events), len(v.segments), len(v.user_attrs)) for v in views),
                    repr(sorted(user_attrs.items()))))
    return f"{len(views)}:{content & 0xFFFFFFFF:08x}"


def load_snapshot(run_dir: str | Path) -> Snapshot:
    """One snapshot of ``run_dir`` (for the report and tests)."""
    return StoreReader(run_dir).snapshot()


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
