"""How processes start inside an allocation: ``srun`` steps.

A launcher is a pure string transform: it wraps a command line so that it
runs as ``tasks_per_node`` tasks on each of ``nodes`` nodes. Values may be
shell expressions (``"$workers_per_node"``) evaluated in the batch script.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SrunLauncher"]


@dataclass(frozen=True)
class SrunLauncher:
    """``srun`` with one step for all tasks.

    ``--kill-on-bad-exit=0``: one worker dying must not end the others (Dask
    re-runs its tasks elsewhere). ``overrides`` is added verbatim (site
    needs such as ``--mpi=none``).

    >>> SrunLauncher()("dask worker", nodes=2, tasks_per_node=1, cpus_per_task=8)
    'srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=0 dask worker'
    """

    overrides: str = ""

    def __call__(self, command: str, nodes: int | str, tasks_per_node: int | str,
                 cpus_per_task: int | str | None = None) -> str:
        parts = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}"]
        if cpus_per_task is not None:
            parts.append(f"--cpus-per-task={cpus_per_task}")
        parts.append("--kill-on-bad-exit=0")
        if self.overrides:
            parts.append(self.overrides)
        parts.append(command)
        return " ".join(parts)
