"""Double of pycompss.api.task: sequential out of scope, futures in master mode."""

from __future__ import annotations

import functools
from concurrent.futures import Future

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
        runtime.declared.setdefault(name, {})["task"] = self.kwargs

        @functools.wraps(user_function)
        def task_decorator(*args, **kwargs):
            if not CONTEXT.in_master():
                return user_function(*args, **kwargs)  # sequential mode
            # @constraint sits above @task, so it marked this wrapper.
            constraints = getattr(task_decorator, "__compss_constraints__", {})
            resolved = {k: _resolve_all(v) for k, v in constraints.items()}
            if runtime.servable(resolved):
                future = runtime.pool().submit(self.kwargs.get("priority", False), user_function,
                                               *args, **kwargs)
            else:  # COMPSs keeps it Blocked until a worker that can serve it appears
                future = Future()
                runtime.blocked.append({"function": name, "constraints": resolved})
            runtime.submitted.append({"function": name, "constraints": resolved, "future": future,
                                      "priority": self.kwargs.get("priority", False)})
            if _current_group:
                runtime.groups.setdefault(_current_group[-1], []).append(future)
            return future

        return task_decorator


def _resolve_all(value):
    if isinstance(value, list):
        return [{k: runtime.resolve(v) for k, v in item.items()} for item in value]
    return runtime.resolve(value)


_current_group: list[str] = []
task = Task
