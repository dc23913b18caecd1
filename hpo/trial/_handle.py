"""The handle an objective receives: ``train(config, trial)``."""

from __future__ import annotations

import json
import math
import os
import pickle
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from hpo.data import DataPaths, SourcePaths, StagingError, UnknownDataItem
from hpo.store import Halted, TrialLink, write_atomically
from hpo.store.records import PROFILE_ATTR, event_key, event_record
from hpo.trial._clock import clock
from hpo.trial._local_stop import suspend_requested
from hpo.trial._quantum import QuantumClock

__all__ = ["Trial"]

# FLEET averages the last 20 of at most 48 profiled batches.
_AVERAGED = 20
# In a trial's folder: the reports an attempt made that the store refused.
UNSTORED_REPORTS = "hpo-unstored-reports.json"


@dataclass
class _StoreSide:
    """Where a trial's reports go, and where its stop decisions come from:
    the attempt's link to the store, whose answers carry the master's
    decisions (the study's stop, the pruner's verdict, a resize, the
    contender of a time-shared slot).

    Every decision is written on the trial as an event before it takes effect,
    so the dashboard (and a user reading the store) can see why a trial stopped.
    """

    link: TrialLink
    metric: str
    early_stopping: dict[str, Any] | None = None
    direction: str = "maximize"
    # Time-shared scheduling: when this run may yield its slot; None: run to the end.
    quantum: QuantumClock | None = None
    # Rate allocation: the master may grow the trial onto more GPUs from its checkpoint.
    resizable: bool = False
    # The relay refused this attempt (its trial ended, or another attempt took it over).
    halted: Halted | None = None
    # Reports the store refused once the attempt was halted, for the next
    # attempt to send (hpo.trial: kept in the trial's folder).
    unstored: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    folder: Path | None = None  # the trial's folder, where they wait
    _reported: int = 0

    def _keep_unstored(self, step: int, metrics: dict[str, float]) -> None:
        self.unstored.append((step, metrics))
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)  # made only once something is kept
            write_atomically(self.folder / UNSTORED_REPORTS, json.dumps(self.unstored))
        except OSError:  # the disk that refused the report may refuse this too
            pass

    def send_unstored(self, stored: set[int]) -> list[tuple[int, dict[str, float]]]:
        """Send the reports an earlier attempt could not store (its master
        was gone, its store full) and the store still lacks; those sent."""
        path = self.folder / UNSTORED_REPORTS if self.folder else None
        if path is None or not path.exists():
            return []
        try:
            kept = [(int(step), dict(metrics)) for step, metrics in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            kept = []
        sent = []
        for step, metrics in kept:
            if step not in stored:
                self.link.report(step, metrics, metrics.get(self.metric))
                sent.append((step, metrics))
        path.unlink(missing_ok=True)
        return sent

    def report(self, step: int, metrics: dict[str, float], earlier_last: int | None = None) -> None:
        # Each call is durable (fsync'd) before it returns: durable when acknowledged.
        if self._reported == 0 and self.quantum and earlier_last is not None \
                and step <= earlier_last:
            # The objective started over instead of resuming from its checkpoint:
            # suspending it again would repeat the same segment for ever.
            self.quantum = None
            self.record("unresumable", step, f"started again at step {step} after step "
                        f"{earlier_last} instead of resuming; runs to its end in this segment "
                        "(resume from trial.load_checkpoint() or trial.next_step)")
        if self.halted is not None:  # durable when it returns: nothing is stored any more
            self._keep_unstored(step, metrics)
            raise self.halted
        try:
            self.link.report(step, metrics, metrics.get(self.metric))
        except Halted as halted:
            self.halted = halted
            self._keep_unstored(step, metrics)
            raise
        self._reported += 1
        if self.quantum:
            value = metrics.get(self.metric)
            self.quantum.add(None if value is None else (-value if self.direction == "maximize" else value))

    def stop_reason(self, reports: list[tuple[int, dict[str, float]]]) -> str | None:
        """"stopped: <study reason>", "pruned", "patience", "suspended",
        "halted" or None."""
        if self.halted is not None:
            return "halted"
        step = reports[-1][0] if reports else None
        signalled = suspend_requested()
        if signalled:  # this worker is leaving (SIGTERM); the next run goes on
            self.record("suspended", step, f"its worker was asked to stop ({signalled}); "
                        "it resumes on the next run from its last checkpoint, if it saves one")
            return "suspended"
        try:
            decision = self.link.poll()
        except Halted as halted:
            self.halted = halted
            return "halted"
        stop = decision.stop
        if stop and stop.get("resume"):  # the master is leaving; the next run goes on
            self.record("suspended", step, f"the master was asked to stop ({stop['reason']}); "
                        "it resumes on the next run from its last checkpoint, if it saves one")
            return "suspended"
        if stop:
            self.record("stopped", step, f"the study stopped: {_describe_stop(stop)}")
            return f"stopped: {stop['reason']}"
        if self.resizable and decision.resize is not None:
            self.record("suspended", step, f"the rate allocation grows it to {decision.resize} "
                        "GPU(s); it resumes on them from its last checkpoint")
            return "suspended"
        if decision.prune:
            self.record("pruned", step, decision.prune)
            return "pruned"
        stalled = self._stalled(reports)
        if stalled:
            self.record("stopped", step, stalled)
            return "patience"
        if self.quantum and self.quantum.due():
            yielding = self.quantum.end(lambda: decision.contender)
            if yielding:
                self.record("suspended", step, yielding)
                return "suspended"
        return None

    def record(self, kind: str, step: int | None, reason: str) -> None:
        if self.halted is not None:
            return
        event = event_record(kind, step, reason, socket.gethostname())
        try:
            self.link.event(event_key(time.time_ns(), os.getpid()), event)
        except Halted as halted:
            self.halted = halted

    def record_profile(self, profile: dict[str, Any]) -> None:
        self.link.note(f"{PROFILE_ATTR}{profile['gpu_count']:g}", profile)

    def _stalled(self, reports: list[tuple[int, dict[str, float]]]) -> str | None:
        """Why the trial should stop for lack of progress, if it should."""
        patience = (self.early_stopping or {}).get("patience")
        values = [(s, m[self.metric]) for s, m in reports if self.metric in m]
        if not patience or len(values) <= patience:
            return None
        sign = 1.0 if self.direction == "maximize" else -1.0
        delta = float((self.early_stopping or {}).get("min_delta") or 0.0)
        best_step, best = max(values[:-patience], key=lambda sv: sign * sv[1])
        if any(sign * (v - best) > delta for _, v in values[-patience:]):
            return None
        return (f"patience: {self.metric} did not improve on {best:.4g} (step {best_step}) "
                f"by more than {delta:g} in {patience} reports")


def _describe_stop(stop: dict[str, Any]) -> str:
    if stop.get("reason") == "target":
        return f"target reached by trial {stop.get('trial')} ({stop.get('value')})"
    return str(stop.get("reason"))


class Trial:
    """One evaluation of the objective, as the objective sees it.

    Parameters
    ----------
    number:
        The trial's number in its study.
    config:
        The configuration to evaluate (searched parameters and fixed values).
    checkpoint_dir:
        Per-trial directory on shared storage; a retried or resumed trial finds
        its last checkpoint there. It is made when the objective first asks
        for ``trial.checkpoint_dir`` (a trial that keeps nothing leaves none).
    cpus, gpus:
        What the engine assigned: a CPU count and the GPU ids.
    hosts:
        The trial's nodes in rank order (one for a one-node trial): start
        ``MultiWorkerMirroredStrategy`` or ``torch.distributed`` from them.
    gpu_share:
        The share of each GPU the trial may use (1.0 unless GPUs are shared);
        also in ``HPO_GPU_MEMORY_FRACTION`` for frameworks' memory limits.
    rank:
        The process's rank in a distributed trial (hpo sets it; 0 by hand).
    profile_batches:
        How many first batches :meth:`batch` times before recording the
        training rate (FLEET: 48, the last 20 averaged); 0: none.
    data:
        The data items :meth:`data_path` knows: a trial of a study gets the
        space's ``data`` section (staged on its node); a Trial built by hand
        takes ``{name: path}`` and returns the paths unchanged.

    ``reports`` holds every report of the trial, including those of earlier
    segments or attempts when the trial resumes.

    Examples
    --------
    A trial detached from any study records reports in memory, which is handy
    to try an objective by hand:

    >>> trial = Trial(0, {"lr": 0.1})
    >>> trial.report(0, val_accuracy=0.5)
    >>> trial.reports
    [(0, {'val_accuracy': 0.5})]
    >>> trial.should_stop()
    False
    """

    def __init__(
        self,
        number: int,
        config: dict[str, Any],
        checkpoint_dir: str | Path | None = None,
        *,
        cpus: int = 1,
        gpus: list[str] | None = None,
        reports: list[tuple[int, dict[str, float]]] | None = None,
        hosts: list[str] | None = None,
        gpu_share: float = 1.0,
        profile_batches: int = 0,
        rank: int = 0,
        data: Mapping[str, str | os.PathLike[str]] | DataPaths | None = None,
        _link: _StoreSide | None = None,
    ) -> None:
        self.number = number
        self.config = config
        self._checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._checkpoint_dir_made = False
        self.cpus = cpus
        self.gpus = list(gpus or [])
        self.reports: list[tuple[int, dict[str, float]]] = list(reports or [])
        self._earlier_last = self.reports[-1][0] if self.reports else None
        if _link is not None and self._checkpoint_dir is not None:
            _link.folder = self._checkpoint_dir
            sent = _link.send_unstored({step for step, _ in self.reports})
            self.reports = sorted(self.reports + sent, key=lambda report: report[0])
        self.stop_reason: str | None = None
        self.hosts = list(hosts or [socket.gethostname()])
        self.gpu_share = gpu_share
        self.profile_batches = profile_batches
        self.profile: dict[str, Any] | None = None
        self._batch_ends: list[float] = []
        self._batch_samples: int | None = None
        self._link = _link
        self._data = data if isinstance(data, DataPaths) else SourcePaths(data or {})
        self._data_paths: dict[str, Path] = {}
        #: Why staging failed, if it did: the node's fault, whatever the objective made of it.
        self.staging_fault: StagingError | None = None
        self._rank = rank

    @property
    def rank(self) -> int:
        """This process's global rank in a distributed trial (0: the one hpo
        started, which reports and decides; the others are followers whose
        reports stay in this process and whose ``should_stop`` is False)."""
        return self._rank

    def batch(self, samples: int | None = None) -> None:
        """Call after each training batch of ``samples`` samples: the first
        ``profile_batches`` are timed and the training rate is recorded (the
        rate allocation extrapolates it to other GPU counts). Cheap after that.
        ``hpo.keras.HpoCallback`` calls it for Keras models."""
        if self.profile is not None or not self.profile_batches:
            return
        self._batch_ends.append(time.perf_counter())
        self._batch_samples = samples
        if len(self._batch_ends) > self.profile_batches:  # that many durations timed
            self._record_profile()

    def _record_profile(self) -> None:
        """Record the rate of the batches timed so far (a trial shorter than
        its profile is profiled on what it ran)."""
        ends, samples = self._batch_ends, self._batch_samples
        if self.profile is not None or len(ends) < 2:
            return
        last = [b - a for a, b in zip(ends, ends[1:])][-_AVERAGED:]
        per_batch = max(sum(last) / len(last), 1e-9)
        self.profile = {"batches": len(ends) - 1, "averaged": len(last), "batch_s": per_batch,
                        "rate": (samples or 1) / per_batch,
                        "unit": "samples/s" if samples else "batches/s",
                        "gpus": self.gpus, "gpu_share": self.gpu_share, "at": time.time(),
                        # when its first batch ended: from its start, what a restart costs
                        "first_batch_at": time.time() - (time.perf_counter() - ends[0]),
                        "gpu_count": self.gpu_share if self.gpu_share < 1 else len(self.gpus)}
        if self._link:
            try:
                self._link.record_profile(self.profile)
            except Exception:  # advisory (the allocation falls back on its model): never the trial's end
                pass

    def report(self, step: int, **metrics: float) -> None:
        """Record the metrics of one step (an epoch, an iteration) durably:
        stored when it returns.

        Raises
        ------
        TypeError
            If ``step`` is not a non-negative int or a metric is not a real number.
        hpo.store.Halted
            If the store did not take the report: the study's store cannot be
            written, another master took the study over, or another attempt
            runs the trial. The objective must end (let it propagate): hpo
            resumes the trial from its checkpoint, and the next attempt sends
            the report again.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TypeError(f"trial.report: step must be an int >= 0, got {step!r}")
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"trial.report: metric {name!r} must be a number, got {value!r}")
            clean[name] = float(value)
        finite = {k: v for k, v in clean.items() if math.isfinite(v)}
        if self._link:
            self._link.report(step, finite, self._earlier_last)
        self.reports.append((step, clean))

    def should_stop(self) -> bool:
        """True when the objective should return now with its best result so far.

        That happens when the study stops (its target was reached or its time
        budget ran out), a pruner finds this trial hopeless, the metric stopped
        improving (``patience``), or the trial's segment is done: then the
        objective must have saved a checkpoint (``save_checkpoint``, or Keras's
        ``HpoCallback``) and the trial resumes from it later.
        """
        if self.stop_reason is None and self._link is not None:
            self.stop_reason = self._link.stop_reason(self.reports)
        return self.stop_reason is not None

    def data_path(self, name: str) -> Path:
        """The path of the data item ``name`` (the space's ``data.items``),
        as this trial reads it: the node's local copy, made by the node's
        first trial that asks (the others wait for that one copy).

        Raises
        ------
        hpo.data.UnknownDataItem
            (a KeyError) if ``name`` is not an item; it names those there are.
        hpo.data.StagingError
            (an OSError) if the node cannot make the copy (no room, no
            staging folder, the source unreadable there). The node's fault:
            the trial is handed back, not failed.

        Examples
        --------
        A Trial built by hand reads the sources where they are:

        >>> Trial(0, {}, data={"digits": "/shared/digits.npz"}).data_path("digits")
        PosixPath('/shared/digits.npz')
        """
        if name not in self._data.names:
            raise UnknownDataItem(name, self._data.names)
        if name not in self._data_paths:  # staged (or checked) once per trial
            try:
                self._data_paths[name] = self._data.path(name)
            except StagingError as fault:
                self.staging_fault = fault
                raise
        return self._data_paths[name]

    def elapse(self, seconds: float) -> None:
        """Spend ``seconds`` of this trial's time: a sleep in a real run, and
        simulated time on :class:`hpo.engines.SimulatedEngine`. For objectives
        that replay curves (a surrogate, an earlier study's reports) with what
        each step cost."""
        if isinstance(seconds, bool) or not isinstance(seconds, Real) or not seconds >= 0:
            raise TypeError(f"trial.elapse: seconds must be a number >= 0, got {seconds!r}")
        clock().sleep(float(seconds))

    @property
    def next_step(self) -> int:
        """The step after the last one reported: where a resumed trial goes on."""
        return self.reports[-1][0] + 1 if self.reports else 0

    @property
    def checkpoint_dir(self) -> Path | None:
        """The trial's folder, made at the first ask: a folder made per trial
        is most of a short trial's own cost, and a round trip to the metadata
        server of a shared file system."""
        if self._checkpoint_dir is not None and not self._checkpoint_dir_made:
            self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
            self._checkpoint_dir_made = True
        return self._checkpoint_dir

    def save_checkpoint(self, state: Any, name: str = "state.pkl") -> None:
        """Pickle ``state`` into ``checkpoint_dir``, atomically (a crash leaves the old one)."""
        path = self._checkpoint_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.checkpoint_timer("save"):
            write_atomically(path, pickle.dumps(state))

    def load_checkpoint(self, name: str = "state.pkl") -> Any:
        """What ``save_checkpoint`` saved last, or None for a fresh trial."""
        path = self._checkpoint_path(name)
        if not path.exists():
            return None
        with self.checkpoint_timer("restore"):
            return pickle.loads(path.read_bytes())

    @contextmanager
    def checkpoint_timer(self, kind: str) -> Iterator[None]:
        """Time a checkpoint "save" or "restore" done by other means (Keras's
        callback uses it): the scheduler keeps quanta long enough for it."""
        started = time.perf_counter()
        try:
            yield
        finally:
            clock = self._link.quantum if self._link else None
            if clock is not None:
                clock.add_checkpoint_time(kind, time.perf_counter() - started)

    def _checkpoint_path(self, name: str) -> Path:
        if self.checkpoint_dir is None:
            raise RuntimeError("this trial has no checkpoint_dir; pass one to Trial(...)")
        return self.checkpoint_dir / name

    def __repr__(self) -> str:
        return f"Trial(number={self.number}, config={self.config!r})"
