"""Copying a source onto the node, durably, with progress for large copies."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from hpo.data._marker import fsync_folder

__all__ = ["Progress", "copy_source", "mib"]

_CHUNK = 4 * 2**20
# Copies smaller than this finish before a progress line would help.
_PROGRESS_FROM = 16 * 2**20


def mib(count: float) -> str:
    return f"{count / 2**20:.1f} MiB"


class Progress:
    """A line on stderr every ``every_s`` seconds or each tenth of the bytes,
    whichever comes first, with the bytes copied and the rate: a copy of
    gigabytes on a busy shared file system is not a silent one. Written to
    ``sys.stderr`` as it is at the time, so the trial's log gets it too."""

    def __init__(self, name: str, total: int, every_s: float = 5.0) -> None:
        self.name, self.total, self.every_s = name, total, every_s
        self.done = 0
        self.started = self._last = time.monotonic()
        self._next_share = 0.1
        self.shown = total >= _PROGRESS_FROM

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        share = self.done / self.total if self.total else 1.0
        if self.shown and (now - self._last >= self.every_s or share >= self._next_share):
            self._last = now
            while self._next_share <= share:
                self._next_share += 0.1
            self.say(f"{mib(self.done)} of {mib(self.total)} ({share:.0%}), {self.rate()}")

    def rate(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        return f"{mib(self.done / elapsed)}/s"

    def say(self, text: str) -> None:
        print(f"hpo: staging {self.name!r}: {text}", file=sys.stderr, flush=True)


def copy_source(source: Path, target: Path, progress: Progress) -> None:
    """Copy the file or directory ``source`` to ``target`` (which must not
    exist), every file fsync'd, then every folder: durable once it returns.
    Links to files are copied as files; links to directories stay links."""
    if not source.is_dir():
        _copy_file(source, target, progress)
        return
    folders = []
    for root, dirs, names in os.walk(source):
        here = target / os.path.relpath(root, source)
        here.mkdir(parents=True, exist_ok=True)
        folders.append(here)
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):  # os.walk does not follow it
                os.symlink(os.readlink(os.path.join(root, name)), here / name)
        for name in names:
            _copy_file(Path(root, name), here / name, progress)
    for folder in reversed(folders):
        fsync_folder(folder)


def _copy_file(source: Path, target: Path, progress: Progress) -> None:
    # Plain open() and read(): the copy reads the source as any reader does.
    with open(source, "rb") as inp, open(target, "wb") as out:
        while chunk := inp.read(_CHUNK):
            out.write(chunk)
            progress.add(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    shutil.copystat(source, target)  # modification times, as the source has them
