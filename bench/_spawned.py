"""A function run in a fresh process, as a worker process runs trials, for the benches."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any


def in_process(target: Callable[..., None], *args: Any) -> Any:
    """``target(*args, send)`` in a spawned process; what it sent."""
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(*args, send))
    process.start()
    send.close()  # the child's copy alone: a child that dies without sending ends recv() (EOFError)
    result = receive.recv()
    process.join()
    return result
