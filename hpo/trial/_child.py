"""Entry point of an isolated trial: ``python -m hpo.trial._child TASK RESULT``.

The trial process never outlives its task: on SIGTERM, or when the process
that started it is gone (a worker killed, a cluster shut down), its trial
suspends at its next check (checkpointed) and the process exits after the
stop grace, whatever the objective is doing.
"""

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

from hpo.trial._attempt import run_here
from hpo.trial._local_stop import exit_after_grace, request_suspend

_PARENT_POLL_S = 0.5


def main(task_file: str, result_file: str) -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: _leave("SIGTERM"))
    _watch_parent(os.getppid())
    task, token, context = pickle.loads(Path(task_file).read_bytes())
    result = run_here(task, token, context)
    try:
        payload = pickle.dumps(result)
    except Exception:  # an unpicklable return value: keep its text, classified as bad
        result.returned = repr(result.returned)
        payload = pickle.dumps(result)
    Path(result_file).write_bytes(payload)


def _leave(why: str) -> None:
    request_suspend(why)
    exit_after_grace()


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        _leave("its worker process ended")

    threading.Thread(target=watch, name="hpo-parent-watch", daemon=True).start()


if __name__ == "__main__":
    main(*sys.argv[1:3])
