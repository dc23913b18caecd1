"""State of the fake runtime (not a real pycompss module; tests drive it)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from pycompss.util.context import CONTEXT

declared: dict[str, dict] = {}   # function name -> {"task": kwargs, "constraint": kwargs}
submitted: list[dict] = []        # one entry per task call in master mode
groups: dict[str, list] = {}
waited_unfinished = 0             # compss_wait_on calls on futures not yet done
workers = 2
_pool: ThreadPoolExecutor | None = None


def start(n_workers: int = 2) -> None:
    global workers, _pool
    workers = n_workers
    _pool = ThreadPoolExecutor(n_workers)
    CONTEXT.where = CONTEXT.master


def stop() -> None:
    global _pool, waited_unfinished
    waited_unfinished = 0
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
    _pool = None
    CONTEXT.where = CONTEXT.out_of_scope
    declared.clear()
    submitted.clear()
    groups.clear()


def pool() -> ThreadPoolExecutor:
    return _pool


def resolve(value):
    """'$VAR' values are read from the environment by the runtime."""
    if isinstance(value, str) and value.startswith("$"):
        name = value[1:]
        if name not in os.environ:
            raise RuntimeError(f"COMPSs: environment variable {name} of a constraint is not set")
        return os.environ[name]
    return value
