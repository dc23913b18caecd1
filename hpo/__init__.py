"""hpo: task-based hyperparameter optimisation for HPC clusters.

A JSON search space becomes trial tasks run by COMPSs or Dask, with every
report stored durably in an Optuna storage.

>>> import hpo, tempfile
>>> result = hpo.run({"objective": "hpo.examples.toy:quadratic", "metric": {"name": "value"},
...                   "space": {"x": [1, 2, 3], "y": [-1, 0]}},
...                  engine="inline", runs_dir=tempfile.mkdtemp(), progress=False)
>>> result.best.params, result.counts["COMPLETE"]
({'x': 2, 'y': -1}, 6)
"""

from hpo.api import run
from hpo.errors import EngineError, EngineLost, SpaceError, StoreUnavailable, UsageError
from hpo.results import StudyResult, TrialRecord
from hpo.space import StudySpec, load_spec, parse_spec
from hpo.store import TrialStatus
from hpo.trial import Trial, TrialState  # noqa: F401 - TrialStatus's former name

__all__ = [
    "run", "Trial", "TrialStatus", "StudyResult", "TrialRecord", "StudySpec",
    "load_spec", "parse_spec", "UsageError", "SpaceError", "EngineError", "EngineLost",
    "StoreUnavailable",
]
__version__ = "0.1.0"
