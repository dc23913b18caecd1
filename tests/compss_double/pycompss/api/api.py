"""Double of pycompss.api.api (the calls hpo uses), real signatures."""

from __future__ import annotations

from concurrent.futures import Future

from pycompss import runtime
from pycompss.api import task as _task
from pycompss.util.context import CONTEXT


def compss_wait_on(*args, **kwargs):
    runtime.check_alive()
    # hpo must only wait on finished futures (COMPSs has no wait-any): count the others.
    runtime.waited_unfinished += sum(isinstance(a, Future) and not a.done() for a in args)
    values = [a.result() if isinstance(a, Future) else a for a in args]
    return values[0] if len(values) == 1 else values


def compss_barrier(no_more_tasks: bool = False) -> None:
    runtime.check_alive()
    for entry in runtime.submitted:
        entry["future"].exception()


def compss_get_number_of_resources() -> int:
    """Worker nodes, not task slots (ResourceManager.getTotalNumberOfWorkers)."""
    runtime.check_alive()
    return runtime.nodes if CONTEXT.in_pycompss() else 1


def compss_cancel_group(group_name: str) -> None:
    """Queued tasks of the group are dropped; running ones see CancelError raised inside them."""
    for future in runtime.groups.get(group_name, []):
        runtime.scheduler().cancel(future)


class TaskGroup:
    def __init__(self, group_name: str, implicit_barrier: bool = True) -> None:
        self.group_name, self.implicit_barrier = group_name, implicit_barrier

    def __enter__(self):
        _task._current_group.append(self.group_name)
        return self

    def __exit__(self, *exc):
        _task._current_group.pop()
        if self.implicit_barrier:
            for future in runtime.groups.get(self.group_name, []):
                future.exception()
