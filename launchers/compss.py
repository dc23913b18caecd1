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
slots hpo computes are the ones COMPSs has. A flag given with ``--extra``
replaces hpo's own, and the slots count its value; the four hpo computes the
allocation from (``--num_nodes``, ``--exec_time``, ``--cpus_per_node``,
``--gpus_per_node``) are refused there, in favour of hpo's own options.

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

from hpo.engines import CompssEngine
from hpo.errors import UsageError
from hpo.launchers.request import BatchRequest
from hpo.space import StudySpec

__all__ = ["CompssJob", "master_runs_trials"]

# enqueue_compss flags hpo computes the study's budget, slots and nodes from:
# given with --extra they would disagree with hpo's figures, so hpo's option is asked for.
_OWN_OPTIONS = {"--num_nodes": "--nodes", "--exec_time": "--time", "--cpus_per_node": "--cpus-per-node",
                "--gpus_per_node": "--gpus-per-node"}


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
        given = _extra_int(self.request.extra, "--worker_in_master_cpus", "CPUs")
        if given is not None:
            return given
        return (self.request.cpus_per_node or 0) if self.request.nodes == 1 else 0

    @property
    def node_memory_mb(self) -> int | None:
        """A worker node's memory (``--node_memory``): as given with
        ``--extra``, else ``--mem-per-node-gb``; None where unknown."""
        given = _extra_value(self.request.extra, "--node_memory")
        if given is not None:
            return int(given) if given.isdigit() else None  # e.g. "disabled"
        return self.request.mem_per_node_gb * 1024 if self.request.mem_per_node_gb else None

    @property
    def master_memory_mb(self) -> int | None:
        """The master node's memory for trials (``--worker_in_master_memory``):
        as given with ``--extra``, else the node's when it runs trials."""
        given = _extra_int(self.request.extra, "--worker_in_master_memory", "MB")
        if given is not None:
            return given
        return self.node_memory_mb if self.master_cpus else None

    @property
    def slots(self) -> int | None:
        """Trials the allocation runs at once (None: unknown here, the runtime
        decides): the other nodes' and the master's share, by CPUs, GPUs and
        memory, a multi-node trial taking a place on each of its nodes."""
        r, (res, _) = self.request, self.spec.shape_bounds
        if r.cpus_per_node is None or (res.memory_gb and self.node_memory_mb is None):
            return None
        places = [self._places(r.cpus_per_node, self.node_memory_mb)] * (r.nodes - 1)
        master_memory_mb = self.master_memory_mb
        # COMPSs gives the master's worker all the node's GPUs: its CPUs and memory decide.
        if self.master_cpus >= res.cpus and (master_memory_mb is None
                                             or master_memory_mb >= _reserved_mb(res.memory_gb)):
            places.append(self._places(self.master_cpus, master_memory_mb))
        return max(1, CompssEngine.fit(places, res.nodes))

    def _places(self, cpus: int, memory_mb: int | None) -> int:
        res = self.spec.shape_bounds[0]
        memory_gb = memory_mb / 1024 if memory_mb is not None else None
        return CompssEngine.places(res.cpus, int(res.gpus), res.memory_gb, cpus,
                                   self.request.gpus_per_node, memory_gb)

    def check(self) -> None:
        r, res = self.request, self.spec.shape_bounds[1]
        for flag, option in _OWN_OPTIONS.items():
            given = _extra_value(r.extra, flag)
            if given is not None:
                raise UsageError(
                    f"--extra={flag}={given}: hpo sets {flag} from its own {option}, and computes "
                    f"the study's budget, slots and nodes from it.\n  fix: {option} {given} "
                    "instead")
        _extra_int(r.extra, "--worker_in_master_cpus", "CPUs")  # a number, or a clear error now
        _extra_int(r.extra, "--worker_in_master_memory", "MB")
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
        asked_master = _extra_value(r.extra, "--worker_in_master_cpus") is not None
        flags = {
            "num_nodes": r.nodes,
            "exec_time": r.time_min,
            "cpus_per_node": r.cpus_per_node,
            "gpus_per_node": r.gpus_per_node or None,
            "node_memory": self.node_memory_mb,
            "queue": r.partition,
            "qos": r.qos,
            "project_name": r.account,
            # Always explicit: the profile's default may give the master node
            # trials (mn.cfg: 24 CPUs) that the slots would not count.
            "worker_in_master_cpus": None if asked_master else self.master_cpus,
            "worker_in_master_memory": None if asked_master else self.master_memory_mb,
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
        # A flag given with --extra replaces hpo's own.
        argv += [f"--{k}={v}" for k, v in flags.items()
                 if v is not None and _extra_value(r.extra, f"--{k}") is None]
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


def master_runs_trials(extra: Sequence[str], spec: StudySpec) -> bool:
    """Whether the master's node runs a part of the study's largest trial:
    ``--worker_in_master_cpus`` (and ``--worker_in_master_memory``, if
    given) with ``--extra``, large enough for it."""
    largest = spec.shape_bounds[1]
    cpus = _extra_int(extra, "--worker_in_master_cpus", "CPUs")
    memory = _extra_int(extra, "--worker_in_master_memory", "MB")
    return (cpus is not None and cpus >= largest.cpus
            and (memory is None or memory >= _reserved_mb(largest.memory_gb)))


def _reserved_mb(memory_gb: float | None) -> int:
    """What COMPSs reserves for a trial of ``memory_gb``, in MB (0: no limit)."""
    return CompssEngine.whole_gb(memory_gb) * 1024


def _extra_value(extra: Sequence[str], flag: str) -> str | None:
    """The value given to enqueue_compss as ``flag=VALUE`` through --extra
    (the last one, if given twice), or None."""
    given = [option.partition("=")[2] for option in extra if option.partition("=")[0] == flag]
    return given[-1] if given else None


def _extra_int(extra: Sequence[str], flag: str, unit: str) -> int | None:
    """The whole number given to enqueue_compss as ``flag=N`` through --extra, or None."""
    value = _extra_value(extra, flag)
    if value is not None and not value.isdigit():
        raise UsageError(f"--extra={flag}={value}: {flag} takes a whole number of {unit}.\n"
                         f"  fix: e.g. --extra={flag}=8")
    return None if value is None else int(value)
