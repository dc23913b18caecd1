"""A live status line for a running study.

On a terminal the line is redrawn in place; in a batch job's log (not a tty)
one line is written per finished trial, so the log reads as a history.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from hpo.units import format_number

__all__ = ["ProgressLine"]


class ProgressLine:
    """``[#####.....] 5/12 done | 2 running, 1 queued | 0 failed | best val_accuracy=0.97 (#3) | 0:41``

    Running: trials in the engine's slots (at most ``parallel``); queued:
    prepared and waiting in the engine for a slot to free.
    """

    def __init__(self, total: int, metric: str, stream: TextIO | None = None,
                 enabled: bool = True, width: int = 20, slots: int | None = None) -> None:
        self.total, self.metric, self.width, self.slots = total, metric, width, slots
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._live = enabled and self.stream.isatty()
        self._started = time.monotonic()
        self._last = ""
        self._done = -1

    def update(self, done: int, in_flight: int, failed: int,
               best: tuple[int, float] | None) -> None:
        """Redraw with ``in_flight`` trials submitted and not finished."""
        if not self.enabled:
            return
        line = self._render(done, in_flight, failed, best)
        if line == self._last or (not self._live and done == self._done):
            return  # a log file gets one line per finished trial
        self._last, self._done = line, done
        self.stream.write("\r" + line.ljust(100) if self._live else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._live and self._last:
            self.stream.write("\n")
            self.stream.flush()

    def _render(self, done: int, in_flight: int, failed: int, best: tuple[int, float] | None) -> str:
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = int(time.monotonic() - self._started)
        best_text = f"best {self.metric}={format_number(best[1])} (#{best[0]})" if best else "best -"
        running = min(in_flight, self.slots) if self.slots else in_flight
        queued = f", {in_flight - running} queued" if in_flight > running else ""
        return (f"[{bar}] {done}/{self.total} done | {running} running{queued} | {failed} failed | "
                f"{best_text} | {elapsed // 60}:{elapsed % 60:02d}")
