"""One master per study: a lease file in the run directory.

Two masters on one study would each run the whole budget. The lease works
where fcntl locks are unreliable (NFS, GPFS) and across nodes: the file is
created with ``O_EXCL`` (atomic on NFSv3+ and GPFS), names its holder (host,
PID, SLURM job), and its holder renews it (its modification time) every
heartbeat. A lease not renewed for ``SILENT_HEARTBEATS`` heartbeats, or whose
holder process is gone from this host, is stale: the next master takes it over.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.store._files import PRIVATE_FILE, process_alive

__all__ = ["MasterLease", "StudyBusy", "LEASE_FILE"]

LEASE_FILE = "master.lease"
# Renewals a live master may miss before its lease counts as stale (as for a
# trial's heartbeat, hpo.trial.SILENT_HEARTBEATS).
_SILENT_RENEWALS = 3


class StudyBusy(UsageError):
    """Another master holds the study."""


class MasterLease:
    """The lease of the study in ``run_dir``; a context manager that holds it.

    ``beat_s`` is the renewal period (default: ``HPO_HEARTBEAT_S``, 10 s).
    """

    def __init__(self, run_dir: str | os.PathLike[str], beat_s: float | None = None) -> None:
        self.path = Path(run_dir) / LEASE_FILE
        self.beat_s = beat_s if beat_s is not None else float(os.environ.get("HPO_HEARTBEAT_S", "10"))
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._mine: tuple[int, int] | None = None  # (inode, mtime) of the lease as this master last wrote it
        self.taken_by: dict[str, Any] | None = None  # who took the study over, once it happened

    def holder(self) -> dict[str, Any] | None:
        """The live holder (host, pid, slurm_job, since), or None when the
        study is free or its lease is stale."""
        held = _read(self.path)
        if held is None or self._stale(held):
            return None
        return held

    def acquire(self) -> MasterLease:
        """Hold the lease, taking over a stale one; :class:`StudyBusy` if a live
        master holds it."""
        held = _read(self.path)
        if held is not None:
            if not self._stale(held):
                raise StudyBusy(self._busy_message(held))
            self._take_over(held)
        if not self._create():
            raise StudyBusy(self._busy_message(_read(self.path) or {}))
        self._renewer = threading.Thread(target=self._renew, name="hpo-lease", daemon=True)
        self._renewer.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if (_read(self.path) or {}).get("token") == self.token:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:  # a read-only file system: the lease goes stale by itself
                pass

    def __enter__(self) -> MasterLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- inside ----------------------------------------------------------------

    def still_held(self) -> bool:
        """Whether this master still holds the study (fencing: a master that
        was stopped, by SIGSTOP or a frozen node, may find another took it
        over). Costs a stat while the lease file is as this master last wrote
        it: the inode alone would not do, a new lease file may reuse it."""
        if self.taken_by is not None:
            return False
        try:
            if _identity(self.path) == self._mine:
                return True
        except FileNotFoundError:
            # Removed by hand, or by a later master that ended: the store's
            # epoch tells which (hpo.store._epoch); it is never put back.
            return True
        held = _read(self.path) or {}
        if held.get("token") == self.token:
            return True  # touched by hand: the next renewal notes it
        if held:
            self.taken_by = held
            return False
        return True  # its creator is still writing it

    def still_mine(self) -> bool:
        """Strictly :meth:`still_held`: a missing lease file counts as lost.
        For the moment a master takes the study's epoch, right after its
        lease: one stopped in between may find another master ran the whole
        study meanwhile and removed the lease when it ended."""
        if not self.still_held():
            return False
        if (_read(self.path) or {}).get("token") == self.token:
            return True
        self.taken_by = self.taken_by or {"gone": True}
        return False

    def taken_over_message(self) -> str:
        """What a master that lost the study says."""
        held = self.taken_by or {}
        if held.get("gone"):
            return (f"{self.path.parent}: another master ran this study while this one was starting "
                    "(it was stopped or frozen for longer than the lease lasts, and the other "
                    "removed the lease when it ended); this master stops without writing "
                    "anything.\n  fix: look at the results with hpo status; run the same command "
                    "again if trials are left")
        job = f", SLURM job {held['slurm_job']}" if held.get("slurm_job") else ""
        return (f"{self.path.parent}: another master took this study over (pid {held.get('pid', '?')} "
                f"on {held.get('host', '?')}{job}) while this one was not renewing its lease (it was "
                "stopped or frozen for longer than the lease lasts); this master stops without "
                "writing anything more, and its trials stop.\n  fix: nothing to do here: the other "
                "master runs the study; follow it with hpo status")

    def _create(self) -> bool:
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "slurm_job": os.environ.get("SLURM_JOB_ID"), "since": time.time(),
                  "token": self.token}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
            stat = os.fstat(f.fileno())
            self._mine = stat.st_ino, stat.st_mtime_ns
        return True

    def _stale(self, held: dict[str, Any]) -> bool:
        if held.get("host") == socket.gethostname() and not process_alive(held.get("pid")):
            return True  # its master died on this host: no need to wait
        try:
            renewed = self.path.stat().st_mtime
        except FileNotFoundError:
            return True
        return time.time() - renewed > _SILENT_RENEWALS * self.beat_s

    def _take_over(self, stale: dict[str, Any]) -> None:
        """Move the stale lease aside; if what was moved is not the lease judged
        stale (another master took it over meanwhile), put it back and refuse."""
        aside = self.path.with_name(f"{LEASE_FILE}.stale-{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # released or moved by another master meanwhile: try to create
        moved = _read(aside) or {}
        if moved.get("token") != stale.get("token"):
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            raise StudyBusy(self._busy_message(moved))
        aside.unlink(missing_ok=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.beat_s):
            if not self.still_held():
                return  # never renew another master's lease
            try:
                if not self._renew_once():
                    return
            except FileNotFoundError:
                # Never put back: a later master that ran the study and ended
                # removes it, and a lease made again would refuse the next run.
                return
            except OSError:  # a file-system hiccup: the next beat retries
                pass

    def _renew_once(self) -> bool:
        """Renew the lease file if it is still this master's: read, touched and
        noted through one open file, so a takeover in between cannot be
        mistaken for this master's own lease."""
        with open(self.path, "rb") as f:
            try:
                held = json.loads(f.read())
            except ValueError:
                held = {}
            if held.get("token") != self.token:
                self.taken_by = held or None
                return held == {}  # {}: a new holder still writing it; look again next beat
            os.utime(f.fileno())
            stat = os.fstat(f.fileno())
            self._mine = stat.st_ino, stat.st_mtime_ns
        return True

    def _busy_message(self, held: dict[str, Any]) -> str:
        job = f", SLURM job {held['slurm_job']}" if held.get("slurm_job") else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("since") or time.time()))
        stale_s = _SILENT_RENEWALS * self.beat_s
        return (f"{self.path.parent}: another master runs this study (pid {held.get('pid', '?')} on "
                f"{held.get('host', '?')}{job}, since {since}); two would run its trials twice.\n"
                f"  fix: wait for it to end, or stop it (kill -TERM {held.get('pid', 'PID')} on its host, "
                f"or scancel); a master that died leaves {self.path} stale after {stale_s:g} s")


def _identity(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_ino, stat.st_mtime_ns


def _read(path: Path) -> dict[str, Any] | None:
    """The lease's record; {} while its creator is still writing it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {}
