"""What this machine offers the trials that run on it (the embedded Dask
cluster, the inline engine, the allocator, a framework's memory limit): its
CPU share and its visible GPUs."""

from __future__ import annotations

import math
import os
import subprocess

from hpo.errors import EngineError

__all__ = ["visible_gpus", "gpu_memory_gb", "node_cores", "trials_per_node", "refuse_beyond_this_machine"]


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [i for i in listed.replace(" ", "").split(",") if i and i != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def gpu_memory_gb(gpu: str | None = None) -> float | None:
    """The memory of GPU ``gpu`` (an nvidia-smi index), else of the smallest
    GPU; None where nvidia-smi shows none."""
    command = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(command + (["-i", gpu] if gpu else []), capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    sizes = [float(line) for line in out.split() if line.replace(".", "", 1).isdigit()]
    return min(sizes) / 1024 if sizes else None


def node_cores() -> int:
    """The cores of this node the job may use: SLURM's figure inside an
    allocation, else this process's affinity."""
    return int(os.environ.get("SLURM_CPUS_ON_NODE") or len(os.sched_getaffinity(0)))


def trials_per_node(cpus: int, gpus: int, cores: int, node_gpus: int) -> int:
    """How many trials of ``cpus`` CPUs and ``gpus`` GPUs a node of ``cores``
    cores and ``node_gpus`` GPUs holds at once (at least one)."""
    fit = cores // max(cpus, 1)
    if gpus:
        fit = min(fit, node_gpus // gpus)
    return max(fit, 1)


def refuse_beyond_this_machine(cpus: int, gpus: float, remote_fix: str) -> None:
    """Refuse a trial this machine can never serve, before the caller creates a
    run directory or a study (``gpus``: a share of one needs one);
    ``remote_fix`` says how to use bigger nodes."""
    from dask.system import CPU_COUNT  # this process's share (affinity, cgroup)

    if cpus > CPU_COUNT:
        raise EngineError(
            f"$.resources.cpus: the study asks for {cpus} CPUs per trial, and this "
            f"machine gives {CPU_COUNT}.\n  fix: lower \"resources\": {{\"cpus\": ...}} to at "
            f"most {CPU_COUNT}, or {remote_fix.format(resources=f'CPU={cpus}')}")
    whole = math.ceil(gpus)
    shown = visible_gpus() if whole else []
    if len(shown) < whole:
        raise EngineError(
            f"$.resources.gpus: the study asks for {whole} GPU(s) per trial, and this "
            f"machine shows {len(shown)} (CUDA_VISIBLE_DEVICES, nvidia-smi).\n  fix: lower "
            f"\"resources\": {{\"gpus\": ...}}, or {remote_fix.format(resources=f'GPU={whole}')}")
