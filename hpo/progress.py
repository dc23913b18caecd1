"""A live status line for a running study.

On a terminal the line is redrawn in place; in a batch job's log (not a tty)
one line is written per finished trial, so the log reads as a history.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressLine"]


class ProgressLine:
    """``[#####.....] 5/12 done | 3 in flight | 0 failed | best val_accuracy=0.97 (#3) | 0:41``

    In flight: running, or prepared and queued in the engine.
    """

    def __init__(self, total: int, metric: str, stream: TextIO | None = None,
                 enabled: bool = True, width: int = 20) -> None:
        self.total, self.metric, self.width = total, metric, width
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._live = enabled and self.stream.isatty()
        self._started = time.monotonic()
        self._last = ""
        self._done = -1

    def update(self, done: int, running: int, failed: int,
               best: tuple[int, float] | None) -> None:
        if not self.enabled:
            return
        line = self._render(done, running, failed, best)
        if line == self._last or (not self._live and done == self._done):
            return  # a log file gets one line per finished trial
        self._last, self._done = line, done
        self.stream.write("\r" + line.ljust(100) if self._live else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._live and self._last:
            self.stream.write("\n")
            self.stream.flush()

    def _render(self, done: int, running: int, failed: int, best: tuple[int, float] | None) -> str:
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = int(time.monotonic() - self._started)
        best_text = f"best {self.metric}={best[1]:.4g} (#{best[0]})" if best else "best -"
        return (f"[{bar}] {done}/{self.total} done | {running} in flight | {failed} failed | "
                f"{best_text} | {elapsed // 60}:{elapsed % 60:02d}")
