"""``hpo`` in a child process for the engine tests: ``engine_driver.py [--compss-double N] ARGS``.

With ``--compss-double N`` the PyCOMPSs test double stands in for the runtime
(master mode, N worker nodes of 1 CPU), as ``runcompss`` would start the program.
"""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--compss-double"]:
        sys.path.insert(0, str(Path(__file__).with_name("compss_double")))
        from pycompss import runtime

        os.environ["SLURM_CPUS_ON_NODE"] = "1"  # the nodes' cores, as in an allocation
        runtime.start(nodes=int(argv[1]), cpus_per_node=1)
        argv = argv[2:]
    from hpo.cli import main

    sys.exit(main(argv))
