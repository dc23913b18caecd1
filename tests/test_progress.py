"""The progress line: redrawn on a terminal, one line per finished trial in a log."""

from __future__ import annotations

import io

from hpo.master import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_gets_one_line_per_finished_trial():
    log = io.StringIO()
    line = ProgressLine(4, "val_accuracy", stream=log)
    line.update(0, 2, 0, None)
    line.update(0, 3, 0, None)  # more in flight, nothing finished: no new line
    line.update(1, 3, 0, (0, 0.5))
    line.update(2, 2, 1, (0, 0.5))
    line.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[-1].startswith("[##########..........] 2/4 done | 2 running | 1 failed")
    assert "best val_accuracy=0.5 (#0)" in lines[-1]


def test_running_and_queued_are_told_apart():
    """Trials prepared ahead wait in the engine: they are queued, not running."""
    log = io.StringIO()
    line = ProgressLine(12, "val_accuracy", stream=log, slots=2)
    line.update(0, 3, 0, None)
    line.update(1, 2, 0, (0, 17.3142))
    first, second = log.getvalue().splitlines()
    assert "| 2 running, 1 queued |" in first
    assert "| 2 running |" in second and "best val_accuracy=17.31 (#0)" in second


def test_terminal_line_is_redrawn_in_place():
    tty = Terminal()
    line = ProgressLine(2, "loss", stream=tty)
    line.update(1, 1, 0, (0, 0.25))
    line.update(2, 0, 0, (1, 0.125))
    line.close()
    out = tty.getvalue()
    assert out.count("\r") == 2 and out.endswith("\n") and "2/2 done" in out


def test_disabled_line_writes_nothing():
    log = io.StringIO()
    ProgressLine(2, "loss", stream=log, enabled=False).update(1, 0, 0, None)
    assert log.getvalue() == ""
