"""The trial task: everything a worker needs to run one trial, filled by the master.

A task is small and picklable: COMPSs and Dask ship it to the worker, which
runs :func:`hpo.trial.run_trial` on it. It names the store by URL (the
journal and the study's relay), carries what the master knows of the stored
trial (:class:`~hpo.store.TrialContext`), so that the trial's process never
reads the store, and the shape and place the master chose.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpo.store import RunDir, TrialContext, context_of
from hpo.store.records import TrialStatus
from hpo.trial._ending import log_start
from hpo.trial._objective import Objective, objective_path
from hpo.trial._pulse import heartbeat_s as period_here
from hpo.trial._quantum import QuantumRule

if TYPE_CHECKING:
    from hpo.allocation import Placement, TrialShape
    from hpo.data import DataSection
    from hpo.space import StudySpec

__all__ = ["TrialTask", "TrialOutcome", "device_environment", "assigned_gpus", "where", "gpu_total"]


@dataclass(frozen=True)
class TrialTask:
    """Everything a worker needs to run one trial; small and picklable."""

    storage: str
    study_name: str
    trial_id: int
    number: int
    config: dict[str, Any]
    objective: str | Objective
    metric: str
    checkpoint_dir: str
    # Every objective's metric, in order, in a multi-objective study; else empty.
    objectives: tuple[str, ...] = ()
    cpus: int = 1
    gpus: float = 0  # whole GPUs, or a share of one (0.25)
    time_limit_s: float | None = None
    nodes: int = 1
    memory_gb: float | None = None
    # Where the master placed it, on engines that let it choose (else the
    # engine's own binding, e.g. COMPSs's CUDA_VISIBLE_DEVICES, holds): its GPU
    # ids, the hosts of its nodes in rank order, its share of each GPU and
    # the relative speed of its slowest one.
    devices: tuple[str, ...] | None = None
    hosts: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()  # the engine's addresses of those nodes
    gpu_share: float = 1.0
    device_speed: float | None = None
    # Time this many first batches (trial.batch()) and record the training rate.
    profile_batches: int = 0
    # Rate allocation: the master may grow it onto more GPUs (it suspends, checkpointed).
    resizable: bool = False
    # The space's early_stopping settings (patience...; the master prunes).
    early_stopping: dict[str, Any] | None = None
    direction: str = "maximize"
    # Time-shared scheduling: the quanta after which the trial may yield its
    # slot (checkpointed, to resume in a later task); None: run to the end.
    quantum: QuantumRule | None = None
    # The trial's last segment index when this task was made (-1: none): the
    # task is over once the trial finishes or suspends after a later segment.
    after_segment: int = -1
    # How many more times a failing objective runs (the study's objective retries).
    retries: int = 0
    # Run the objective in a fresh child process: needed for a hard time limit,
    # and for GPU trials (a process that has initialised CUDA ignores later
    # changes of CUDA_VISIBLE_DEVICES, and COMPSs reuses worker processes).
    isolate: bool = False
    # The study's control file (decisions, when the relay cannot be reached).
    control: str | None = None
    # What the master knows of the stored trial: its run record, heartbeat,
    # reports and segments (the trial's process never reads the store).
    context: TrialContext = field(default_factory=lambda: context_of(None))
    # The lease token of the master that made it: a write around the relay
    # checks the study is still that master's.
    master: str | None = None
    # It runs inside the master's process (the inline engine): a trial that
    # ends that process twice is failed, not run a third time.
    in_master: bool = False
    # The study's data section: what trial.data_path stages on the node.
    data: DataSection | None = None
    # Folders the objective module is imported from first (objective_path:
    # the space file's folder and the master's current directory).
    pythonpath: tuple[str, ...] = ()
    # The master's heartbeat period (HPO_HEARTBEAT_S where it runs): it judges
    # the trial lost after missing a few, whatever the worker's environment says.
    heartbeat_s: float = field(default_factory=period_here)
    # Whether the task waits for its trial's end to be durable before it
    # returns. The master's tasks do not where they run on its host (the
    # slot is free once the relay holds the end; the master settles it).
    end_waits: bool = True

    @classmethod
    def for_trial(cls, spec: StudySpec, run_dir: RunDir, storage: str, number: int,
                  trial_id: int, params: dict[str, Any], *, quantum: QuantumRule | None = None,
                  after_segment: int = -1, objective: str | Objective | None = None,
                  shape: TrialShape | None = None, placement: Placement | None = None,
                  profile_batches: int = 0, resizable: bool = False,
                  context: TrialContext | None = None, master: str | None = None,
                  end_waits: bool = True) -> TrialTask:
        """The task of trial ``number`` of the study ``spec`` (``objective``
        replaces the space's when given), of ``shape`` (default: the one its
        configuration asks for), on ``placement`` when the master chose it;
        ``context`` is what the master knows of the stored trial (a new
        trial's is empty)."""
        shape = shape or spec.shape_of({**spec.fixed, **params})
        return cls(
            storage=storage, study_name=spec.name, trial_id=trial_id, number=number,
            config={**spec.fixed, **params}, objective=objective or spec.objective,
            metric=spec.metric.name, checkpoint_dir=str(run_dir.checkpoint_dir(number)),
            objectives=tuple(m.name for m in spec.metrics) if spec.multi_objective else (),
            cpus=shape.cpus, gpus=shape.gpus, time_limit_s=shape.time_limit_s,
            nodes=shape.nodes, memory_gb=shape.memory_gb,
            devices=placement.devices if placement else None,
            hosts=placement.hosts if placement else (),
            workers=tuple(w for w in placement.workers if w) if placement else (),
            gpu_share=shape.gpus if shape.shared else 1.0,
            device_speed=placement.speed if placement else None,
            profile_batches=profile_batches, resizable=resizable,
            early_stopping=spec.early_stopping_settings,
            direction=spec.metric.direction, quantum=quantum,
            after_segment=after_segment, retries=spec.retries.objective,
            isolate=shape.time_limit_s is not None or shape.gpus > 0,
            control=str(run_dir.control_file), context=context or context_of(None), master=master,
            data=spec.data, pythonpath=tuple(objective_path(spec.source)), end_waits=end_waits,
        )


@dataclass(frozen=True)
class TrialOutcome:
    """What the master gets back; the store holds the rest."""

    number: int
    state: TrialStatus
    value: float | None = None


def where(task: TrialTask) -> dict[str, Any]:
    """Where an attempt of ``task`` runs, as its run record keeps it."""
    place = {"host": socket.gethostname(), "pid": os.getpid(), "cpus": task.cpus,
             "gpus": assigned_gpus(task), "binded_cpus": os.environ.get("COMPSS_BINDED_CPUS")}
    if task.in_master:
        place["in_master"] = True
        if not task.isolate:  # its objective runs in the master's own process
            place["log_at"] = log_start(task.checkpoint_dir)
    if task.gpus or task.nodes > 1:  # its shape, as the dashboard shows it
        place.update(gpu_count=task.gpus, nodes=task.nodes, hosts=list(task.hosts) or None,
                     gpu_share=task.gpu_share, device_speed=task.device_speed)
    return place


def gpu_total(task: TrialTask) -> float:
    """GPUs the trial holds over all its nodes: what its time costs."""
    return task.gpus * task.nodes


def device_environment(task: TrialTask) -> dict[str, str]:
    """What tells the trial's process its GPUs and nodes: the master's
    placement, where it chose one (COMPSs sets CUDA_VISIBLE_DEVICES itself)."""
    env: dict[str, str] = {}
    if task.devices is not None and task.gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(task.devices)
    if task.gpus > 0:
        # Frameworks' memory limits read it (hpo.keras.limit_gpu_memory, torch's
        # set_per_process_memory_fraction): trials sharing a GPU share its memory.
        env["HPO_GPU_MEMORY_FRACTION"] = f"{task.gpu_share:g}"
    if task.hosts:
        env["HPO_HOSTS"] = ",".join(task.hosts)
    if task.device_speed is not None:
        env["HPO_DEVICE_SPEED"] = f"{task.device_speed:g}"
    return env


def assigned_gpus(task: TrialTask) -> list[str]:
    """The GPU ids the trial runs on: the master's placement, else the engine's binding."""
    if task.gpus <= 0:
        return []
    if task.devices is not None:
        return list(task.devices)
    ids = os.environ.get("COMPSS_BINDED_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [i for i in ids.replace(",", " ").split() if i]
