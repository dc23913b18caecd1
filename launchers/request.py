"""What a batch submission asks of the cluster, checked before anything is sent."""

from __future__ import annotations

from dataclasses import dataclass

from hpo.errors import UsageError

__all__ = ["BatchRequest", "SIGNAL_SLACK_S"]

# SLURM checks time limits about every 30 s, so its warning signal may come
# up to this much earlier than asked.
SIGNAL_SLACK_S = 30
# A stop margin above this share of the walltime is warned about.
_MARGIN_SHARE = 0.25


@dataclass(frozen=True)
class BatchRequest:
    """Nodes, walltime and the site's accounting options of one batch job.

    Parameters
    ----------
    nodes, time_min:
        Nodes and walltime in minutes (``sbatch --time``, ``enqueue_compss --exec_time``).
    cpus_per_node, gpus_per_node, mem_per_node_gb:
        What each node offers the study; ``cpus_per_node=None`` asks for whole
        nodes (``--exclusive``) and uses every CPU SLURM gives.
    partition, qos, account:
        ``--partition`` / ``--qos`` / ``--account`` (COMPSs: ``--queue``,
        ``--qos``, ``--project_name``).
    stop_before_s:
        Seconds before the walltime at which the study is told to stop
        cleanly; None picks 10% of the walltime, between 30 s and 5 min.
    extra:
        Options passed verbatim to sbatch (``#SBATCH`` lines) or enqueue_compss.
    """

    nodes: int
    time_min: int
    cpus_per_node: int | None = None
    gpus_per_node: int = 0
    mem_per_node_gb: int | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    stop_before_s: int | None = None
    extra: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise UsageError naming the option and the fix."""
        _at_least("--nodes", self.nodes, 1)
        _at_least("--time", self.time_min, 1, "minutes of walltime")
        if self.cpus_per_node is not None:
            _at_least("--cpus-per-node", self.cpus_per_node, 1)
        _at_least("--gpus-per-node", self.gpus_per_node, 0)
        if self.mem_per_node_gb is not None:
            _at_least("--mem-per-node-gb", self.mem_per_node_gb, 1)
        if self.stop_before_s is not None:
            _at_least("--stop-before", self.stop_before_s, 1, "seconds")
            if self.stop_before_s >= self.time_min * 60:
                raise UsageError(
                    f"--stop-before {self.stop_before_s}: the study would be told to stop before "
                    f"it starts (walltime {self.time_min} min = {self.time_min * 60} s).\n"
                    "  fix: a smaller --stop-before, or a longer --time")
        for option in self.extra:
            if not option.startswith("-"):
                raise UsageError(f"--extra {option!r}: not an option.\n"
                                 "  fix: pass it with its dashes, e.g. --extra=--reservation=NAME")

    def warnings(self, signal_slack_s: int = SIGNAL_SLACK_S) -> list[str]:
        """What is allowed but likely a mistake: a stop margin above a quarter of
        the walltime leaves the study little time, and SLURM's signal may come
        ``signal_slack_s`` earlier still (0 for COMPSs, which stops on a budget).

        >>> BatchRequest(nodes=1, time_min=2).warnings() == []  # 30 s of 120
        True
        """
        walltime, margin = self.time_min * 60, self.stop_before
        if margin <= walltime * _MARGIN_SHARE:
            return []
        given = "--stop-before" if self.stop_before_s is not None else "the default stop margin"
        earlier = f", and SLURM may signal up to {signal_slack_s} s earlier" if signal_slack_s else ""
        earliest = max(0, walltime - margin - signal_slack_s)
        return [f"hpo: warning: --time {self.time_min} ({walltime} s) with {given} of {margin} s: "
                f"the study is told to stop {margin} s before the walltime{earlier}, so it may "
                f"stop after only {earliest} s.\n"
                f"  fix: a smaller --stop-before (at most {int(walltime * _MARGIN_SHARE)} s, a "
                f"quarter of the walltime) or a longer --time"]

    @property
    def stop_before(self) -> int:
        """Seconds before the walltime when the study is asked to stop."""
        if self.stop_before_s is not None:
            return self.stop_before_s
        walltime = self.time_min * 60
        return min(walltime // 2, max(30, min(300, walltime // 10)))


def _at_least(option: str, value: int, low: int, unit: str = "") -> None:
    if value < low:
        what = f" {unit}" if unit else ""
        raise UsageError(f"{option} {value}: must be at least {low}{what}.\n"
                         f"  fix: pass {option} {max(low, 1)} or more")
