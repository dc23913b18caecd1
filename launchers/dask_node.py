"""Run inside a Dask batch job: the scheduler, this srun task's worker, the
wait for all workers, the job's TLS identity, its stop grace, and the record
of how the study ended.

``... begin ...`` readies the job's folder for this run: SLURM may requeue a
job (a node failure, ``scontrol requeue``), which then runs this script again
under the same id, its earlier run dead. That run's record of its end is
kept aside, its scheduler file (a dead address) removed, and the study's
lease, if that run still holds it, released: otherwise the new run would
wait on a dead scheduler or be refused as a second master of its own study.

``python -m hpo.launchers.dask_node worker ...`` runs as one srun task per
worker. With GPUs, task k of a node keeps the k-th group of the node's GPUs
(``CUDA_VISIBLE_DEVICES``), so each worker and each trial on it sees only its
own: hpo's trial wrapper takes the worker's visible GPUs as its assignment.
``... wait ...`` blocks until the workers joined, so the study plans its
slots with all of them.

SLURM ends a job (``scancel``, the walltime) with SIGTERM to every process
of it at once, then SIGKILL after ``KillWait``. So the scheduler outlives a
SIGTERM (the batch script stops it with SIGINT once the study has gone), and
a worker that receives SIGTERM lets its running trials checkpoint and
suspend (``hpo.trial.request_suspend``) within the stop grace, waits until
the study took their results, and only then closes. Workers run without a
nanny: a nanny would kill its worker process a few seconds after SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpo.launchers.slurm import JobStatus

__all__ = ["worker_settings", "stop_grace", "restart_count", "release_own_lease", "main"]

_POLL_S = 0.1
_WAY_OUT_S = 5  # kept from SLURM's deadline for the study's own exit and the job's record


def worker_settings(env: Mapping[str, str], workers_per_node: int,
                    gpus_per_worker: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``distributed.Worker`` options of this srun task, and the environment it changes.

    CPUs come from SLURM (``SLURM_CPUS_PER_TASK``, else the node's CPUs
    shared among its workers); they become both the thread count and the
    ``CPU`` resource the hpo dask engine requests.
    """
    local = int(env.get("SLURM_LOCALID", "0"))
    cpus = int(env.get("SLURM_CPUS_PER_TASK") or 0) or max(
        1, int(env.get("SLURM_CPUS_ON_NODE", "1")) // workers_per_node)
    resources = {"CPU": cpus}
    changes = {}
    if gpus_per_worker:
        visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        mine = visible[local * gpus_per_worker:(local + 1) * gpus_per_worker]
        if len(mine) < gpus_per_worker:
            raise SystemExit(f"hpo dask_node: task {local} needs {gpus_per_worker} GPU(s) but the "
                             f"node shows CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}")
        changes["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        resources["GPU"] = gpus_per_worker
    name = f"{env.get('SLURMD_NODENAME', 'node')}-{local}"
    return {"nthreads": cpus, "resources": resources, "name": name}, changes


def stop_grace(requested: float, kill_wait: float | None, stop_before: int) -> float:
    """The stop grace that fits the job: a stop must be over before SLURM's
    SIGKILL, ``KillWait`` after SIGTERM and ``stop_before`` after USR1.

    >>> stop_grace(30, 30, 300), stop_grace(30, 20, 300), stop_grace(120, 300, 60), stop_grace(30, 2, 30)
    (25, 15, 55, 1)
    """
    limits = [requested, stop_before - _WAY_OUT_S, (kill_wait or 30) - _WAY_OUT_S]
    return max(1, min(limits))


# -- the scheduler and a worker ------------------------------------------------------


async def _first(*waits: Awaitable) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _serve_scheduler(scheduler_file: str, interface: str | None) -> int:
    from distributed import Scheduler
    from distributed.utils import get_ip

    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # SLURM's SIGTERM also reaches the study, which needs the scheduler to stop cleanly.
    loop.add_signal_handler(signal.SIGTERM, _say, "hpo: SIGTERM; the scheduler stays up until the "
                            "study has stopped")
    # Bound to the address the workers reach; the dashboard to this node only.
    where = {"interface": interface} if interface else {"host": get_ip()}
    async with Scheduler(port=0, scheduler_file=scheduler_file, dashboard_address="127.0.0.1:0",
                         **where) as scheduler:
        await _first(stop.wait(), scheduler.finished())
    return 0


def _listen_where(scheduler_file: str, interface: str | None) -> dict[str, str]:
    """Where a worker listens: ``interface``, else the address through which
    this node reaches the scheduler (waits for its scheduler file)."""
    if interface:
        return {"interface": interface}
    from distributed.utils import get_ip, json_load_robust

    scheduler = json_load_robust(scheduler_file)["address"]
    return {"host": get_ip(scheduler.split("://")[-1].rsplit(":", 1)[0])}


async def _serve_worker(scheduler_file: str, options: dict[str, Any], grace: float) -> int:
    from distributed import Worker
    from distributed.worker import WORKER_ANY_RUNNING

    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Worker(scheduler_file=scheduler_file, dashboard_address="127.0.0.1:0",
                      **options) as worker:
        await _first(stop.wait(), worker.finished())
        if stop.is_set() and worker.status in WORKER_ANY_RUNNING:
            return await _leave(worker, grace)
    return 0


async def _leave(worker, grace: float) -> int:
    """SIGTERM: running trials checkpoint and suspend, the study takes their
    results, then the worker closes; a trial still running after the grace
    is left to the next run (resumed from its last checkpoint)."""
    from distributed.core import Status

    from hpo.trial import request_suspend

    request_suspend("SIGTERM")
    worker.status = Status.closing_gracefully  # the scheduler sends nothing new here
    deadline = time.monotonic() + grace
    # A result still held here would be computed again elsewhere if the
    # worker left before the study released it.
    while (worker.state.executing_count or len(worker.data)) and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
    stuck = worker.state.executing_count
    print(f"hpo: worker {worker.name}: SIGTERM; " + (
        f"{stuck} trial(s) still running after the {grace:g} s grace" if stuck
        else "its trials have stopped"), file=sys.stderr)
    await worker.close(reason="SIGTERM", executor_wait=not stuck, nanny=False)
    if stuck:
        os._exit(1)  # the threads of a stuck objective must not keep the process alive
    return 0


# -- waiting, the stop grace, the record of the end ----------------------------------


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


def _kill_wait() -> float | None:
    """SLURM's KillWait (seconds from SIGTERM to SIGKILL), or None if unknown."""
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in shown.splitlines():
        words = line.split()
        if words[:2] == ["KillWait", "="] and len(words) > 2 and words[2].isdigit():
            return float(words[2])
    return None


def _grace(stop_before: int) -> int:
    from hpo.trial import stop_grace_s

    requested, kill_wait = stop_grace_s(), _kill_wait()
    grace = stop_grace(requested, kill_wait, stop_before)
    if grace < requested:
        print(f"hpo: stop grace {grace:g} s instead of HPO_STOP_GRACE_S={requested:g}: a stop must "
              f"end before SLURM's SIGKILL (KillWait {kill_wait or '?'} s, --stop-before "
              f"{stop_before} s)", file=sys.stderr)
    print(f"{grace:g}")
    return 0


def restart_count(env: Mapping[str, str]) -> int:
    """How often SLURM requeued this job before this run (0: its first run)."""
    return int(env.get("SLURM_RESTART_COUNT") or 0)


def _begin(run_dir: Path, job_id: str, scheduler_file: Path) -> int:
    """Ready the job's folder for this run; see the module's docstring."""
    from hpo.launchers.records import keep_earlier_ending

    restart = restart_count(os.environ)
    if restart:
        print(f"hpo: SLURM requeued job {job_id} (restart {restart}): the script starts over "
              "and the study resumes")
    kept = keep_earlier_ending(run_dir, job_id)
    if kept is not None:
        print(f"hpo: the earlier run's record of its end is kept as {kept}")
    scheduler_file.unlink(missing_ok=True)
    if release_own_lease(run_dir, job_id):
        print(f"hpo: released the study's lease, held by the earlier run of job {job_id} (dead)")
    return 0


def release_own_lease(run_dir: Path, job_id: str) -> bool:
    """Remove the study's lease if an earlier run of this very job holds it:
    SLURM starts a requeued job only once its earlier run is gone, so that
    master is dead, though its lease may look live for a while (another node,
    renewed lately). True when released.

    The lease is moved aside before it is removed, and put back if what was
    moved is not what was read: another master may have taken it meanwhile.
    """
    from hpo.store import MasterLease

    lease = MasterLease(run_dir)
    held = lease.holder()  # None: free, or stale (the study's master takes it over)
    if held is None or str(held.get("slurm_job")) != str(job_id):
        return False
    path = lease.path
    aside = path.with_name(f"{path.name}.requeued-{job_id}-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if _read_json(aside) != held:
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink()
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ended(run_dir: Path, job_id: str, status: int, resubmit: str) -> int:
    from hpo.launchers.outcome import exit_line, study_ending

    ending = {**study_ending(run_dir, status), "restart": restart_count(os.environ)}
    _record(run_dir, job_id, ending)  # first: SLURM may kill this soon after a stop
    more = _seen_by_slurm(job_id, status, ending["restart"])
    if more:
        ending.update(more)
        _record(run_dir, job_id, ending)
    print(exit_line(ending, resubmit))
    return ending["reported_exit"]


def _seen_by_slurm(job_id: str, status: int, restart: int) -> dict[str, Any]:
    """What SLURM adds about this run's end: ``requeued`` when it runs the job
    again (``scontrol requeue``, a preemption: it counts the restart before
    this run is over), and ``said``, the study's last words in the job's
    output, for an exit that is neither a success nor a clean stop."""
    from hpo.launchers.outcome import CLEAN_STOPS

    job = _own_job(job_id)
    more: dict[str, Any] = {}
    if job is None:
        return more
    if int(job.restarts or 0) > restart:
        more["requeued"] = True
    if status not in (0, *CLEAN_STOPS) and job.stdout:
        more["said"] = _study_said(Path(job.stdout))
    return more


def _record(run_dir: Path, job_id: str, ending: dict[str, Any]) -> None:
    from hpo.launchers.records import write_ending

    try:
        write_ending(run_dir, job_id, ending)
    except OSError as exc:
        print(f"hpo: warning: could not record how the study ended: {exc}", file=sys.stderr)


def _own_job(job_id: str) -> JobStatus | None:
    """This job as SLURM sees it now (restarts, output file), or None."""
    from hpo.errors import UsageError
    from hpo.launchers.slurm import SlurmProvider, run_command

    try:
        return SlurmProvider(lambda argv: run_command(argv, timeout=10)).status([job_id])[job_id]
    except (OSError, UsageError, subprocess.TimeoutExpired):
        return None


def _study_said(output: Path) -> list[str]:
    """What the study said last in the job's output ([] if unreadable)."""
    from hpo.launchers.outcome import study_message

    try:
        return study_message(output.read_text(errors="replace"))
    except OSError:
        return []


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpo.launchers.dask_node")
    sub = parser.add_subparsers(dest="what", required=True)
    scheduler = sub.add_parser("scheduler", help="run the job's scheduler until SIGINT")
    scheduler.add_argument("--scheduler-file", required=True)
    scheduler.add_argument("--interface")
    worker = sub.add_parser("worker", help="run this srun task's worker")
    worker.add_argument("--scheduler-file", required=True)
    worker.add_argument("--workers-per-node", type=int, default=1)
    worker.add_argument("--gpus-per-worker", type=int, default=0)
    worker.add_argument("--interface")
    wait = sub.add_parser("wait", help="wait until the workers joined")
    wait.add_argument("--scheduler-file", required=True)
    wait.add_argument("--workers", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=300)
    begin = sub.add_parser("begin", help="ready the job's folder for this run (a requeued "
                           "job's earlier record, scheduler file and lease)")
    begin.add_argument("--run-dir", required=True, type=Path)
    begin.add_argument("--job", required=True)
    begin.add_argument("--scheduler-file", required=True, type=Path)
    tls = sub.add_parser("tls", help="write the job's certificate and key (mode 0600)")
    tls.add_argument("--dir", required=True, type=Path)
    grace = sub.add_parser("grace", help="print the stop grace that fits the job")
    grace.add_argument("--stop-before", type=int, required=True)
    ended = sub.add_parser("ended", help="record how the study ended; exit with the job's status")
    ended.add_argument("--run-dir", required=True, type=Path)
    ended.add_argument("--job", required=True)
    ended.add_argument("--status", required=True, type=int)
    ended.add_argument("--resubmit", default="hpo submit ... (the same command)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.what == "scheduler":
        return asyncio.run(_serve_scheduler(args.scheduler_file, args.interface))
    if args.what == "worker":
        from hpo.trial import stop_grace_s

        options, changes = worker_settings(os.environ, args.workers_per_node, args.gpus_per_worker)
        os.environ.update(changes)  # before any trial runs (and initialises CUDA)
        options.update(_listen_where(args.scheduler_file, args.interface))
        return asyncio.run(_serve_worker(args.scheduler_file, options, stop_grace_s()))
    if args.what == "wait":
        return _wait(Path(args.scheduler_file), args.workers, args.timeout)
    if args.what == "tls":
        from hpo.launchers.tls import write_identity

        write_identity(args.dir)
        return 0
    if args.what == "grace":
        return _grace(args.stop_before)
    if args.what == "begin":
        return _begin(args.run_dir, args.job, args.scheduler_file)
    return _ended(args.run_dir, args.job, args.status, args.resubmit)


if __name__ == "__main__":
    sys.exit(main())
