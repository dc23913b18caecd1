"""The slow shared file system of bench/staging.py, and its objective.

A parallel file system gives each node a share of its bandwidth; here that
share is emulated in the processes of the one "node": once :func:`install`
ran in a process, every file it opens for reading under ``shared`` with
``open()`` (the objective's reads, and hpo's copier, which reads its source
with ``open()`` too) is read through a link of ``rate`` bytes/s that all the
node's processes share. The link is a ledger file: under its ``flock`` a
read books the next free time on the link for its bytes and adds them to
the node's total, then sleeps until its bytes have "arrived". The bytes
themselves come from the page cache at once: only the time is emulated.
The total is exactly the bytes read from the shared path.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

__all__ = ["install", "reset", "shared_bytes", "train"]

_LEDGER = struct.Struct("dq")  # the link's next free time (monotonic), bytes read so far
_real_open = builtins.open
_installed: dict[str, Any] = {}


def reset(ledger: str) -> None:
    """A fresh link: free now, nothing read."""
    Path(ledger).write_bytes(_LEDGER.pack(0.0, 0))


def shared_bytes(ledger: str) -> int:
    """Bytes read from the shared path since :func:`reset`, by every process."""
    return _LEDGER.unpack(Path(ledger).read_bytes())[1]


def install(shared: str, ledger: str, rate: float) -> None:
    """Make ``open()`` in this process read files under ``shared`` through
    the node's link ``ledger`` (a worker process runs trials of both runs:
    the latest call's link is the one used)."""
    _installed.update(shared=os.path.realpath(shared), ledger=ledger, rate=rate)
    builtins.open = _open


def _open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    opened = _real_open(file, mode, *args, **kwargs)
    if "r" in mode and isinstance(file, (str, os.PathLike)) \
            and os.path.realpath(file).startswith(_installed["shared"] + os.sep):
        return _Throttled(opened)
    return opened


class _Throttled:
    """A file whose reads take the time the node's link needs for them."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def read(self, size: int = -1) -> Any:
        data = self._file.read(size)
        _book(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        count = self._file.readinto(buffer)
        _book(count or 0)
        return count

    def __enter__(self) -> "_Throttled":
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def _book(count: int) -> None:
    if not count:
        return
    with _real_open(_installed["ledger"], "r+b") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        free_at, total = _LEDGER.unpack(ledger.read(_LEDGER.size))
        done_at = max(time.monotonic(), free_at) + count / _installed["rate"]
        ledger.seek(0)
        ledger.write(_LEDGER.pack(done_at, total + count))
    time.sleep(max(0.0, done_at - time.monotonic()))


def train(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """Read the whole dataset once in 1 MiB batches, from the node's copy
    (``staged``) or from the shared path, and record when the first batch
    came and when the last did."""
    install(config["shared"], config["ledger"], config["rate"])
    started = time.time()
    root = trial.data_path("dataset") if config["staged"] else Path(config["source"])
    first_batch, total = None, 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as inp:
            while batch := inp.read(2**20):
                total += len(batch)
                first_batch = first_batch or time.time()
    record = {"started": started, "first_batch": first_batch, "ended": time.time(), "bytes": total,
              "pid": os.getpid(), "path": str(root)}
    Path(config["records"], f"{trial.number}.json").write_text(json.dumps(record))
    return {"value": float(total)}
