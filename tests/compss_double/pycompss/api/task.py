"""Double of pycompss.api.task: sequential out of scope, futures in master mode."""

from __future__ import annotations

import functools
import importlib
from pycompss import runtime
from pycompss.util.context import CONTEXT

_ON_FAILURE = ("RETRY", "FAIL", "IGNORE", "CANCEL_SUCCESSORS")


class Task:
    def __init__(self, *args, **kwargs) -> None:
        if kwargs.get("on_failure", "RETRY") not in _ON_FAILURE:
            raise RuntimeError(f"COMPSs: unknown on_failure {kwargs['on_failure']!r}")
        if not isinstance(kwargs.get("time_out", 0), int):
            raise RuntimeError("COMPSs: time_out must be an int (seconds)")
        if not isinstance(kwargs.get("priority", False), bool):
            raise RuntimeError("COMPSs: priority must be a bool")
        self.kwargs = kwargs

    def __call__(self, user_function):
        name = user_function.__name__
        if user_function.__qualname__ != name:
            # The binding reads the qualified name's prefix as a class: the
            # worker would look for a method and not find the task.
            raise RuntimeError(f"COMPSs: {user_function.__qualname__} is registered as a method "
                               f"of class {user_function.__qualname__.rsplit('.', 1)[0]!r}")
        runtime.declared.setdefault(name, {})["task"] = self.kwargs

        @functools.wraps(user_function)
        def task_decorator(*args, **kwargs):
            # @multinode above passes these; the binding takes them out of the call.
            nodes = int(kwargs.pop("computing_nodes", 1))
            per_node = int(kwargs.pop("processes_per_node", 1))
            if not CONTEXT.in_master():
                return user_function(*args, **kwargs)  # sequential mode
            # @constraint sits above @task (and @multinode), so it marked this wrapper.
            declared = getattr(task_decorator, "__compss_constraints__", {})
            constraints = runtime.binding_keeps(declared)  # what the runtime is handed
            resources = runtime.describe(constraints)
            found = functools.partial(_as_a_worker_finds, user_function.__module__, name)
            demand = {**resources, "nodes": nodes, "processes_per_node": per_node}
            future = runtime.scheduler().submit(name, found, args, self.kwargs, demand)
            runtime.submitted.append({"function": name, "constraints": constraints,
                                      "resources": resources, "nodes": nodes, "future": future,
                                      "priority": self.kwargs.get("priority", False)})
            if _current_group:
                runtime.groups.setdefault(_current_group[-1], []).append(future)
            return future

        task_decorator.__compss_body__ = user_function
        return task_decorator


def _as_a_worker_finds(module: str, name: str, *args):
    """Run the task as a worker does: import its module, look it up by name
    (a missing one fails the job), and call the function under the decorators."""
    function = getattr(importlib.import_module(module), name)
    while not hasattr(function, "__compss_body__"):  # @multinode's wrapper, around @task's
        function = function.__wrapped__
    return function.__compss_body__(*args)


_current_group: list[str] = []
task = Task
