"""Search spaces: parameter kinds, the lazy grid, and the study file.

>>> from hpo.space import parse_spec
>>> spec = parse_spec({"optimizer": ["Adam", "SGD"], "num_epochs": [20, 50, 100]})
>>> spec.grid_size, spec.grid()[0]
(6, {'num_epochs': 20, 'optimizer': 'Adam'})
"""

from hpo.errors import SpaceError
from hpo.space._conditions import is_active, ordered
from hpo.space._grid import Grid
from hpo.space._params import CategoricalParam, Choice, FloatParam, IntParam, Param
from hpo.space._spec import (
    ALGORITHMS,
    DEFAULT_OBJECTIVE,
    DIRECTIONS,
    PRUNERS,
    SAMPLERS,
    EarlyStopping,
    Metric,
    Resources,
    Retries,
    Scheduling,
    SearchSettings,
    StudySpec,
    load_spec,
    parse_spec,
)

__all__ = [
    "ALGORITHMS", "DEFAULT_OBJECTIVE", "DIRECTIONS", "PRUNERS", "SAMPLERS",
    "Choice", "Param", "CategoricalParam", "IntParam", "FloatParam", "Grid",
    "Metric", "SearchSettings", "Resources", "Retries", "EarlyStopping", "Scheduling", "StudySpec",
    "load_spec", "parse_spec", "SpaceError", "is_active", "ordered",
]
