"""The ``enqueue_compss`` command line of a COMPSs study on SLURM.

enqueue_compss writes and submits its own batch script, so hpo only chooses
its flags. It has no flag for SLURM's ``--signal``: the study gets a
wall-clock budget instead (``hpo run --timeout-s``, walltime minus
``stop_before``), stops starting trials when it runs out, and ends cleanly;
the same submission again resumes it.

What the site profile (``--sc_cfg``) would otherwise decide is passed
explicitly where it changes the study: the master node's share of the trials
(``--worker_in_master_cpus``: 22 of the 40 profiles of COMPSs 3.3, mn.cfg
among them, give it CPUs, and with them all the node's GPUs), so that the
slots hpo computes are the ones COMPSs has.

By default enqueue_compss gives the runtime a wall-clock limit one minute
before the walltime; there the master raises wherever it is and every task is
cancelled a second later, which with short walltimes comes before the
study's own stop. The limit is therefore set explicitly, half the stop margin
before the walltime: after the study's budget, as a backstop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpo.engines import CompssEngine, trials_per_node
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
        The site's COMPSs profile (``--sc_cfg``), e.g. ``"mn5.cfg"``; ``"default.cfg"`` is enqueue_compss's own.
    dependency:
        A job id to start after (``--job_dependency``).
    python:
        The interpreter of the project's environment (``--python_interpreter``):
        COMPSs otherwise runs the ``python3`` on PATH, on the master and the workers.
    setup:
        Shell lines of the site (``module load ...``), written to a script
        that the job sources before COMPSs starts any Python
        (``--pre_env_script``) and each worker sources as it starts
        (``--env_script``).
    scratch:
        The workers' working directory (``--worker_working_dir``): COMPSs's
        keyword for node-local disk (``local_disk``; ``scratch`` before 3.0)
        or an absolute path; None keeps it in the run directory.
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
    python: str | None = None
    setup: Sequence[str] = ()
    scratch: str | None = None

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "jobs" / "compss-logs"

    @property
    def worker_dir(self) -> Path:
        return self.run_dir / "jobs" / "compss-work"

    @property
    def env_script(self) -> Path | None:
        """Where the set-up script is written (named by its content), or None."""
        if not self.setup:
            return None
        digest = hashlib.sha256(self.env_script_text().encode()).hexdigest()[:10]
        return self.run_dir / "jobs" / f"compss-env-{digest}.sh"

    def env_script_text(self) -> str:
        return "\n".join(["# The site's set-up for hpo's COMPSs study (hpo submit --setup, the site",
                          "# profile); sourced by the job before COMPSs starts (--pre_env_script)",
                          "# and by each worker (--env_script).", *self.setup, ""])

    @property
    def budget_s(self) -> float:
        """The study's wall-clock budget: stop ``stop_before`` s before the walltime.

        It counts from the master's start, after the runtime started, so the
        study ends at least that early.
        """
        limit = self.request.time_min * 60 - self.request.stop_before
        given = [t for t in (self.timeout_s, self.spec.search.timeout_s) if t]
        return float(min([limit, *given]))

    @property
    def runtime_limit_s(self) -> int:
        """The runtime's own wall-clock limit: after the study's budget, before SLURM's kill."""
        return self.request.time_min * 60 - self.request.stop_before // 2

    @property
    def master_cpus(self) -> int:
        """The master node's CPUs that run trials (``--worker_in_master_cpus``):
        as given with ``--extra``, else all of them on one node (or nothing
        would run), else none."""
        given = _extra_int(self.request.extra, "--worker_in_master_cpus")
        if given is not None:
            return given
        return (self.request.cpus_per_node or 0) if self.request.nodes == 1 else 0

    @property
    def slots(self) -> int | None:
        """Trials the allocation runs at once (None: unknown here, the runtime
        decides): the other nodes' and the master's share, a multi-node
        trial taking a place on each of its nodes."""
        r, (res, _) = self.request, self.spec.shape_bounds
        if r.cpus_per_node is None:
            return None
        cpus, gpus = res.cpus, int(res.gpus)
        places = [trials_per_node(cpus, gpus, r.cpus_per_node, r.gpus_per_node)] * (r.nodes - 1)
        if self.master_cpus >= cpus:  # COMPSs gives that worker all the node's GPUs
            places.append(trials_per_node(cpus, gpus, self.master_cpus, r.gpus_per_node))
        return max(1, concurrent_trials(places, res.nodes))

    def check(self) -> None:
        r, res = self.request, self.spec.shape_bounds[1]
        if self.sc_cfg is None:
            raise UsageError(
                "--engine compss: which COMPSs profile does this site use? enqueue_compss's "
                "stock default.cfg is for LSF with at least 2 nodes, and a SLURM site passes "
                "its own.\n  fix: --sc-cfg PROFILE (e.g. mn5.cfg; the files are in "
                "$COMPSS_HOME/Runtime/scripts/queues/supercomputers/), or --sc-cfg default.cfg "
                "if your site installed its SLURM profile as default.cfg")
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
        if self.scratch is not None and "$" in self.scratch:
            raise UsageError(
                f"--engine compss --scratch {self.scratch!r}: enqueue_compss takes no variables "
                "of the node; the site's COMPSs profile knows its node-local disk.\n"
                "  fix: --scratch local_disk (COMPSs 3.x; scratch before 3.0) or an absolute path")
        if r.cpus_per_node is not None and res.cpus > r.cpus_per_node:
            raise UsageError(
                f"study {self.spec.name!r} needs {res.cpus} CPUs per trial and --cpus-per-node "
                f"is {r.cpus_per_node}.\n  fix: --cpus-per-node {res.cpus} or more")

    def argv(self) -> list[str]:
        """The full ``enqueue_compss`` command."""
        self.check()
        r = self.request
        asked_master = _extra_int(r.extra, "--worker_in_master_cpus") is not None
        master_memory = r.mem_per_node_gb * 1024 if self.master_cpus and r.mem_per_node_gb else None
        flags = {
            "num_nodes": r.nodes,
            "exec_time": r.time_min,
            "cpus_per_node": r.cpus_per_node,
            "gpus_per_node": r.gpus_per_node or None,
            "node_memory": r.mem_per_node_gb * 1024 if r.mem_per_node_gb else None,
            "queue": r.partition,
            "qos": r.qos,
            "project_name": r.account,
            # Always explicit: the profile's default may give the master node
            # trials (mn.cfg: 24 CPUs) that the slots would not count.
            "worker_in_master_cpus": None if asked_master else self.master_cpus,
            "worker_in_master_memory": None if asked_master else master_memory,
            "worker_working_dir": self.scratch or str(self.worker_dir),
            "log_dir": str(self.log_dir),
            "pythonpath": ":".join(self.pythonpath) or None,
            "python_interpreter": self.python,
            # The master's Python starts after the first, the workers' after the second.
            "pre_env_script": self.env_script,
            "env_script": self.env_script,
            "sc_cfg": self.sc_cfg,
            "job_dependency": self.dependency,
            "wall_clock_limit": self.runtime_limit_s,
        }
        argv = ["enqueue_compss"]
        argv += [f"--{k}={v}" for k, v in flags.items() if v is not None]
        argv += list(r.extra)
        study_args = list(self.study_args)
        if "--parallel" not in study_args and self.spec.search.parallel is None and self.slots:
            study_args += ["--parallel", str(self.slots)]
        argv += [str(self.main_script), str(self.space_file), *study_args,
                 "--timeout-s", f"{self.budget_s:g}", "--quiet"]
        return argv

    def warnings(self) -> list[str]:
        """What the site profile may silently drop, and what COMPSs rounds."""
        r, said = self.request, []
        if r.qos:
            said.append(f"hpo: warning: the COMPSs profile {self.sc_cfg!r} drops --qos without a "
                        f"word if it sets DISABLE_QARG_QOS=true; {_check('qos', r.qos)}")
        if r.account:
            said.append(f"hpo: warning: COMPSs drops --account (--project_name) without a word "
                        f"unless the profile {self.sc_cfg!r} sets ENABLE_PROJECT_NAME=true (most "
                        f"do not); {_check('account', r.account)}")
        memory = {m for m in (s.memory_gb for s in self.spec.shape_bounds) if m}
        said += [w for w in map(CompssEngine.memory_warning, sorted(memory)) if w]
        return said


def _check(option: str, value: str) -> str:
    return (f"check the job with 'scontrol show job ID' (hpo jobs prints the id); to send it "
            f"whatever the profile: --extra=--extra_submit_flag=--{option}={value}")


def concurrent_trials(places: Sequence[int], nodes_per_trial: int) -> int:
    """How many trials of ``nodes_per_trial`` distinct nodes run at once on
    nodes holding ``places`` trials each: the most t with t * n <= sum of
    min(place, t) (a trial takes a place on each of its nodes).

    >>> concurrent_trials([1, 1, 1], 3), concurrent_trials([12] * 3, 3), concurrent_trials([2] * 5, 3)
    (1, 12, 3)
    """
    t = 0
    while (t + 1) * nodes_per_trial <= sum(min(p, t + 1) for p in places):
        t += 1
    return t


def _extra_int(extra: Sequence[str], flag: str) -> int | None:
    """The whole number given to enqueue_compss as ``flag=N`` through --extra, or None."""
    for option in extra:
        name, _, value = option.partition("=")
        if name == flag:
            if not value.isdigit():
                raise UsageError(f"--extra={option}: {flag} takes a whole number of CPUs.\n"
                                 f"  fix: e.g. --extra={flag}=8")
            return int(value)
    return None
