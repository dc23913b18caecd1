"""The ``sbatch`` script of a Dask study: scheduler, workers and master in one job."""

from __future__ import annotations

import math
import shlex
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from hpo.errors import UsageError
from hpo.launchers.request import BatchRequest
from hpo.launchers.site import check_scratch
from hpo.launchers.slurm import directives
from hpo.launchers.srun import SrunLauncher
from hpo.launchers.tls import check_available, dask_environment
from hpo.space import StudySpec

__all__ = ["DaskJob", "template"]

JOIN_TIMEOUT_S = 300  # workers that have not joined by then are gone without


def template() -> string.Template:
    """The batch script template shipped in ``launchers/templates/dask.sbatch``."""
    text = resources.files("hpo.launchers").joinpath("templates/dask.sbatch").read_text()
    return string.Template(text)


@dataclass(frozen=True)
class DaskJob:
    """One batch job that runs ``spec`` on a Dask cluster across its nodes.

    Parameters
    ----------
    spec, space_file, run_dir:
        The validated study, its space file and its run directory (absolute).
    request:
        Nodes, walltime and accounting.
    python:
        The interpreter to use on the nodes (the one running ``hpo submit``
        by default: a virtual environment on the shared file system).
    study_args:
        Options of ``hpo run`` passed through (``--runs-dir``, ``--storage`` ...).
    pythonpath:
        Directories for PYTHONPATH in the job (the submit directory, so that
        an objective module beside the space imports on the nodes).
    interface:
        Network interface for Dask (``ib0``); None lets Dask choose.
    resubmit:
        The command that resumes the study, printed when it stops early.
    setup:
        Shell lines of the site (``module load ...``) run before any Python.
    scratch:
        Node-local directory for Dask's working files, expanded on the node
        (``$TMPDIR``); None keeps Dask's default (the system's temp dir).
    """

    spec: StudySpec
    space_file: Path
    run_dir: Path
    request: BatchRequest
    python: str
    study_args: Sequence[str] = ()
    pythonpath: Sequence[str] = ()
    interface: str | None = None
    env: Sequence[str] = ()
    resubmit: str = ""
    setup: Sequence[str] = ()
    scratch: str | None = None
    launcher: SrunLauncher = field(default_factory=SrunLauncher)

    @property
    def jobs_dir(self) -> Path:
        return self.run_dir / "jobs"

    @property
    def workers_per_node(self) -> int:
        """One worker per group of the trial's GPUs when every trial has the
        same whole GPUs; else one per node, holding its GPUs, on which the
        master places each trial (shares, counts, several nodes)."""
        spec = self.spec
        smallest, largest = spec.shape_bounds
        alike = smallest == largest and largest.gpus >= 1 and largest.nodes == 1
        if not alike or spec.allocation.planned or not self.request.gpus_per_node:
            return 1
        return self.request.gpus_per_node // int(largest.gpus)

    @property
    def gpus_per_worker(self) -> int:
        return self.request.gpus_per_node // self.workers_per_node

    def check(self) -> None:
        """The study's trials must fit a worker, or Dask would queue them forever;
        the job's TLS certificate must be possible to make."""
        check_available()
        largest = self.spec.shape_bounds[1]
        need_gpus, need_cpus = math.ceil(largest.gpus), largest.cpus
        if need_gpus > self.request.gpus_per_node:
            raise UsageError(
                f"study {self.spec.name!r} needs {need_gpus} GPU(s) per trial and "
                f"--gpus-per-node is {self.request.gpus_per_node}.\n"
                f"  fix: --gpus-per-node {need_gpus} (or a multiple), or lower \"resources\": {{\"gpus\"}}")
        cpus = self.request.cpus_per_node
        if cpus is not None and cpus // self.workers_per_node < need_cpus:
            raise UsageError(
                f"--cpus-per-node {cpus} gives each of the {self.workers_per_node} worker(s) per node "
                f"{cpus // self.workers_per_node} CPU(s); a trial of {self.spec.name!r} needs {need_cpus}.\n"
                f"  fix: --cpus-per-node {need_cpus * self.workers_per_node} or more, or omit it "
                "to use whole nodes")
        for item in self.env:
            if "=" not in item or not item.split("=", 1)[0].isidentifier():
                raise UsageError(f"--env {item!r}: expected NAME=VALUE.\n"
                                 "  fix: e.g. --env OMP_NUM_THREADS=4")

    def sbatch_options(self) -> dict[str, object]:
        """The ``#SBATCH`` options, None where unset."""
        r, w = self.request, self.workers_per_node
        return {
            "job-name": f"hpo-{self.spec.name}",
            "nodes": r.nodes,
            "ntasks-per-node": w,
            "cpus-per-task": r.cpus_per_node // w if r.cpus_per_node else None,
            "exclusive": r.cpus_per_node is None,  # whole nodes: every CPU is the study's
            "gres": f"gpu:{r.gpus_per_node}" if r.gpus_per_node else None,
            "mem": f"{r.mem_per_node_gb}G" if r.mem_per_node_gb else None,
            "time": r.time_min,
            "partition": r.partition,
            "qos": r.qos,
            "account": r.account,
            "signal": f"B:USR1@{r.stop_before}",
            "output": str(self.jobs_dir / "slurm-%j.out"),
            "open-mode": "append",
        }

    def script(self) -> str:
        """The batch script, every value quoted for the shell."""
        self.check()
        q = shlex.quote
        interface = f"--interface {q(self.interface)}" if self.interface else ""
        launch = self.launcher("", nodes="\"$SLURM_JOB_NUM_NODES\"", tasks_per_node="\"$workers_per_node\"",
                               cpus_per_task="\"$cpus_per_worker\"").rstrip()
        return template().substitute(
            directives=directives(self.sbatch_options(), self.request.extra),
            study=self.spec.name,
            workers_per_node=self.workers_per_node,
            stop_before=self.request.stop_before,
            python=q(self.python),
            run_dir=q(str(self.run_dir)),
            pythonpath=q(":".join(self.pythonpath)),
            setup=_setup_block(self.setup),
            scratch=_scratch_block(self.scratch),
            environment="\n".join(f"export {k}={q(v)}" for k, v in
                                  (item.split("=", 1) for item in self.env)),
            # Paths under the job's folder, expanded by the script.
            tls_environment="\n".join(f'export {k}="{v}"' for k, v in dask_environment("$job_dir").items()),
            interface=interface,
            launch_workers=launch,
            gpus_per_worker=self.gpus_per_worker,
            join_timeout=JOIN_TIMEOUT_S,
            study_args=" ".join(q(a) for a in [str(self.space_file), *self.study_args]),
            resubmit=q(self.resubmit or "hpo submit ... (the same command)"),
        )


def _setup_block(lines: Sequence[str]) -> str:
    """The site's set-up lines, verbatim, outside ``set -u`` (module and
    activate scripts rarely survive it)."""
    if not lines:
        return ""
    return "\n".join(["# The site's set-up (--setup, the site profile), before any Python starts.",
                      "set +u", *lines, "set -u"])


def _scratch_block(scratch: str | None) -> str:
    """Point Dask's working files (worker folders, spilled data) at node-local
    disk; the path is expanded on the node, so ``$TMPDIR`` is the job's own."""
    if scratch is None:
        return ""
    check_scratch(scratch)
    return "\n".join(["# Dask's working files on node-local disk (--scratch).",
                      f'export DASK_TEMPORARY_DIRECTORY="{scratch}"',
                      'mkdir -p "$DASK_TEMPORARY_DIRECTORY"'])
