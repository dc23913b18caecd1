"""The paths every bench script sets before its other imports.

A script run as ``python bench/<name>.py`` finds this module beside it (its
folder is first on ``sys.path``), and so does a worker process that imports
a bench module by name (``PYTHONPATH`` names this folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def share_paths() -> None:
    """The repository and bench/ importable here, and in every process
    started from here (Dask workers, trial processes import objectives
    from bench/ by name)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(BENCH))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
