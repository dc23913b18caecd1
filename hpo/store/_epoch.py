"""Fencing in the store: which master's run may write to a study.

A lease file cannot fence a master that was stopped (SIGSTOP, a frozen node,
a hung file system) through its successor's whole run: it wakes, finds the
lease gone (its successor released it) and goes on from its own memory. So
each master's run takes the study by writing an *epoch* into the store
itself, one more than the last: the study system attribute ``hpo:epoch``
(``{"epoch": N, "master": LEASE_TOKEN, "host": ..., "pid": ...}``), a journal
record or a database row like any other (Kleppmann's fencing tokens).

From then on:

- the relay of an earlier epoch writes nothing more once it sees a later
  epoch in the store (it reads every record other processes append before
  each round it writes, under the journal's lock), and its master exits 75;
- an attempt's write around the relay (its master is unreachable) carries
  the lease token of the master that made its task, and is refused when
  the store's epoch names another master.

Reading the whole journal for the last epoch at every direct write would
cost as much as the journal is long, so the relay also writes the epoch it
takes into a small file beside the journal (``<journal>.epoch``) under the
journal's lock, before the record itself: a direct writer reads it under
the same lock. The record stays the truth; a missing file is found again by
reading the journal.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpo.errors import StoreUnavailable
from hpo.store._files import write_atomically
from hpo.store._format import Op, op_of, study_attrs

__all__ = ["EPOCH_ATTR", "EPOCH_SUFFIX", "epoch_record", "epoch_of", "in_journal_record",
           "journal_epoch", "write_epoch_file", "taken_over"]

EPOCH_ATTR = "hpo:epoch"
EPOCH_SUFFIX = ".epoch"
_MARK = b'"hpo:epoch"'


def epoch_record(epoch: int, master: str) -> dict[str, Any]:
    """What a master's run writes when it takes the study."""
    return {"epoch": epoch, "master": master, "host": socket.gethostname(), "pid": os.getpid(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"), "since": time.time()}


def epoch_of(record: Any) -> int:
    """The epoch number of a stored epoch record (0: none, or unreadable)."""
    if isinstance(record, dict) and isinstance(record.get("epoch"), int) \
            and not isinstance(record.get("epoch"), bool):
        return record["epoch"]
    return 0


def in_journal_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """The epoch a journal record sets, if it sets one."""
    if op_of(record) != Op.SET_STUDY_SYSTEM_ATTR:
        return None
    return study_attrs(record).get(EPOCH_ATTR)


def journal_epoch(journal: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last epoch the journal's study was taken with: from the file
    beside it, else from the journal itself (None: never taken)."""
    try:
        return json.loads(Path(f"{journal}{EPOCH_SUFFIX}").read_text())
    except FileNotFoundError:
        return _scan(Path(journal))
    except ValueError:  # damaged: the journal says it
        return _scan(Path(journal))


def write_epoch_file(journal: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Name ``record`` the study's epoch beside the journal (under its lock)."""
    write_atomically(f"{journal}{EPOCH_SUFFIX}", json.dumps(record))


def _scan(journal: Path) -> dict[str, Any] | None:
    try:
        data = journal.read_bytes()
    except FileNotFoundError:
        return None
    found = None
    at = data.find(_MARK)
    while at >= 0:
        start = data.rfind(b"\n", 0, at) + 1
        stop = data.find(b"\n", at)
        try:
            record = in_journal_record(json.loads(data[start:stop if stop >= 0 else len(data)]))
        except ValueError:
            record = None
        if record is not None and epoch_of(record) >= epoch_of(found):
            found = record
        at = data.find(_MARK, at + 1)
    return found


def taken_over(where: str, later: dict[str, Any], own: int) -> StoreUnavailable:
    """What a master whose study another master's run took says."""
    job = f", SLURM job {later['slurm_job']}" if later.get("slurm_job") else ""
    return StoreUnavailable(
        f"{where}: another master took this study over (epoch {epoch_of(later)} against this "
        f"master's {own}: pid {later.get('pid', '?')} on {later.get('host', '?')}{job}) while "
        "this one was stopped or frozen; this master stops without writing anything more, and "
        "its trials stop.\n  fix: nothing to do here: the other master runs the study (or ran "
        "it); follow it with hpo status")
