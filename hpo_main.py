"""Entry point of the original study: ``runcompss hpo_main.py space.json``.

Also ``python hpo_main.py space.json [hpo run options]``. Under the COMPSs
runtime the compss engine is chosen automatically; elsewhere the embedded Dask
engine runs the study.
"""

import os
import sys

# TensorFlow's start-up noise would bury the progress line.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from hpo.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
