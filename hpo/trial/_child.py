"""Entry point of an isolated trial: ``python -m hpo.trial._child TASK RESULT``.

The trial process never outlives its task: on SIGTERM, or when the process
that started it is gone (a worker killed, a cluster shut down), its trial
suspends at its next check (checkpointed) and the process exits after the
stop grace, whatever the objective is doing.

A launcher inside the objective (Lightning's DDP, ``torch.distributed``'s
elastic agent) may start this same command again for its other ranks, with
``LOCAL_RANK``/``NODE_RANK``/``RANK`` set: such a process is a follower. It
runs the objective with a trial that neither reports nor asks (rank 0 does,
and broadcasts its decisions) and leaves the result to rank 0.
"""

import os
import pickle
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from hpo.trial._attempt import run_follower, run_here
from hpo.trial._local_stop import exit_after_grace, request_suspend

_PARENT_POLL_S = 0.5


def main(task_file: str, result_file: str) -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: _leave("SIGTERM"))
    # A follower's parent is rank 0's process, whose worker still reads the result.
    _watch_parent(os.getppid(), None if follower_rank() > 0 else Path(result_file).parent)
    task, token, context = pickle.loads(Path(task_file).read_bytes())
    if follower_rank() > 0:
        run_follower(task, context, follower_rank())
        return
    result = run_here(task, token, lambda: context)  # begun by its parent
    try:
        payload = pickle.dumps(result)
    except Exception:  # an unpicklable return value: keep its text, classified as bad
        result.returned = repr(result.returned)
        payload = pickle.dumps(result)
    Path(result_file).write_bytes(payload)


def follower_rank() -> int:
    """This process's rank, as the launcher that started it set it (0: the
    trial's own process, which hpo starts with none of them set)."""
    names = ("RANK", "LOCAL_RANK", "NODE_RANK")
    return max(int(os.environ.get(name) or 0) for name in names)


def _leave(why: str) -> None:
    request_suspend(why)
    exit_after_grace()


def _watch_parent(parent: int, folder: Path | None) -> None:
    """Suspend the trial once its worker process is gone; nobody reads its
    result then, so the folder its worker made for it goes too."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        _leave("its worker process ended")

    threading.Thread(target=watch, name="hpo-parent-watch", daemon=True).start()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm"]:  # a warm process, forking trials' processes (hpo.trial._warm)
        from hpo.trial._warm import serve_warm

        serve_warm(int(sys.argv[2]), main)
    else:
        main(*sys.argv[1:3])
