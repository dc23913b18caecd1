"""The ``hpo submit`` and ``hpo jobs`` commands (registered by ``hpo.cli``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.registry import ENGINES
from hpo.launchers.compss import CompssJob
from hpo.launchers.dask_job import DaskJob
from hpo.launchers.outcome import CLEAN_STOPS, explain, progress
from hpo.launchers.records import JOBS_FILE, append_job, read_ending, read_jobs
from hpo.launchers.request import BatchRequest
from hpo.launchers.slurm import JobStatus, SlurmProvider, require
from hpo.launchers.states import JobState
from hpo.launchers.tracking import check_free, job_statuses

__all__ = ["add_commands", "status_lines"]

# Options of `hpo run` that `hpo submit` passes through to the study.
_PASSED = (("--storage", str), ("--name", str), ("--objective", str),
           ("--algorithm", str), ("--max-trials", int), ("--parallel", int), ("--seed", int))


def add_commands(command) -> None:
    """Register this package's subcommands through ``command(name, help=...)``."""
    submit = command("submit", help="submit a study to SLURM (COMPSs or Dask)")
    _submit_options(submit)
    submit.set_defaults(handler=lambda args: _submit(args, submit))

    jobs = command("jobs", help="SLURM state of a run directory's jobs, and the study's progress")
    jobs.add_argument("run_dir")
    jobs.add_argument("--json", action="store_true", help="machine-readable output")
    jobs.set_defaults(handler=_jobs)


def _submit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search space JSON file")
    # The engines that run a study across an allocation's nodes.
    p.add_argument("--engine", choices=[n for n in ENGINES.names if n != "inline"], default="dask",
                   help="dask: an sbatch script with a Dask cluster (default); compss: enqueue_compss")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--time", type=int, required=True, dest="time_min", metavar="MINUTES",
                   help="walltime in minutes")
    p.add_argument("--cpus-per-node", type=int, help="CPUs per node (default: whole nodes)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default 0)")
    p.add_argument("--mem-per-node-gb", type=int, help="memory per node, GB")
    p.add_argument("--partition", help="SLURM partition (COMPSs: --queue)")
    p.add_argument("--qos", help="SLURM QOS")
    p.add_argument("--account", help="SLURM account (COMPSs: --project_name)")
    p.add_argument("--stop-before", type=int, dest="stop_before_s", metavar="SECONDS",
                   help="ask the study to stop this long before the walltime "
                        "(default 10%% of it, 30 s to 5 min)")
    p.add_argument("--after", metavar="JOB_ID", help="start after this job ends (a resubmission)")
    p.add_argument("--extra", action="append", default=[], metavar="OPTION",
                   help="an sbatch or enqueue_compss option passed verbatim, e.g. --extra=--reservation=R")
    p.add_argument("--dry-run", action="store_true", help="print the script or command, submit nothing")
    p.add_argument("--python", default=sys.executable,
                   help="the Python of the project's environment on the nodes (default: this "
                        "one); compss: --python_interpreter")
    p.add_argument("--interface", help="dask: network interface, e.g. ib0")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="dask: an environment variable for the job")
    p.add_argument("--sc-cfg", help="compss, required: the site's COMPSs profile "
                                    "(enqueue_compss --sc_cfg), or default.cfg")
    p.add_argument("--runs-dir", default="runs", help="parent of run directories (default: runs)")
    p.add_argument("--timeout-s", type=float, help="wall-clock budget of the study, seconds")
    for flag, kind in _PASSED:
        p.add_argument(flag, type=kind, help="as for hpo run")


# -- hpo submit ------------------------------------------------------------------


def _submit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from hpo.api import prepare
    from hpo.trial import resolve_objective

    request = BatchRequest(
        nodes=args.nodes, time_min=args.time_min, cpus_per_node=args.cpus_per_node,
        gpus_per_node=args.gpus_per_node, mem_per_node_gb=args.mem_per_node_gb,
        partition=args.partition, qos=args.qos, account=args.account,
        stop_before_s=args.stop_before_s, extra=tuple(args.extra))
    request.check()
    space = Path(args.space)
    if not space.is_file():
        raise UsageError(f"{args.space}: no such file.\n  fix: pass the path of a search space JSON file")
    # A typo must fail here, not hours later in the queue.
    spec = prepare(space, name=args.name, objective=args.objective, algorithm=args.algorithm,
                   max_trials=args.max_trials, parallel=args.parallel, seed=args.seed,
                   timeout_s=args.timeout_s)
    resolve_objective(spec.objective, spec.source)
    run_dir = (Path(args.runs_dir) / spec.name).resolve()
    _check_run_dir(run_dir, spec, args.storage)
    if not args.dry_run:
        check_free(run_dir, args.after)
    job = _job(args, spec, space.resolve(), run_dir, request, _resubmit_line(args, parser))
    if args.engine == "compss":
        return _submit_compss(job, args.dry_run)
    return _submit_dask(job, args.dry_run, args.after)


def _job(args, spec, space: Path, run_dir: Path, request: BatchRequest, resubmit: str):
    study_args = ["--runs-dir", str(run_dir.parent)]
    for flag, _ in _PASSED:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            study_args += [flag, str(value)]
    pythonpath = [str(Path.cwd())]
    if args.engine == "compss":
        root = _project_root()
        return CompssJob(spec, space, run_dir, request, main_script=root / "hpo_main.py",
                         study_args=study_args, timeout_s=args.timeout_s,
                         pythonpath=[str(root), *pythonpath], sc_cfg=args.sc_cfg,
                         dependency=args.after, python=args.python)
    if args.timeout_s is not None:
        study_args += ["--timeout-s", f"{args.timeout_s:g}"]
    return DaskJob(spec, space, run_dir, request, python=args.python, study_args=study_args,
                   pythonpath=pythonpath, interface=args.interface, env=tuple(args.env),
                   resubmit=resubmit)


def _submit_dask(job: DaskJob, dry_run: bool, after: str | None) -> int:
    script = job.script()
    if dry_run:
        print(script, end="")
        return 0
    require("sbatch")
    job.jobs_dir.mkdir(parents=True, exist_ok=True)
    path = job.jobs_dir / f"dask-{len(read_jobs(job.run_dir)) + 1}.sbatch"
    path.write_text(script)
    job_id = SlurmProvider().submit(path, dependency=f"afterany:{after}" if after else None)
    output = str(job.jobs_dir / f"slurm-{job_id}.out")
    _record_and_report(job.run_dir, {
        "job_id": job_id, "engine": "dask", "script": str(path), "stdout": output, "stderr": output,
        "nodes": job.request.nodes, "time_min": job.request.time_min, "after": after,
    })
    return 0


def _submit_compss(job: CompssJob, dry_run: bool) -> int:
    argv = job.argv()
    for warning in job.warnings():
        print(warning, file=sys.stderr)
    if dry_run:
        print(shlex.join(argv))
        return 0
    require("enqueue_compss")
    if not job.main_script.is_file():
        raise UsageError(f"{job.main_script}: not found; enqueue_compss runs the repository's "
                         "hpo_main.py.\n  fix: install hpo from its source tree (pip install -e .)")
    for folder in (job.log_dir, job.worker_dir):
        folder.mkdir(parents=True, exist_ok=True)
    job_id = SlurmProvider().submit_command(argv)
    # enqueue_compss names its own output files; scontrol tells where (hpo jobs).
    _record_and_report(job.run_dir, {
        "job_id": job_id, "engine": "compss", "command": argv, "stdout": None, "stderr": None,
        "log_dir": str(job.log_dir), "nodes": job.request.nodes,
        "time_min": job.request.time_min, "after": job.dependency,
    })
    return 0


def _record_and_report(run_dir: Path, record: dict[str, Any]) -> None:
    append_job(run_dir, record)
    print(f"submitted SLURM job {record['job_id']} ({record['engine']} engine, "
          f"{record['nodes']} node(s), {record['time_min']} min)")
    print(f"  output:  {record['stdout'] or 'see hpo jobs (enqueue_compss names it)'}")
    if record.get("log_dir"):
        print(f"  COMPSs:  {record['log_dir']}")
    print(f"  results: {run_dir}")
    print(f"  follow:  hpo jobs {run_dir}")


def _check_run_dir(run_dir: Path, spec, storage: str | None) -> None:
    """A run directory holding another study is refused now rather than in the job."""
    from hpo.store import RunDir

    RunDir(run_dir).check(spec.to_dict(), storage)


def _project_root() -> Path:
    import hpo

    return Path(hpo.__file__).resolve().parents[1]


def _resubmit_line(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The ``hpo submit`` command that resumes this study (printed by the job)."""
    words = ["hpo", "submit", str(Path(args.space).resolve())]
    for action in parser._actions:  # every option the user changed, in parser order
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in ("help", "dry_run", "after", "debug") \
                or value == action.default or value is None:
            continue
        flag = action.option_strings[-1]
        if flag == "--runs-dir":
            value = str(Path(value).resolve())
        for item in value if isinstance(value, list) else [value]:
            words += [flag] if item is True else [f"{flag}={item}"]
    return shlex.join(words)


# -- hpo jobs / hpo status -------------------------------------------------------


def _jobs(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    records = read_jobs(run_dir)
    if not records:
        raise UsageError(f"{run_dir}: no {JOBS_FILE}: nothing was submitted for this run directory.\n"
                         "  fix: pass runs/<study-name> of a study sent with hpo submit")
    states = job_statuses(run_dir, [r["job_id"] for r in records])
    summary = progress(run_dir)
    if args.json:
        jobs = [{**r, **{k: v for k, v in states[r["job_id"]].to_dict().items() if v is not None},
                 "ended": read_ending(run_dir, r["job_id"])} for r in records]
        print(json.dumps({"jobs": jobs, "study": summary}, indent=2))
        return 0
    for line in _job_lines(run_dir, records, states):
        print(line)
    print(_progress_line(summary))
    return 0


def status_lines(run_dir: Path) -> list[str]:
    """Lines for ``hpo status`` about the run directory's SLURM jobs ([] when none).

    SLURM being unreachable from here is said, not raised: the study's own
    status must still print.
    """
    records = read_jobs(run_dir)
    if not records:
        return []
    try:
        states = job_statuses(run_dir, [r["job_id"] for r in records[-5:]])
    except (UsageError, OSError) as exc:
        return [f"SLURM jobs: {len(records)} submitted; state unavailable here ({str(exc).splitlines()[0]})"]
    return ["SLURM jobs:", *_job_lines(run_dir, records[-5:], states)]


def _job_lines(run_dir: Path, records: list[dict[str, Any]], states: dict[str, JobStatus]) -> list[str]:
    lines = [f"{'job':<10} {'engine':<7} {'state':<10} {'slurm':<12} {'exit':<6} {'run time':<10} output"]
    for r in records:
        s = states[r["job_id"]]
        lines.append(f"{r['job_id']:<10} {r['engine']:<7} {s.state.value:<10} {s.slurm_state:<12} "
                     f"{s.exit_code or '-':<6} {s.run_time or '-':<10} {s.stdout or r.get('stdout') or '-'}")
        lines += [f"{'':<10} {note}" for note in _notes(s, read_ending(run_dir, r["job_id"]))]
    return lines


def _notes(s: JobStatus, ending: dict[str, Any] | None) -> list[str]:
    """What a job's state, and the ending its study recorded, mean for the study."""
    said = explain(ending) if ending is not None else _unrecorded(s)
    if said and ending is not None and ending.get("signal"):
        said += "; submit the same command again to resume"
    notes = [said]
    if s.state is JobState.PENDING and s.reason:
        notes.append(f"waiting: {s.reason}")
    elif s.reason and (s.state in (JobState.UNKNOWN, JobState.MISSING) or "last seen" in s.reason):
        notes.append(f"SLURM: {s.reason}")
    return [n for n in notes if n]


def _unrecorded(s: JobStatus) -> str | None:
    """A finished Dask job that recorded no ending was killed before its study
    stopped (a COMPSs job records none: enqueue_compss writes its script)."""
    code = int(s.exit_code.split(":")[0]) if s.exit_code and s.exit_code[0].isdigit() else None
    left = ("trials it ran may be left RUNNING: the next run resumes them from their last "
            "checkpoint once their heartbeat is stale; submit the same command again")
    if s.state is JobState.TIMEOUT:
        return f"killed at the walltime before the study stopped cleanly; {left} (a larger --stop-before helps)"
    if s.state is JobState.CANCELLED and s.run_time not in (None, "00:00:00"):
        return f"cancelled and killed before the study stopped cleanly; {left}"
    if code in CLEAN_STOPS:
        return f"the study stopped on {CLEAN_STOPS[code]}; submit the same command again to resume"
    return None


def _progress_line(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "study: not started yet"
    counts = ", ".join(f"{n} {s.lower()}" for s, n in summary["counts"].items() if n) or "no trials yet"
    line = f"study {summary['study']}: {summary['trials']} trials ({counts})"
    if summary["best"]:
        line += f"; best {summary['metric']}={summary['best']['value']:.6g} (trial {summary['best']['number']})"
    return line
