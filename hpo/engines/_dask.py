"""Dask distributed: an embedded LocalCluster, or an existing scheduler.

A trial's CPUs and GPUs become Dask worker resources (abstract labels: workers
declare ``--resources "CPU=4 GPU=1"``, tasks request what they need). Dask
queues a task that no worker can ever satisfy forever, silently, so requests
are checked against the workers before anything is submitted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hpo.allocation import Device, Inventory, Node
from hpo.engines._base import Engine
from hpo.engines._main_guard import refuse_unguarded_main
from hpo.errors import EngineError, EngineLost, UsageError
from hpo.machine import refuse_beyond_this_machine, visible_gpus
from hpo.store import TrialLink
from hpo.trial import SILENT_HEARTBEATS, Awake, TrialTask, awake_since, heartbeat_s, run_trial, silence_s

__all__ = ["DaskEngine"]

_HOLD_CHECK_S = 5.0
_REMOTE_FIX = "start workers with --resources {resources} on bigger nodes and pass --scheduler"


class DaskEngine(Engine):
    """Runs trials as Dask tasks.

    Parameters
    ----------
    scheduler:
        Address (``tcp://host:8786``) or scheduler-file path of a running
        scheduler (its security is the site's: Dask's configuration); None
        starts a cluster on 127.0.0.1, speaking mutual TLS with an identity
        of its own: for CPU trials a LocalCluster, for GPU trials one worker
        per group of ``gpus`` visible GPUs, each with its own
        ``CUDA_VISIBLE_DEVICES``.
    workers:
        Worker processes of the embedded cluster (default: one per trial slot
        that fits the machine's cores, or its GPUs).
    cpus, gpus:
        What the smallest trial needs (it sizes the slots; each task asks for
        its own shape).
    largest:
        The largest trial's (cpus, gpus, nodes): a study none of whose workers
        could run it is refused before anything is recorded.
    retries:
        Dask ``retries=`` for a task that raised (infrastructure faults only;
        user errors are recorded by the trial wrapper, never raised). A worker
        that dies under a task is Dask's ``allowed-failures`` instead.
    """

    name = "dask"

    @classmethod
    def from_spec(cls, spec, *, scheduler=None, workers=None) -> DaskEngine:
        if scheduler and workers:
            raise UsageError("--workers sizes the embedded Dask cluster; with --scheduler the running "
                             "workers are used.\n  fix: drop one of --workers and --scheduler")
        smallest, largest = spec.shape_bounds
        return cls(scheduler, workers or spec.search.parallel, smallest.cpus, smallest.gpus,
                   spec.retries.engine, largest=(largest.cpus, largest.gpus, largest.nodes))

    def __init__(self, scheduler: str | None = None, workers: int | None = None,
                 cpus: int = 1, gpus: float = 0, retries: int = 0,
                 largest: tuple[int, float, int] | None = None) -> None:
        self.scheduler, self.workers = scheduler, workers
        self.cpus, self.gpus, self.retries = cpus, gpus, retries
        self.largest = largest or (cpus, gpus, 1)
        self._holders: dict[str, list] = {}  # a multi-node trial's key -> its other nodes' tasks
        self.client: Any = None  # a distributed.Client while started
        self._cluster: Any = None
        self._declares_cpu = False  # whether workers offer a CPU resource to ask for
        self._slots = 0
        self._live: dict[str, DaskTask] = {}  # tasks not over yet, by key
        self._moved: set[str] = set()  # keys of tasks whose hung worker was taken out
        self._unanswered: dict[str, int] = {}  # silent holders' direct questions left unanswered in a row
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        if scheduler is None:  # the embedded cluster runs on this machine
            big_cpus, big_gpus, nodes = self.largest
            if nodes > 1:
                raise EngineError(
                    f"$.resources.nodes: a trial asks for {nodes} nodes, and the embedded Dask "
                    "cluster is this machine alone.\n  fix: start a worker per node and pass "
                    "--scheduler, or use hpo submit")
            refuse_beyond_this_machine(big_cpus, big_gpus, _REMOTE_FIX)
            refuse_unguarded_main()  # its worker processes import the main script again

    def start(self) -> None:
        from distributed import Client

        # A scheduler that dies mid-write makes distributed log "Batched Comm Closed"
        # with its traceback at INFO; the master says it once, as EngineLost.
        logging.getLogger("distributed.batched").setLevel(logging.WARNING)

        if self.scheduler is None:
            gpu_study = self.largest[1] > 0
            self._cluster = self._local_gpu_cluster() if gpu_study else self._local_cpu_cluster()
            self.client = Client(self._cluster, security=self._cluster.security)
        else:  # the site's scheduler: its security is the site's (Dask's configuration)
            self.client = self._reach(self.scheduler)
        self._plan_resources()
        self._closing.clear()
        self._watcher = threading.Thread(target=self._watch, name="hpo-dask-watch", daemon=True)
        self._watcher.start()

    @staticmethod
    def _reach(scheduler: str):
        """A client of the running scheduler, with one joined worker; refused
        (exit 2) before anything is recorded when there is none."""
        client = _connect(scheduler)
        try:
            client.wait_for_workers(1, timeout=120)
        except TimeoutError:
            client.close()
            raise EngineError(f"--scheduler {scheduler}: no Dask worker joined in 120 s.\n"
                              "  fix: start workers (dask worker --scheduler-file FILE)") from None
        return client

    def _local_cpu_cluster(self):
        from dask.system import CPU_COUNT  # this process's share: affinity, cgroup (SLURM)

        n = self.workers or max(1, CPU_COUNT // self.cpus)
        return _private_cluster(n_workers=n, threads_per_worker=1, resources={"CPU": self.cpus})

    def _local_gpu_cluster(self):
        """One worker holding this machine's visible GPUs (a ``GPU`` resource of
        their count, their ids in ``CUDA_VISIBLE_DEVICES``), with a thread per
        trial that fits: the master places each trial on its own GPU ids."""
        from dask.system import CPU_COUNT

        ids = visible_gpus()
        fit = min(int(len(ids) / (self.gpus or 1) + 1e-9), CPU_COUNT // self.cpus)
        return _private_cluster(
            n_workers=1, threads_per_worker=max(1, min(self.workers or fit, fit)),
            resources={"GPU": len(ids), "CPU": CPU_COUNT}, env={"CUDA_VISIBLE_DEVICES": ",".join(ids)})

    def _plan_resources(self) -> None:
        """Check that some worker runs the largest trial, and count the slots
        (how many of the smallest run at once) from the workers."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        declared = [w.get("resources", {}) for w in workers]
        self._declares_cpu = any("CPU" in r for r in declared)
        big_cpus, big_gpus, _ = self.largest
        wanted: dict[str, float] = {"GPU": math.ceil(big_gpus)} if big_gpus else {}
        if self._declares_cpu:
            wanted["CPU"] = big_cpus
        fits = [_how_many(r, w["nthreads"], wanted) for r, w in zip(declared, workers)]
        small = self._requests(self.cpus, self.gpus)
        slots = [min(_how_many(r, w["nthreads"], small), w["nthreads"]) for r, w in zip(declared, workers)]
        if not any(fits):
            have = sorted({" ".join(f"{k}={v}" for k, v in r.items()) or "none" for r in declared})
            need = " ".join(f"{k}={v}" for k, v in wanted.items())
            raise EngineError(
                f"$.resources: no Dask worker can run a trial needing {need}; workers offer: "
                f"{', '.join(have)}.\n"
                f"  fix: start workers with --resources \"{need}\", or lower \"resources\" in the space"
            )
        self._slots = max(1, sum(slots))

    def _requests(self, cpus: int, gpus: float) -> dict[str, float]:
        """The Dask resources a trial of ``cpus`` and ``gpus`` asks for."""
        wanted: dict[str, float] = {"GPU": gpus} if gpus else {}
        if self._declares_cpu:
            wanted["CPU"] = cpus
        return wanted

    def inventory(self) -> Inventory:
        """The workers as nodes: host, CPUs, GPU ids and their declared
        speeds (``HPO_GPU_SPEEDS``, one per id in ``CUDA_VISIBLE_DEVICES``)."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        devices = self.client.run(_worker_devices)
        nodes = []
        for address, worker in sorted(info.items()):
            declared = worker.get("resources", {})
            ids, speeds = devices.get(address, ([], []))
            count = int(declared.get("GPU", 0))
            nodes.append(Node(host=worker.get("host") or urlsplit(address).hostname, worker=address,
                              cpus=int(declared.get("CPU", worker["nthreads"])),
                              devices=[Device(i, s) for i, s in list(zip(ids, speeds))[:count]]))
        return Inventory(nodes)

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def local(self) -> bool:
        """A scheduler on a loopback address has its workers on this machine
        (no other host could reach it); any other may have them anywhere."""
        if self.client is None:
            return self.scheduler is None
        host = urlsplit(self.client.scheduler.address).hostname or ""
        return host == "localhost" or host == "::1" or host.startswith("127.")

    def submit_many(self, tasks: Sequence[TrialTask], priority: bool = False) -> list[Future]:
        """Tasks the master placed nowhere in particular go to the scheduler
        in one message (``Client.map``: a tenth of a submit each)."""
        plain = [t for t in tasks if not t.workers]
        if len(plain) < 2 or len({(t.cpus, t.gpus) for t in plain}) > 1:
            return [self.submit(task, priority) for task in tasks]
        first = plain[0]
        futures = self.client.map(
            run_trial, plain, key=[self._key(t) for t in plain], pure=False, retries=self.retries,
            resources=self._requests(first.cpus, first.gpus) or None, priority=1 if priority else 0)
        by_task = {id(t): self._follow(f) for t, f in zip(plain, futures)}
        return [by_task[id(t)] if id(t) in by_task else self.submit(t, priority) for t in tasks]

    @staticmethod
    def _key(task: TrialTask) -> str:
        # An explicit key per trial and pure=False: two trials with equal
        # arguments must never collapse into one Dask task.
        return f"hpo-{task.study_name}-{task.number}-{uuid.uuid4().hex[:8]}"

    def submit(self, task: TrialTask, priority: bool = False) -> Future:
        key = self._key(task)
        resources = self._requests(task.cpus, task.gpus) or None
        workers = list(task.workers[:1]) if task.workers else None
        future = self.client.submit(
            run_trial, task, key=key, pure=False, retries=self.retries, resources=resources,
            priority=1 if priority else 0, workers=workers, allow_other_workers=False,
        )
        if len(task.workers) > 1:  # the trial's other nodes, held while it runs
            self._holders[key] = [self.client.submit(
                hold_node, task, key, key=f"{key}-node{rank}", pure=False, resources=resources,
                priority=1 if priority else 0, workers=[worker], allow_other_workers=False)
                for rank, worker in enumerate(task.workers[1:], start=1)]
        return self._follow(future)

    def _follow(self, dask_future: Any) -> DaskTask:
        """The master's future of a Dask task. Completion is learned from
        Dask's done-callback, without a round trip to the scheduler."""
        task = DaskTask(self, dask_future)
        self._live[task.key] = task
        dask_future.add_done_callback(lambda _: self._over(task))
        return task

    def _over(self, task: DaskTask) -> None:
        """A Dask task is over (on Dask's callback thread): its outcome goes
        to the master's future, and what Dask holds for it is let go."""
        self._live.pop(task.key, None)
        error: BaseException | None = None
        try:
            if task.dask.status == "cancelled" and self.client.status != "running":
                # Cancelled by the client itself: it lost the scheduler. The task
                # may still run on its worker, which writes its result to the store.
                error = EngineLost(f"lost the Dask scheduler at {self.scheduler} (the client is "
                                   f"{self.client.status})")
            elif task.dask.status != "finished":
                task.dask.result()  # raises the task's error; a success is not fetched
        except BaseException as exc:  # the task's own failure, for the master to gather
            error = exc
        finally:
            self._let_go(task)
        try:
            if error is None:
                task.set_result(None)
            else:
                task.set_exception(error)
        except InvalidStateError:
            pass  # the master cancelled it meanwhile

    def _let_go(self, task: DaskTask) -> None:
        """Release a task's Dask future (a lost worker would recompute a
        result kept on it) and its trial's other nodes."""
        self._moved.discard(task.key)
        try:
            task.dask.release()
            self._release_nodes(task.key)
        except Exception:  # the client is closing: the cluster lets go of it anyway
            pass

    def _cancel(self, task: DaskTask) -> None:
        """Cancel ``task``'s Dask task (a running one's result is dropped:
        its trial is told to stop through the store)."""
        task.dask.cancel()
        self._let_go(task)

    def abandon(self, task: DaskTask) -> None:
        """The worker running the task is taken out of the cluster: Dask
        would keep counting on a hung worker that keeps its connection until
        its own timeout (minutes), and send it the trial again. A task whose
        worker was taken out already (:meth:`_take_out_hung_holders`) is
        only cancelled: the worker Dask gave it to since is not the silent one."""
        def hung_worker(dask_scheduler, key: str = task.key) -> str | None:
            task = dask_scheduler.tasks.get(key)
            worker = task.processing_on if task is not None else None
            return worker.address if worker is not None else None

        try:
            address = None if task.key in self._moved else self.client.run_on_scheduler(hung_worker)
            if address is not None:
                self._take_out(address, "stopped answering for its trial; it is taken out of the "
                                        "cluster, and the trial runs again elsewhere")
        except OSError as exc:  # the scheduler is gone (a CommClosedError is one): not the trial's
            raise EngineLost(f"lost the Dask scheduler at {self.scheduler} while taking a silent "
                             f"worker out ({type(exc).__name__}: {exc})") from exc
        finally:
            task.cancel()

    def _watch(self) -> None:
        """Once a heartbeat, until shutdown: take out the hung workers
        holding tasks they never started."""
        awake = Awake(looks_every_s=heartbeat_s())  # this thread's own: it may be stopped with the master
        while not self._closing.wait(heartbeat_s()):
            awake.note()
            self._take_out_hung_holders([key for key, task in list(self._live.items()) if not task.done()],
                                        awake)

    def _take_out_hung_holders(self, keys: list[str], awake: Awake) -> None:
        """Take out of the cluster a worker that holds one of the tasks
        ``keys`` it never said it started, that Dask has heard nothing from
        for a silence window, and that then leaves ``SILENT_HEARTBEATS``
        direct questions in a row unanswered (stopped, swapping, cut off,
        yet connected): Dask then gives its tasks to other workers. The
        task's trial, not started, has no heartbeat to fall silent, and Dask
        would wait for its worker-ttl (minutes). Silence counts from when
        this process woke, if it slept (an embedded scheduler slept with
        it), as ``awake`` (or the master's loop) tells once the scheduler
        answered: a process stopped while it asked hears of silences that
        the stop made. After a sleep, the silence must last two windows:
        the scheduler and its workers first catch up on what the sleep held
        up."""
        if not keys or self.client is None or self.client.status != "running":
            self._unanswered = {}
            return
        try:
            holders = self._unheard_holders(keys)
        except Exception:  # the scheduler is gone or busy: the task's future says so, or the next look
            return
        # Either thread may be the one that saw the stop; after one, the
        # scheduler and its workers get a window more to catch up.
        since = max(awake.note(), awake_since())
        awake_for = time.time() - since
        needed = (2 if since else 1) * silence_s()
        suspects = {address: (unheard_s, held) for address, (unheard_s, enough_s, held) in holders.items()
                    if min(unheard_s, awake_for) >= max(needed, enough_s)}
        # Silence alone is no proof: a worker whose event loop an import held
        # up, or a scheduler starved by a loaded machine, is silent too, yet
        # answers when asked. A suspect goes only after SILENT_HEARTBEATS
        # direct questions in a row, a heartbeat each, that it left unanswered.
        try:
            unanswering = self._unanswering(list(suspects), timeout=heartbeat_s())
        except Exception:  # the scheduler is gone or busy: the next look asks again
            return
        if max(awake.note(), awake_since()) != since:  # this process slept while it asked
            self._unanswered = {}
            return
        self._unanswered = {a: self._unanswered.get(a, 0) + 1 for a in unanswering}
        for address in [a for a, times in self._unanswered.items() if times >= SILENT_HEARTBEATS]:
            unheard_s, held = suspects[address]
            self._moved.update(held)
            del self._unanswered[address]
            try:
                self._take_out(address, f"stopped answering for its trial (Dask heard nothing from "
                                        f"it for {unheard_s:.0f} s, and it left {SILENT_HEARTBEATS} "
                                        "questions unanswered); it is taken out of the cluster, and "
                                        "its trials run elsewhere")
            except OSError:  # the scheduler went meanwhile: the tasks' futures say so
                return

    def _unanswering(self, addresses: list[str], timeout: float) -> list[str]:
        """Those of the workers ``addresses`` that leave the scheduler's
        direct question (their identity) unanswered for ``timeout`` seconds:
        one stopped, swapping or cut off (its connection kept) never answers."""
        if not addresses:
            return []

        async def on_scheduler(dask_scheduler, addresses: list[str], timeout: float) -> list[str]:
            import asyncio

            async def answers(address: str) -> bool:
                try:
                    await asyncio.wait_for(dask_scheduler.rpc(address).identity(), timeout)
                    return True
                except OSError:  # no answer in time (a TimeoutError), or no connection
                    return False

            answered = await asyncio.gather(*(answers(address) for address in addresses))
            return [address for address, yes in zip(addresses, answered) if not yes]

        return self.client.run_on_scheduler(on_scheduler, addresses=addresses, timeout=timeout)

    def _unheard_holders(self, keys: list[str]) -> dict[str, tuple[float, float, list[str]]]:
        """The workers holding one of ``keys`` they did not say they started
        (at their last heartbeat), by address: how long the scheduler has
        heard nothing from each, the silence that ``SILENT_HEARTBEATS`` of
        Dask's heartbeat period make (it grows with the cluster), and the
        keys it holds."""
        def on_scheduler(dask_scheduler, keys: list[str], beats: int) -> dict[str, tuple]:
            from distributed.metrics import time as clock
            from distributed.scheduler import heartbeat_interval

            now, enough = clock(), beats * heartbeat_interval(len(dask_scheduler.workers))
            held: dict[str, tuple] = {}
            waiting = set()
            for key in keys:
                task = dask_scheduler.tasks.get(key)
                worker = task.processing_on if task is not None else None
                if worker is not None:
                    held.setdefault(worker.address, (now - worker.last_seen, enough, []))[2].append(key)
                    if task not in worker.executing:
                        waiting.add(worker.address)
            return {address: held[address] for address in waiting}

        # A function of this method's own is sent by value: the scheduler need not have hpo.
        return self.client.run_on_scheduler(on_scheduler, keys=keys, beats=SILENT_HEARTBEATS)

    def _take_out(self, address: str, message: str) -> None:
        """Remove a hung worker from the scheduler, its process left alone
        (it is not ours to end, and cannot answer), saying ``message``."""
        async def remove(dask_scheduler, address: str) -> None:
            await dask_scheduler.remove_worker(address=address, stimulus_id="hpo-worker-fell-silent",
                                               close=False)

        print(f"hpo: Dask worker {address} {message}", file=sys.stderr, flush=True)
        self.client.run_on_scheduler(remove, address=address)
        if not self.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.workers)):
            print("hpo: no Dask worker is left in the cluster; the study waits for one to join.\n"
                  "  fix: start workers (dask worker --scheduler-file FILE), or stop the study "
                  "(Ctrl-C) and run the same command again on a working cluster",
                  file=sys.stderr, flush=True)

    def run_on_every_worker(self, function, *args) -> dict:
        """``function(*args)`` on every worker connected now (``client.run``)."""
        return self.client.run(function, *args)

    def _release_nodes(self, key: str) -> None:
        """Let a multi-node trial's other nodes go."""
        holders = self._holders.pop(key, None)
        if holders:
            from distributed import Event

            Event(key, client=self.client).set()
            for holder in holders:
                holder.release()

    def shutdown(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        if self.client is not None:
            if self.client.status != "running":  # lost its scheduler: closing logs a traceback
                logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
            elif self._cluster is not None:
                # Our own workers are closed next: a heartbeat caught by the
                # scheduler's closing would print a traceback under hpo's message.
                try:
                    self.client.run(_quiet_distributed)
                except Exception:  # a worker already gone: nothing to quiet
                    pass
            self.client.close()
        if self._cluster is not None:
            # Our own workers, idle now: a nanny that ends one slow to exit (TensorFlow's
            # threads) says so as a warning after every run; nothing is lost by it.
            logging.getLogger("distributed.nanny").setLevel(logging.ERROR)
            self._cluster.close()
        self.client = self._cluster = None


class DaskTask(Future):
    """The master's future of a Dask task (a ``concurrent.futures.Future``,
    done when the Dask task is over); cancelling it cancels the Dask task."""

    def __init__(self, engine: DaskEngine, dask_future: Any) -> None:
        super().__init__()
        self.key: str = dask_future.key
        self.dask = dask_future
        self._engine = engine

    def cancel(self) -> bool:
        if not self.done():
            self._engine._cancel(self)
        return super().cancel()


# The embedded cluster's workers run this module's dask_setup as they start.
_PRELOAD = __name__


def _private_cluster(**options):
    """A LocalCluster on 127.0.0.1 that keeps the machine's other users out.

    Any local user reaches 127.0.0.1, and a Dask scheduler runs any function
    a client sends it. So every connection is mutual TLS with an identity
    made for this cluster and held in memory (the scheduler, the nannies,
    the workers and the master's client present it; a peer without it is
    refused in the handshake). The scheduler's web server, which no identity
    guards, keeps its health check alone: no dashboard, no task pages (the
    master never shows them)."""
    import dask
    from distributed import LocalCluster

    from hpo.launchers.tls import in_memory_security

    with dask.config.set({"distributed.scheduler.http.routes": ["distributed.http.health"]}):
        return LocalCluster(processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
                            scheduler_kwargs={"dashboard": False}, security=in_memory_security(),
                            preload=[_PRELOAD], **options)


def dask_setup(worker) -> None:
    """Ctrl-C is the master's: it stops the study cleanly (trials checkpoint
    and suspend on workers that go on running them). The embedded cluster's
    workers share the terminal's process group; without this, the terminal's
    SIGINT would end each of them with a page of tracebacks."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _quiet_distributed() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def _how_many(resources: dict[str, float], nthreads: int, wanted: dict[str, float]) -> int:
    """How many tasks asking ``wanted`` a worker offering ``resources`` holds
    (its threads when nothing is asked); GPU shares are fractions."""
    return int(min((resources.get(k, 0) / v for k, v in wanted.items()), default=nthreads) + 1e-9)


def hold_node(task: TrialTask, key: str) -> None:
    """A multi-node trial's task on one of its other nodes: holds the node's
    resources (the trial's own processes run there) until the master says the
    trial is over, or the trial has ended in the store (a master lost)."""
    from distributed import Event

    event, link = Event(key), TrialLink(task.storage, task.trial_id, task.control, master=task.master)
    while not event.wait(timeout=_HOLD_CHECK_S):
        if not link.unfinished():
            return


def _worker_devices() -> tuple[list[str], list[float]]:
    """This worker's GPU ids and their speeds (``HPO_GPU_SPEEDS``, else 1)."""
    ids = visible_gpus()
    declared = [float(s) for s in os.environ.get("HPO_GPU_SPEEDS", "").split(",") if s.strip()]
    return ids, [declared[i] if i < len(declared) else 1.0 for i in range(len(ids))]


def _connect(scheduler: str):
    from distributed import Client

    if Path(scheduler).is_file():
        try:
            json.loads(Path(scheduler).read_text())["address"]
        except (ValueError, KeyError, TypeError):
            raise EngineError(
                f"--scheduler {scheduler}: not a scheduler file (no JSON with an \"address\").\n"
                "  fix: pass the file given to `dask scheduler --scheduler-file`, or tcp://HOST:PORT"
            ) from None
        where = {"scheduler_file": scheduler}
    elif "://" in scheduler or ":" in scheduler:
        where = {"address": scheduler}
    else:
        raise EngineError(
            f"--scheduler {scheduler!r} is neither an existing scheduler file nor an address.\n"
            "  fix: pass tcp://HOST:PORT or the path given to `dask scheduler --scheduler-file`"
        )
    try:
        return Client(**where)
    except (OSError, TimeoutError, ValueError) as exc:  # nobody answers, or no address there
        raise EngineError(
            f"--scheduler {scheduler}: no Dask scheduler answers there ({type(exc).__name__}: {exc}).\n"
            "  fix: start one (dask scheduler --scheduler-file FILE) and pass its address or "
            "file, or drop --scheduler to use an embedded cluster") from None
