"""``python -m hpo``: the same as the ``hpo`` command."""

import sys

from hpo.cli import main

sys.exit(main())
