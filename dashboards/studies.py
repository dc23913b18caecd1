"""The studies one ``hpo dashboard`` serves: each run directory named, and
every study inside a runs directory named (``hpo dashboard runs``).

    hpo dashboard runs/a runs/b     # two studies, a picker between them
    hpo dashboard runs              # every study in runs/
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["run_dirs", "labels"]


def run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories ``paths`` stand for, each once and in order: a run
    directory (it holds ``study.json``) stands for itself, a directory of run
    directories for each of them by name. Anything else is kept as named, so
    that reading it fails with the reader's error and fix."""
    found: list[Path] = []
    for path in map(Path, paths):
        inside = [] if (path / "study.json").is_file() or not path.is_dir() else \
            sorted(p.parent for p in path.glob("*/study.json"))
        found.extend(inside or [path])
    return list(dict.fromkeys(found))


def labels(names: Sequence[str], dirs: Sequence[Path]) -> list[str]:
    """What the study picker shows: each study's name, with its directory
    where two studies share a name."""
    shared = {n for n in names if list(names).count(n) > 1}
    return [f"{name} ({path})" if name in shared else name for name, path in zip(names, dirs)]
