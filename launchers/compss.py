"""The ``enqueue_compss`` command line of a COMPSs study on SLURM.

enqueue_compss writes and submits its own batch script, so hpo only chooses
its flags. It has no flag for SLURM's ``--signal``: the study gets a
wall-clock budget instead (``hpo run --timeout-s``, walltime minus
``stop_before``), stops starting trials when it runs out, and ends cleanly;
the same submission again resumes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpo.errors import UsageError
from hpo.launchers.request import BatchRequest
from hpo.space import StudySpec

__all__ = ["CompssJob"]


@dataclass(frozen=True)
class CompssJob:
    """``enqueue_compss ... hpo_main.py SPACE`` for one study.

    Parameters
    ----------
    spec, space_file, run_dir, request:
        The validated study, its space file, its run directory (absolute) and
        what the job asks of SLURM.
    main_script:
        The repository's ``hpo_main.py`` (absolute).
    study_args:
        Options of ``hpo run`` passed through to ``hpo_main.py``.
    timeout_s:
        A study budget given on the command line; the job's own budget never exceeds it.
    pythonpath:
        Directories for ``--pythonpath`` (the project and the submit directory).
    sc_cfg:
        The site's COMPSs profile (``--sc_cfg``); the runtime's default is used when None.
    dependency:
        A job id to start after (``--job_dependency``).
    """

    spec: StudySpec
    space_file: Path
    run_dir: Path
    request: BatchRequest
    main_script: Path
    study_args: Sequence[str] = ()
    timeout_s: float | None = None
    pythonpath: Sequence[str] = ()
    sc_cfg: str | None = None
    dependency: str | None = None

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "jobs" / "compss-logs"

    @property
    def worker_dir(self) -> Path:
        return self.run_dir / "jobs" / "compss-work"

    @property
    def budget_s(self) -> float:
        """The study's wall-clock budget: stop ``stop_before`` s before the walltime.

        It counts from the master's start, after the runtime started, so the
        study ends at least that early.
        """
        limit = self.request.time_min * 60 - self.request.stop_before
        given = [t for t in (self.timeout_s, self.spec.search.timeout_s) if t]
        return float(min([limit, *given]))

    def check(self) -> None:
        r, res = self.request, self.spec.resources
        if r.nodes == 1 and r.cpus_per_node is None:
            raise UsageError(
                "--engine compss --nodes 1: the master node must run the trials itself "
                "(enqueue_compss --worker_in_master_cpus), and how many CPUs it has is unknown.\n"
                "  fix: pass --cpus-per-node (the node's cores), or --nodes 2 or more")
        if res.gpus > r.gpus_per_node:
            raise UsageError(
                f"study {self.spec.name!r} needs {res.gpus} GPU(s) per trial and --gpus-per-node "
                f"is {r.gpus_per_node}: COMPSs would never schedule a trial.\n"
                f"  fix: --gpus-per-node {res.gpus} or more")
        if r.cpus_per_node is not None and res.cpus > r.cpus_per_node:
            raise UsageError(
                f"study {self.spec.name!r} needs {res.cpus} CPUs per trial and --cpus-per-node "
                f"is {r.cpus_per_node}.\n  fix: --cpus-per-node {res.cpus} or more")

    def argv(self) -> list[str]:
        """The full ``enqueue_compss`` command."""
        self.check()
        r = self.request
        flags = {
            "num_nodes": r.nodes,
            "exec_time": r.time_min,
            "cpus_per_node": r.cpus_per_node,
            "gpus_per_node": r.gpus_per_node or None,
            "node_memory": r.mem_per_node_gb * 1024 if r.mem_per_node_gb else None,
            "queue": r.partition,
            "qos": r.qos,
            "project_name": r.account,
            # With one node COMPSs would otherwise run no task at all (default 0).
            "worker_in_master_cpus": r.cpus_per_node if r.nodes == 1 else None,
            "worker_in_master_memory": r.mem_per_node_gb * 1024 if r.nodes == 1 and r.mem_per_node_gb else None,
            "worker_working_dir": str(self.worker_dir),
            "log_dir": str(self.log_dir),
            "pythonpath": ":".join(self.pythonpath) or None,
            "sc_cfg": self.sc_cfg,
            "job_dependency": self.dependency,
        }
        argv = ["enqueue_compss"]
        argv += [f"--{k}={v}" for k, v in flags.items() if v is not None]
        argv += list(r.extra)
        argv += [str(self.main_script), str(self.space_file), *self.study_args,
                 "--timeout-s", f"{self.budget_s:g}", "--quiet"]
        return argv
