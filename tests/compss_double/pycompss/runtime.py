"""State of the fake runtime (not a real pycompss module; tests drive it).

What it does as the COMPSs 3.3 runtime does (see ``../README.md`` for the
source files behind each point):

- ``start`` reads the environment once: ``"$VAR"`` constraint values resolve
  from that copy, and an unresolved one silently becomes the default;
- worker nodes each offer ``cpus_per_node`` CPUs and ``gpus_per_node`` GPUs; a
  task runs on a node with enough free units, and as many run at once as fit;
  a task no node can ever serve stays blocked;
- the binding evaluates a ``computing_units``/``memory_size``/``storage_size``
  string that is neither digits nor ``$VAR`` and keeps ``int()`` of it
  (``binding_keeps``): ``"1.5"`` GB becomes 1, ``"0.5"`` none;
- a top-level ``computing_units`` and a CPU entry in ``processors`` add up;
- a ``@multinode`` task takes its constraints on ``computing_nodes`` distinct
  nodes at once, and runs with ``COMPSS_HOSTNAMES`` (one entry per process),
  ``COMPSS_NUM_NODES`` and ``COMPSS_NUM_THREADS`` set;
- a task that raises is retried (``RETRY``: on the same node, then on
  another), and one that still fails ends the application, as ``FAIL`` does;
  ``IGNORE`` gives its future None;
- ``time_out`` and cancelling a running task raise ``TimeOutError`` and
  ``CancelError`` inside it, wherever it is;
- ``compss_get_number_of_resources`` counts nodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import os
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from pycompss.util.context import CONTEXT
from pycompss.util.exceptions import CancelError, TimeOutError

declared: dict[str, dict] = {}   # function name -> {"task": kwargs, "constraint": kwargs}
submitted: list[dict] = []        # one entry per task call in master mode
groups: dict[str, list] = {}
waited_unfinished = 0             # compss_wait_on calls on futures not yet done
nodes = 2
cpus_per_node, gpus_per_node = 4, 0   # what each worker node offers (resources.xml)
environment: dict[str, str] = {}  # the environment the runtime read when it started
blocked: list[dict] = []          # tasks no node can serve: they never run, as in COMPSs
ended: str | None = None          # why the application ended (a task failed for good)
_scheduler: "_Scheduler | None" = None


class ApplicationEnded(BaseException):
    """The runtime ended the application (``ErrorManager.error``): under the
    real runtime the process exits; here every later API call raises this."""


def start(nodes: int = 2, cpus_per_node: int = 4, gpus_per_node: int = 0) -> None:
    """Start the runtime in master mode, as ``runcompss`` does before the program runs."""
    global environment, ended, _scheduler
    globals().update(nodes=nodes, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node)
    environment = dict(os.environ)
    ended = None
    _scheduler = _Scheduler(nodes, cpus_per_node, gpus_per_node)
    CONTEXT.where = CONTEXT.master


def stop() -> None:
    global _scheduler, waited_unfinished, ended
    waited_unfinished = 0
    if _scheduler is not None:
        _scheduler.shutdown()
        # COMPSs ends its worker processes as it stops, and with them the warm
        # processes their trials started; here the workers are this process.
        trials = sys.modules.get("hpo.trial")
        if trials is not None:
            trials.close_warm_processes()
    _scheduler = None
    ended = None
    CONTEXT.where = CONTEXT.out_of_scope
    declared.clear()
    blocked.clear()
    submitted.clear()
    groups.clear()


def scheduler() -> "_Scheduler":
    check_alive()
    return _scheduler


def check_alive() -> None:
    if ended is not None:
        raise ApplicationEnded(ended)


# -- constraints -----------------------------------------------------------------


def resolve(value: Any) -> Any:
    """A ``"$VAR"`` value from the environment as it was at start; None if unset."""
    if isinstance(value, str) and value.startswith("$"):
        return environment.get(value[1:])
    return value


# The keys whose string values the binding evaluates (spelled exactly so).
_EVALUATED = ("computing_units", "computingUnits", "memory_size", "memorySize", "storage_size",
              "storageSize")


def binding_keeps(constraints: dict) -> dict:
    """The constraints as the PyCOMPSs 3.3 binding hands them to the runtime
    at a task's first call in master mode (``TaskMaster.inspect_constraints``):
    a value of one of ``_EVALUATED`` that is a string neither of digits nor
    ``$VAR`` is evaluated and cut with ``int()`` ("1.5" -> 1, "0.5" -> 0); a
    name it cannot evaluate stays a string; anything else (a syntax error)
    raises, as the binding does."""
    kept = dict(constraints)
    for key, value in constraints.items():
        if key not in _EVALUATED or not isinstance(value, str) or value.isdigit() \
                or value.startswith("$"):
            continue
        try:
            kept[key] = int(eval(value, {"__builtins__": {}}, {}))  # noqa: S307 - as the binding
        except NameError:
            pass
    return kept


def describe(constraints: dict) -> dict:
    """What a task asks for, as the runtime's parser adds it up (unresolved
    values are defaults: 1 CPU, no memory limit, a GPU processor of 0 units)."""
    keys = {key.replace("_", "").lower(): value for key, value in constraints.items()}
    cpus = _units(resolve(keys.get("computingunits")))
    gpus = 0
    for processor in keys.get("processors", []):
        units = _units(resolve(processor.get("computingUnits", 1)))
        if processor.get("processorType") == "GPU":
            gpus += units
        elif processor.get("processorType") == "CPU":
            cpus += units
    memory = resolve(keys.get("memorysize"))
    return {"cpus": max(cpus, 1), "gpus": gpus,
            "memory_gb": (float(memory) or None) if memory not in (None, "") else None}


def _units(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# -- the scheduler -----------------------------------------------------------------


@dataclass
class _Node:
    index: int
    cpus: int
    gpus: int

    @property
    def name(self) -> str:
        return f"node{self.index}"

    def fits(self, demand: dict) -> bool:
        return demand["cpus"] <= self.cpus and demand["gpus"] <= self.gpus

    def take(self, demand: dict, sign: int = 1) -> None:
        self.cpus -= sign * demand["cpus"]
        self.gpus -= sign * demand["gpus"]


@dataclass(eq=False)
class _Job:
    name: str
    function: Callable
    args: tuple
    options: dict  # the @task keywords
    demand: dict
    future: Future = field(default_factory=Future)
    attempts: int = 0
    nodes: list = field(default_factory=list)
    thread_id: int | None = None
    running: bool = False
    cancelled: bool = False


class _Scheduler:
    """Queued jobs start on a node with free units; a priority job goes first."""

    def __init__(self, count: int, cpus: int, gpus: int) -> None:
        self._nodes = [_Node(i, cpus, gpus) for i in range(count)]
        self._capacity = _Node(-1, cpus, gpus)  # what an idle node offers
        self._jobs: list[_Job] = []  # queued or running
        self._queue: list = []
        self._order = itertools.count()
        self._lock = threading.RLock()
        self._closing = False

    def submit(self, name: str, function: Callable, args: tuple, options: dict,
               demand: dict) -> Future:
        job = _Job(name, function, args, options, demand)
        if not self._capacity.fits(demand) or demand.get("nodes", 1) > len(self._nodes):
            blocked.append({"function": name, "resources": demand})
            return job.future  # COMPSs keeps it Blocked until such a node appears
        with self._lock:
            self._jobs.append(job)
        self._enqueue(job)
        return job.future

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            first = 0 if job.options.get("priority", False) else 1
            heapq.heappush(self._queue, (first, next(self._order), job))
        self._dispatch()

    def _dispatch(self) -> None:
        with self._lock:
            if self._closing:
                return
            waiting = []
            while self._queue:
                entry = heapq.heappop(self._queue)
                job = entry[2]
                if job.cancelled:
                    continue
                free = [n for n in self._nodes if n.fits(job.demand)]
                if len(free) < job.demand.get("nodes", 1):
                    waiting.append(entry)
                    continue
                job.nodes = free[:job.demand.get("nodes", 1)]
                for node in job.nodes:
                    node.take(job.demand)
                job.running = True
                threading.Thread(target=self._run, args=(job,), daemon=True).start()
            for entry in waiting:
                heapq.heappush(self._queue, entry)

    def _run(self, job: _Job) -> None:
        job.thread_id = threading.get_ident()
        timer = None
        if job.options.get("time_out"):
            timer = threading.Timer(job.options["time_out"], self.interrupt, (job, TimeOutError))
            timer.start()
        try:
            try:
                with _multinode_environment(job):
                    outcome, error = job.function(*job.args), None
            finally:
                with self._lock:
                    job.running = False
                if timer is not None:
                    timer.cancel()
        except BaseException as exc:  # noqa: BLE001 - the task failed (or was interrupted)
            outcome, error = None, exc
        with self._lock:
            for node in job.nodes:
                node.take(job.demand, sign=-1)
            self._jobs.remove(job)
        if job.cancelled:
            job.future.cancel() or job.future.set_result(None)
        elif error is None:
            job.future.set_result(outcome)
        else:
            self._failed(job, error)
        self._dispatch()

    def _failed(self, job: _Job, error: BaseException) -> None:
        policy = job.options.get("on_failure", "RETRY")
        if policy in ("IGNORE", "CANCEL_SUCCESSORS"):
            job.future.set_result(None)  # the worker returns the defaults
            return
        job.attempts += 1
        if policy == "RETRY" and job.attempts < 3:  # the same node, then another
            with self._lock:
                self._jobs.append(job)
            self._enqueue(job)
            return
        end_application(f"task {job.name} failed after {job.attempts} attempt(s): "
                        f"{type(error).__name__}: {error}")
        job.future.set_exception(ApplicationEnded(ended))

    def interrupt(self, job: _Job, kind: type[BaseException]) -> None:
        """Raise ``kind`` inside the running job, as the worker's signal handler does."""
        with self._lock:
            if job.running and job.thread_id is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(job.thread_id), ctypes.py_object(kind))

    def cancel(self, future: Future) -> None:
        with self._lock:
            for job in list(self._jobs):
                if job.future is future:
                    job.cancelled = True
                    if job.running:
                        self.interrupt(job, CancelError)
                    else:
                        self._jobs.remove(job)
                        future.cancel()
            self._queue = [e for e in self._queue if not e[2].cancelled]
            heapq.heapify(self._queue)

    def shutdown(self) -> None:
        with self._lock:
            self._closing = True
            for entry in self._queue:
                entry[2].future.cancel()
            self._queue.clear()



_environment = threading.Condition()
_sharing = [0, False]  # one-node tasks running; a @multinode task running


@contextlib.contextmanager
def _multinode_environment(job: _Job):
    """What a worker sets for a task: ``COMPSS_HOSTNAMES`` (one entry per
    process), ``COMPSS_NUM_NODES`` and ``COMPSS_NUM_THREADS``. The double's
    tasks share one process and its environment, so a @multinode task runs
    while no other task does (the real workers are separate processes)."""
    wide = job.demand.get("nodes", 1) > 1
    with _environment:
        _environment.wait_for(lambda: not _sharing[1] and (not wide or _sharing[0] == 0))
        if wide:
            _sharing[1] = True
        else:
            _sharing[0] += 1
    threads = job.demand.get("processes_per_node", 1)
    saved = dict(os.environ)
    if wide:
        names = [node.name for node in job.nodes for _ in range(threads)]
        os.environ.update(COMPSS_HOSTNAMES=",".join(names), COMPSS_NUM_NODES=str(len(job.nodes)),
                          COMPSS_NUM_THREADS=str(threads))
    try:
        yield
    finally:
        with _environment:
            if wide:
                os.environ.clear()
                os.environ.update(saved)
                _sharing[1] = False
            else:
                _sharing[0] -= 1
            _environment.notify_all()


def end_application(reason: str) -> None:
    global ended
    ended = reason
