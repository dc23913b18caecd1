"""The relay's ledger: what it knows of a study's trials to fence and answer
the requests of their attempts, kept as records go by.

The journal ledger follows every record of the journal in file order (the
master's replay, the relay's own rounds, appends other processes made to the
file directly), keeping only what the relay needs: which trials are ours,
the state, run record and heartbeat of each unfinished one, its reports and
segments (a resumed attempt gets those its task did not carry), and the
study's decisions (stop, contender, resizes). A finished trial leaves its
status and value behind. Its cost per record does not grow with the study.

A database store has no journal to follow: its ledger asks the database.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import optuna

from hpo.store._format import Op, op_of, study_attrs, trial_attrs
from hpo.store.records import (
    CONTENDER_ATTR,
    ENDED_BY_ATTR,
    HEARTBEAT_ATTR,
    REPORT_ATTR,
    RESIZE_ATTR,
    RUN_ATTR,
    SEGMENT_ATTR,
    STOP_ATTR,
    STUDY_DECISIONS,
    RunRecord,
    TrialStatus,
    attr_of,
    grouped_attrs,
    run_of,
    status_from,
    status_of,
    study_decisions,
)

__all__ = ["Pruning", "TrialView", "StudyView", "Ledger", "JournalLedger", "StorageLedger", "pruning_learnt"]

_State = optuna.trial.TrialState
_STUDY_FRESH_S = 0.2  # how stale a database ledger's view of the study's decisions may be


@runtime_checkable
class Pruning(Protocol):
    """The master's pruner as the relay uses it: statistics kept as reports
    and ends go by, and a decision per report (``hpo.master`` makes them).
    ``slow`` pruners are asked off the relay's thread."""

    slow: bool

    def observe(self, number: int, step: int, values: dict[int, float]) -> None:
        """Trial ``number`` reported ``step``; ``values`` are all its intermediate values."""

    def completed(self, number: int, values: dict[int, float]) -> None:
        """Trial ``number`` completed with these intermediate values."""

    def decide(self, trial_id: int, number: int, step: int, values: dict[int, float]) -> str | None:
        """Why the trial is hopeless after reporting ``step``, or None."""

    # Optional, for a master to open the study from the store's snapshot
    # (without them, a master with this pruner replays the whole journal):
    # ``learnt() -> bytes | None``, what observe() and completed() learnt so
    # far with the settings they learnt it under (None: they learn nothing),
    # and ``relearn(learnt)``, which knows it again.


def pruning_learnt(pruning: Pruning | None) -> bytes | None:
    """What ``pruning`` learnt from the records it was shown (b"" when it
    learns nothing from them, or there is none); None when it cannot say."""
    if pruning is None:
        return b""
    learnt = getattr(pruning, "learnt", None)
    if learnt is None:
        return None
    state = learnt()
    return b"" if state is None else state


@dataclass
class TrialView:
    """An unfinished trial of the study, as the relay needs it."""

    trial_id: int
    number: int
    run: RunRecord = field(default_factory=RunRecord)
    heartbeat: Any = None
    ended_by: Any = None
    values: dict[int, float] = field(default_factory=dict)
    reports: dict[int, dict[str, float]] = field(default_factory=dict)
    segments: dict[int, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class StudyView:
    """The study's decisions, as the master last wrote them."""

    stop: dict[str, Any] | None = None
    contender: float | None = None
    resize: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, decisions: dict[str, Any]) -> StudyView:
        """From :func:`hpo.store.records.study_decisions`."""
        contender = decisions.get(CONTENDER_ATTR)
        return cls(decisions.get(STOP_ATTR), None if contender is None else float(contender),
                   dict(decisions.get(RESIZE_ATTR) or {}))


class Ledger(abc.ABC):
    """What the relay asks about trials and the study."""

    def __init__(self, pruning: Pruning | None = None) -> None:
        self.pruning = pruning
        self.pruned: dict[int, str] = {}  # trial id -> why its pruner found it hopeless

    @abc.abstractmethod
    def live(self, trial_id: int) -> TrialView | None:
        """The unfinished trial ``trial_id`` of the study, or None."""

    @abc.abstractmethod
    def ended(self, trial_id: int) -> tuple[str, float | None] | None:
        """The status and value of the finished trial ``trial_id``, or None."""

    @abc.abstractmethod
    def study(self) -> StudyView:
        """The study's decisions."""

    @abc.abstractmethod
    def objectives(self) -> int | None:
        """How many values a trial of the study ends with (None: not known yet)."""

    def wrote(self, writes: list[tuple[str, int, Any, Any]]) -> None:
        """The relay made these writes (a database ledger learns from them;
        the journal's follows the records instead)."""

    def refused(self, trial_id: int) -> None:
        """The store refused a write to ``trial_id``: it ended meanwhile."""


_STUDY_ATTR_OPS = (Op.SET_STUDY_USER_ATTR, Op.SET_STUDY_SYSTEM_ATTR)
_TRIAL_OPS = frozenset({Op.SET_TRIAL_STATE_VALUES, Op.SET_TRIAL_INTERMEDIATE_VALUE,
                        Op.SET_TRIAL_USER_ATTR, Op.SET_TRIAL_SYSTEM_ATTR})


_DUMP = "journal-ledger-1"  # the layout of JournalLedger.dump()


def _no_study_attrs() -> dict[Op, dict[str, Any]]:
    return {op: {} for op in _STUDY_ATTR_OPS}


def _follow_attr(view: TrialView, key: str, value: Any) -> None:
    """A trial attribute written: what the view keeps of it."""
    if key == RUN_ATTR:
        run: RunRecord | None = value
        view.run = run or {}
    elif key == HEARTBEAT_ATTR:
        view.heartbeat = value
    elif key == ENDED_BY_ATTR:
        view.ended_by = value
    elif key.startswith(REPORT_ATTR) and isinstance(value, dict):
        view.reports[int(key[len(REPORT_ATTR):])] = value
    elif key.startswith(SEGMENT_ATTR) and isinstance(value, dict):
        view.segments[int(key[len(SEGMENT_ATTR):])] = value


class JournalLedger(Ledger):
    """The ledger of study ``study_name``, fed with :meth:`apply` every
    record of the journal in order, from the first."""

    def __init__(self, study_name: str, pruning: Pruning | None = None) -> None:
        super().__init__(pruning)
        self.study_name = study_name
        self._study_id: int | None = None
        self._studies: dict[str, int] = {}  # name -> id of the studies alive
        self._next_study = 0
        self._next_trial = 0
        self._numbers = 0  # trials of ours created so far
        self._live: dict[int, TrialView] = {}
        self._ended: dict[int, tuple[str, float | None]] = {}
        self._study = StudyView()
        self._objectives: int | None = None
        # The study's attributes the master decides, user (an earlier version's) and system.
        self._study_attrs = _no_study_attrs()
        self.followed = 0  # records followed, from the journal's first

    def live(self, trial_id: int) -> TrialView | None:
        return self._live.get(trial_id)

    def ended(self, trial_id: int) -> tuple[str, float | None] | None:
        return self._ended.get(trial_id)

    def study(self) -> StudyView:
        return self._study

    def objectives(self) -> int | None:
        return self._objectives

    def dump(self) -> tuple[Any, ...]:
        """What this ledger knows, as plain values (:mod:`marshal` holds them):
        for a snapshot of the journal at record :attr:`followed`. What its
        pruner learnt is the pruner's (:func:`pruning_learnt`)."""
        live = [(v.trial_id, v.number, v.run, v.heartbeat, v.ended_by, v.values, v.reports,
                 {step: dict(segment) for step, segment in v.segments.items()}) for v in self._live.values()]
        study = self._study
        return (_DUMP, self.study_name, self.followed, self._study_id, self._studies, self._next_study,
                self._next_trial, self._numbers, live, self._ended, (study.stop, study.contender, study.resize),
                self._objectives, {int(op): attrs for op, attrs in self._study_attrs.items()})

    def restore(self, dump: Any) -> None:
        """Know what :meth:`dump` gave (of a ledger of this study, with no
        record followed yet); ValueError, nothing changed, when it is not
        such a dump."""
        try:
            (kind, name, followed, study_id, studies, next_study, next_trial, numbers, live, ended,
             (stop, contender, resize), objectives, study_attrs) = dump
            views = {trial_id: TrialView(trial_id, number, run, heartbeat, ended_by, values, reports, segments)
                     for trial_id, number, run, heartbeat, ended_by, values, reports, segments in live}
            attrs = {op: study_attrs[int(op)] for op in _STUDY_ATTR_OPS}
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"not a ledger's dump ({exc})") from None
        if kind != _DUMP or name != self.study_name or self.followed:
            raise ValueError("a dump of another study's ledger, or of another version's")
        self.followed, self._study_id, self._studies = followed, study_id, studies
        self._next_study, self._next_trial, self._numbers = next_study, next_trial, numbers
        self._live, self._ended, self._objectives, self._study_attrs = views, ended, objectives, attrs
        self._study = StudyView(stop, contender, resize)

    def apply(self, record: dict[str, Any]) -> None:
        """Follow one journal record, as Optuna's replay would."""
        self.followed += 1
        op = op_of(record)
        if op in _TRIAL_OPS:  # first: nearly every record is one
            view = self._live.get(record["trial_id"])  # its fields were checked (FIELDS)
            if view is not None:
                self._update(view, op, record)
        elif op == Op.CREATE_TRIAL:
            self._create_trial(record)
        elif op == Op.CREATE_STUDY:
            self._create_study(record)
        elif op == Op.DELETE_STUDY:
            self._delete_study(record.get("study_id"))
        elif op in _STUDY_ATTR_OPS and self._study_id is not None and record.get("study_id") == self._study_id:
            self._study_attr(op, study_attrs(record))

    # -- inside ------------------------------------------------------------------------

    def _create_study(self, record: dict[str, Any]) -> None:
        name = record["study_name"]  # its fields were checked (FIELDS)
        if name in self._studies:
            return
        self._studies[name] = self._next_study
        if name == self.study_name:
            self._study_id = self._next_study
            self._study, self._study_attrs = StudyView(), _no_study_attrs()
            directions = record.get("directions")
            self._objectives = len(directions) if isinstance(directions, list) else None
        self._next_study += 1

    def _delete_study(self, study_id: Any) -> None:
        for name, known in list(self._studies.items()):
            if known == study_id:
                del self._studies[name]
                if known == self._study_id:
                    self._study_id = None

    def _create_trial(self, record: dict[str, Any]) -> None:
        study_id = record.get("study_id")
        if study_id not in self._studies.values():
            return  # Optuna's replay creates nothing either
        trial_id, self._next_trial = self._next_trial, self._next_trial + 1
        if study_id != self._study_id:
            return
        view = TrialView(trial_id, self._numbers)
        self._numbers += 1
        self._live[trial_id] = view
        for attrs in (record.get("user_attrs") or {}, record.get("system_attrs") or {}):
            for key, value in attrs.items():
                _follow_attr(view, key, value)
        view.values = {int(k): v for k, v in (record.get("intermediate_values") or {}).items()}
        state = _State(record.get("state", _State.RUNNING.value))
        if state.is_finished():
            self._finish(view, state, record.get("values") or (
                [record["value"]] if record.get("value") is not None else None))

    def _update(self, view: TrialView, op: Op, record: dict[str, Any]) -> None:
        if op == Op.SET_TRIAL_STATE_VALUES:
            state = _State(record["state"])
            if state.is_finished():
                self._finish(view, state, record.get("values"))
        elif op == Op.SET_TRIAL_INTERMEDIATE_VALUE:
            step = int(record["step"])
            view.values[step] = record["intermediate_value"]
            if self.pruning is not None:
                self.pruning.observe(view.number, step, view.values)
        else:
            for key, value in trial_attrs(record).items():
                _follow_attr(view, key, value)

    def _study_attr(self, op: Op, attrs: dict[str, Any]) -> None:
        ours = {key: value for key, value in attrs.items() if key in STUDY_DECISIONS}
        if ours:
            self._study_attrs[op].update(ours)
            self._study = StudyView.of(study_decisions(self._study_attrs[Op.SET_STUDY_USER_ATTR],
                                                       self._study_attrs[Op.SET_STUDY_SYSTEM_ATTR]))

    def _finish(self, view: TrialView, state: _State, values: list[float] | None) -> None:
        status = status_from(state, view.run, view.ended_by)
        self._ended[view.trial_id] = (status.value, values[0] if values else None)
        del self._live[view.trial_id]
        self.pruned.pop(view.trial_id, None)
        if state == _State.COMPLETE and self.pruning is not None:
            self.pruning.completed(view.number, view.values)


class StorageLedger(Ledger):
    """The ledger of study ``study_name`` in a database storage. A trial is
    read from the database when the relay first meets it, then followed
    through the writes the relay makes; an end the master wrote meanwhile
    shows when the database refuses the next write (:meth:`ended`). The
    study's decisions are read at most every 0.2 s."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str,
                 pruning: Pruning | None = None) -> None:
        super().__init__(pruning)
        self.storage, self.study_name = storage, study_name
        self._study: tuple[float, StudyView, int] | None = None
        # Counts the master's decisions: a view read while one was written is
        # not kept (its read may have begun before the write).
        self._decisions = 0
        self._objectives: int | None = None
        self._live: dict[int, TrialView] = {}
        self._ended: dict[int, tuple[str, float | None]] = {}
        if pruning is not None:
            self._learn_stored(pruning)

    def _study_id(self) -> int:
        return self.storage.get_study_id_from_name(self.study_name)

    def objectives(self) -> int | None:
        if self._objectives is None:
            try:
                self._objectives = len(self.storage.get_study_directions(self._study_id()))
            except KeyError:
                return None  # created later
        return self._objectives

    def _learn_stored(self, pruning: Pruning) -> None:
        try:
            trials = self.storage.get_all_trials(self._study_id(), deepcopy=False)
        except KeyError:
            return  # created later: nothing to learn
        for trial in trials:
            values = dict(trial.intermediate_values)
            for step in sorted(values):
                pruning.observe(trial.number, step, {s: v for s, v in values.items() if s <= step})
            if trial.state == _State.COMPLETE:
                pruning.completed(trial.number, values)

    def live(self, trial_id: int) -> TrialView | None:
        if trial_id in self._live or trial_id in self._ended:
            return self._live.get(trial_id)
        trial = self._trial(trial_id)
        if trial is None:
            return None
        if trial.state.is_finished():
            self._ended[trial_id] = (status_of(trial).value, trial.values[0] if trial.values else None)
            return None
        attrs = grouped_attrs(trial)
        view = TrialView(trial_id, trial.number, run_of(trial), attr_of(trial, HEARTBEAT_ATTR),
                         attr_of(trial, ENDED_BY_ATTR), dict(trial.intermediate_values),
                         dict(attrs.reports), {s.get("index", i): s for i, s in enumerate(attrs.segments)})
        self._live[trial_id] = view
        return view

    def ended(self, trial_id: int) -> tuple[str, float | None] | None:
        if trial_id not in self._ended:
            self.live(trial_id)
        return self._ended.get(trial_id)

    def refused(self, trial_id: int) -> None:
        """The database refused a write: the trial ended meanwhile (the master's end)."""
        self._live.pop(trial_id, None)
        self.pruned.pop(trial_id, None)
        self._ended.pop(trial_id, None)
        self.live(trial_id)

    def _trial(self, trial_id: int) -> optuna.trial.FrozenTrial | None:
        try:
            trial = self.storage.get_trial(trial_id)
            study_id = self._study_id()
            ours = self.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number) == trial_id
        except KeyError:
            return None
        return trial if ours else None

    def forget_study(self) -> None:
        """The master wrote a study decision: read them afresh next time."""
        self._decisions += 1  # only the master's thread writes it
        self._study = None

    def study(self) -> StudyView:
        cached, decisions = self._study, self._decisions
        if cached is not None and cached[2] == decisions and time.monotonic() - cached[0] < _STUDY_FRESH_S:
            return cached[1]
        try:
            study_id = self._study_id()
            view = StudyView.of(study_decisions(self.storage.get_study_user_attrs(study_id),
                                                self.storage.get_study_system_attrs(study_id)))
        except KeyError:
            view = StudyView()
        self._study = (time.monotonic(), view, decisions)
        return view

    def wrote(self, writes: list[tuple[str, int, Any, Any]]) -> None:
        for kind, trial_id, a, b in writes:
            view = self._live.get(trial_id)
            if view is None:
                continue
            if kind == "attr":
                _follow_attr(view, a, b)
            elif kind == "step":
                view.values[a] = b
                if self.pruning is not None:
                    self.pruning.observe(view.number, a, view.values)
            elif a.is_finished:
                self._ended[trial_id] = (a.value, b[0] if b else None)
                del self._live[trial_id]
                self.pruned.pop(trial_id, None)
                if a is TrialStatus.COMPLETE and self.pruning is not None:
                    self.pruning.completed(view.number, view.values)
