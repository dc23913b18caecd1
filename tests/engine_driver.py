"""``hpo`` in a child process for the engine tests: ``engine_driver.py [--compss-double N] ARGS``.

With ``--compss-double N`` the PyCOMPSs test double stands in for the runtime
(master mode, N worker slots), as ``runcompss`` would start the program.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--compss-double"]:
        sys.path.insert(0, str(Path(__file__).with_name("compss_double")))
        from pycompss import runtime

        runtime.start(int(argv[1]))
        argv = argv[2:]
    from hpo.cli import main

    sys.exit(main(argv))
