"""Double of pycompss.api.multinode: a task on several nodes at once.

As the binding does: only ``computing_nodes`` and ``processes_per_node`` are
accepted; calling the task outside the runtime (plain ``python``) raises; in
the master the task asks for that many distinct nodes, each with the task's
constraints; on the worker the task sees ``COMPSS_HOSTNAMES`` (one entry per
process), ``COMPSS_NUM_NODES``, ``COMPSS_NUM_THREADS`` and the ``SLURM_*``
variables the binding derives from them.
"""

from __future__ import annotations

import functools

from pycompss.util.context import CONTEXT

_SUPPORTED = {"computing_nodes", "processes_per_node"}


class NotInPyCOMPSsException(Exception):
    pass


class MultiNode:
    def __init__(self, *args, **kwargs) -> None:
        unknown = set(kwargs) - _SUPPORTED
        if unknown:
            raise RuntimeError(f"COMPSs: @multinode does not support {sorted(unknown)}")
        nodes = kwargs.get("computing_nodes", 1)
        if isinstance(nodes, bool) or not isinstance(nodes, (int, str)) or int(nodes) < 1:
            raise RuntimeError(f"COMPSs: computing_nodes must be an int >= 1 or a string, got {nodes!r}")
        self.kwargs = {"processes_per_node": 1, **kwargs, "computing_nodes": int(nodes)}

    def __call__(self, user_function):
        @functools.wraps(user_function)
        def multinode_f(*args, **kwargs):
            if CONTEXT.where == CONTEXT.out_of_scope:
                raise NotInPyCOMPSsException("MultiNode: not in PyCOMPSs scope")
            # @constraint above marked this wrapper; the @task below reads its own mark.
            user_function.__compss_constraints__ = getattr(multinode_f, "__compss_constraints__", {})
            return user_function(*args, computing_nodes=self.kwargs["computing_nodes"],
                                 processes_per_node=self.kwargs["processes_per_node"], **kwargs)

        return multinode_f


multinode = MultiNode
