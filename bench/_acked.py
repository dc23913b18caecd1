"""bench/chaos.py's objective: ``hpo.examples.toy:curve`` that also writes
down, outside the store, every report the store acknowledged.

``trial.report`` returning means the report is durable (it raises
``hpo.store.Halted`` when the store did not take it). Each report it returned
for is appended as a ``trial_number step value`` line to ``acknowledged.txt``
in the folder named by the fixed field ``acks_dir`` (none: nothing written);
the bench then looks for each line among the stored trials' intermediate
values. A process killed between the return and the append only leaves a
report out of the list: it can hide nothing the store lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpo.examples import toy

ACKS_FILE = "acknowledged.txt"


class _Recorded:
    """The trial as ``curve`` sees it, its reports written down once stored."""

    def __init__(self, trial: Any, path: Path) -> None:
        self._trial, self._path = trial, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)

    def report(self, step: int, **metrics: float) -> None:
        self._trial.report(step, **metrics)  # raises when the store did not take it
        # One short write in append mode: lines of concurrent trials do not mix.
        with open(self._path, "a") as out:
            out.write(f"{self._trial.number} {step} {metrics['value']!r}\n")


def curve(config: dict[str, Any], trial: Any) -> dict[str, float]:
    """``hpo.examples.toy:curve``, its acknowledged reports listed in ``acks_dir``."""
    if config.get("acks_dir"):
        trial = _Recorded(trial, Path(config["acks_dir"]) / ACKS_FILE)
    return toy.curve(config, trial)
