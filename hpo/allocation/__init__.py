"""Trial shapes and GPU allocation: what each trial runs on, and where.

- :mod:`._shape`: a trial's shape (CPUs, GPUs or a share of one, memory,
  nodes) from the space's ``resources``, numbers or expressions of parameters;
- :mod:`._inventory`: the master's ledger of nodes and GPUs, placing trials
  on concrete GPU ids and hosts;
- :mod:`._fleet`: FLEET's rate allocation (profile, Eq. 1, flotilla, node
  packing, growing a running trial);
- :mod:`._cost`: the paraDL cost model (time per step, memory);
- :mod:`._planner`: which waiting trials start now, on what, and where;
- :mod:`._oracle`, :mod:`._allocator`: the model an allocation asks, and the
  master's side (proposals in, placed trial tasks out).
"""

from hpo.allocation._allocator import Allocator, PassThrough, make_allocator
from hpo.allocation._cost import (
    Layer,
    ModelCost,
    Network,
    accuracy,
    epoch_time,
    fits,
    measure_network,
    memory_bytes,
    profile_keras,
    step_time,
    training_rate,
    trial_time,
)
from hpo.allocation._fleet import RateCurve, flotilla, grow_choice, pack_nodes, profile_rate
from hpo.allocation._inventory import Device, Inventory, Node, Placement
from hpo.allocation._planner import Candidate, Planner, Start, curve_from
from hpo.allocation._shape import Amount, TrialShape, check_shape, parse_amount, sample_configs

__all__ = [
    "Amount", "TrialShape", "Device", "Node", "Inventory", "Placement", "RateCurve", "flotilla",
    "pack_nodes", "grow_choice", "profile_rate", "Candidate", "Planner", "Start", "curve_from",
    "check_shape", "parse_amount", "sample_configs", "Allocator", "PassThrough", "make_allocator", "Layer",
    "ModelCost", "Network", "step_time", "epoch_time", "trial_time", "memory_bytes", "fits",
    "training_rate", "profile_keras", "measure_network", "accuracy",
]
