"""Run inside a Dask batch job: start this task's worker, or wait for all of them.

``python -m hpo.launchers.dask_node worker ...`` runs as one srun task per
worker. With GPUs, task k of a node keeps the k-th group of the node's GPUs
(``CUDA_VISIBLE_DEVICES``), so each worker and each trial on it sees only its
own: hpo's trial wrapper takes the worker's visible GPUs as its assignment.
``... wait ...`` blocks until the workers joined, so the study plans its
slots with all of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["worker_argv", "main"]


def worker_argv(env: Mapping[str, str], scheduler_file: str, workers_per_node: int,
                gpus_per_worker: int, interface: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``dask worker`` command line and environment of this srun task.

    CPUs come from SLURM (``SLURM_CPUS_PER_TASK``, else the node's CPUs
    shared among its workers); they become both the thread count and the
    ``CPU`` resource the hpo dask engine requests.
    """
    local = int(env.get("SLURM_LOCALID", "0"))
    cpus = int(env.get("SLURM_CPUS_PER_TASK") or 0) or max(
        1, int(env.get("SLURM_CPUS_ON_NODE", "1")) // workers_per_node)
    resources = f"CPU={cpus}"
    new_env = dict(env)
    if gpus_per_worker:
        visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        mine = visible[local * gpus_per_worker:(local + 1) * gpus_per_worker]
        if len(mine) < gpus_per_worker:
            raise SystemExit(f"hpo dask_node: task {local} needs {gpus_per_worker} GPU(s) but the "
                             f"node shows CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}")
        new_env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        resources += f",GPU={gpus_per_worker}"
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", scheduler_file,
            "--nthreads", str(cpus), "--nworkers", "1", "--resources", resources,
            "--no-dashboard", "--name", f"{env.get('SLURMD_NODENAME', 'node')}-{local}"]
    if interface:
        argv += ["--interface", interface]
    return argv, new_env


def _wait(scheduler_file: Path, workers: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while not scheduler_file.is_file():
        if time.monotonic() > deadline:
            print(f"hpo: the Dask scheduler wrote no {scheduler_file} in {timeout:.0f} s; "
                  "see scheduler.log beside it", file=sys.stderr)
            return 1
        time.sleep(0.5)
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout=timeout) as client:
        try:
            client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
        joined = len(client.scheduler_info(n_workers=-1)["workers"])
    if joined == 0:
        print(f"hpo: no Dask worker joined in {timeout:.0f} s; see workers.log", file=sys.stderr)
        return 1
    if joined < workers:
        print(f"hpo: warning: {joined} of {workers} Dask workers joined; going on with them",
              file=sys.stderr)
    else:
        print(f"hpo: {joined} Dask worker(s) joined", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpo.launchers.dask_node")
    sub = parser.add_subparsers(dest="what", required=True)
    worker = sub.add_parser("worker", help="exec this srun task's dask worker")
    worker.add_argument("--scheduler-file", required=True)
    worker.add_argument("--workers-per-node", type=int, default=1)
    worker.add_argument("--gpus-per-worker", type=int, default=0)
    worker.add_argument("--interface")
    wait = sub.add_parser("wait", help="wait until the workers joined")
    wait.add_argument("--scheduler-file", required=True)
    wait.add_argument("--workers", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    if args.what == "wait":
        return _wait(Path(args.scheduler_file), args.workers, args.timeout)
    command, env = worker_argv(os.environ, args.scheduler_file, args.workers_per_node,
                               args.gpus_per_worker, args.interface)
    os.execve(command[0], command, env)  # the worker replaces us: srun signals reach it


if __name__ == "__main__":
    sys.exit(main())
