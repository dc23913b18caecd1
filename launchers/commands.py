"""The ``hpo submit`` and ``hpo jobs`` commands (registered by ``hpo.cli``)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.launchers.compss import CompssJob, master_runs_trials
from hpo.launchers.dask_job import DaskJob
from hpo.launchers.outcome import CLEAN_STOPS, explain, interrupted, progress
from hpo.launchers.records import JOBS_FILE, append_job, earlier_endings, read_ending, read_jobs
from hpo.launchers.request import SIGNAL_SLACK_S, BatchRequest
from hpo.launchers.site import Site, check_scratch, check_setup, load_site
from hpo.launchers.slurm import JobStatus, SlurmProvider, SubmitError, require
from hpo.launchers.states import JobState
from hpo.launchers.tracking import ACTIVE, check_free, job_statuses
from hpo.registry import ENGINES

__all__ = ["add_commands", "status_lines"]

# Options of `hpo run` that `hpo submit` passes through to the study.
_PASSED = ("--storage", "--name", "--objective", "--algorithm", "--max-trials", "--parallel", "--seed")


def add_commands(command) -> None:
    """Register this package's subcommands through ``command(name, help=...)``."""
    submit = command("submit", help="submit a study to SLURM (COMPSs or Dask)")
    _submit_options(submit)
    submit.set_defaults(handler=lambda args: _submit(args, submit))

    jobs = command("jobs", help="SLURM state of a run directory's jobs, and the study's progress")
    jobs.add_argument("run_dir", metavar="RUN_DIR",
                      help="the study's run directory (runs/<name>), as hpo submit printed it")
    jobs.add_argument("--json", action="store_true",
                      help="machine-readable output: every job record with its SLURM state and "
                           "recorded ending, and the study's summary")
    jobs.set_defaults(handler=_jobs)


def _submit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", metavar="SPACE", help="the search space JSON file (see docs/guide/space.md)")
    _allocation_options(p.add_argument_group("the allocation"))
    _site_options(p.add_argument_group("the site (also from a profile: --site, see launchers/README.md)"))
    _engine_options(p.add_argument_group("engine-specific"))
    _study_options(p.add_argument_group("passed to the study (as for hpo run)"))


def _allocation_options(p) -> None:
    # The engines that run a study across an allocation's nodes.
    p.add_argument("--engine", choices=[n for n in ENGINES.names if n not in ("inline", "simulated")],
                   default="dask",
                   help="dask: an sbatch script with a Dask cluster; compss: enqueue_compss "
                        "(default: %(default)s)")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="nodes (default: as many as the space's widest trial needs, its "
                        "\"resources\": {\"nodes\"}, plus the master's node under compss; else 1)")
    p.add_argument("--time", type=int, required=True, dest="time_min", metavar="MINUTES",
                   help="walltime in minutes (required)")
    p.add_argument("--cpus-per-node", type=int, metavar="C",
                   help="CPUs per node (default: whole nodes, every CPU SLURM gives)")
    p.add_argument("--gpus-per-node", type=int, default=0, metavar="G",
                   help="GPUs per node (default: %(default)s)")
    p.add_argument("--mem-per-node-gb", type=int, metavar="M",
                   help="memory per node, GB (default: the partition's)")
    p.add_argument("--stop-before", type=int, dest="stop_before_s", metavar="SECONDS",
                   help="ask the study to stop this long before the walltime (default: 10%% of "
                        "it, 30 s to 5 min; a warning when above a quarter of it)")
    p.add_argument("--after", metavar="JOB_ID",
                   help="start after this job ends, whatever its status (a continuation)")
    p.add_argument("--extra", action="append", metavar="OPTION",
                   help="an sbatch (dask) or enqueue_compss (compss) option passed verbatim, "
                        "repeatable, e.g. --extra=--reservation=R (default: none)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the batch script (dask) or the enqueue_compss command, submit "
                        "and write nothing")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="the Python of the project's environment on the nodes, checked at "
                        "submission (it must run and import hpo); compss: "
                        "--python_interpreter (default: this one, %(default)s)")


def _site_options(p) -> None:
    p.add_argument("--site", metavar="FILE",
                   help="site profile (TOML): set-up lines, scratch, partition, QOS, account, "
                        "extra #SBATCH lines; 'none' for no profile (default: $HPO_SITE, else "
                        "~/.config/hpo/site.toml if it exists)")
    p.add_argument("--setup", action="append", metavar="LINE",
                   help="a shell line the job runs before any Python, after the profile's, "
                        "repeatable, e.g. --setup 'module load python/3.11' (default: none)")
    p.add_argument("--scratch", metavar="DIR",
                   help="node-local directory for the workers' files: dask: Dask's local "
                        "directory, expanded on the node, e.g. '$TMPDIR'; compss: "
                        "--worker_working_dir, e.g. local_disk (default: the profile's scratch / "
                        "compss_scratch, else Dask's temp dir / RUN_DIR/jobs/compss-work)")
    p.add_argument("--partition", metavar="P",
                   help="SLURM partition; compss: --queue (default: the profile's, else SLURM's)")
    p.add_argument("--qos", metavar="Q", help="SLURM QOS (default: the profile's, else none)")
    p.add_argument("--account", metavar="A",
                   help="SLURM account; compss: --project_name (default: the profile's, else none)")


def _engine_options(p) -> None:
    p.add_argument("--interface", metavar="IFACE",
                   help="dask: network interface of scheduler and workers, e.g. ib0 "
                        "(default: the node's address)")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="dask: an environment variable for the job, repeatable (default: none)")
    p.add_argument("--sc-cfg", metavar="PROFILE",
                   help="compss, required: the site's COMPSs profile (enqueue_compss --sc_cfg), "
                        "or default.cfg (default: the site profile's sc_cfg)")


def _study_options(p) -> None:
    from hpo.cli import add_study_options

    add_study_options(p, parallel_default="the space's, else the allocation's slots",
                      timeout_default="none; compss: the walltime minus --stop-before at most")


# -- hpo submit ------------------------------------------------------------------


def _submit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from hpo.api import prepare

    site = load_site(args.site)
    request = BatchRequest(
        nodes=1 if args.nodes is None else args.nodes, time_min=args.time_min, cpus_per_node=args.cpus_per_node,
        gpus_per_node=args.gpus_per_node, mem_per_node_gb=args.mem_per_node_gb,
        partition=args.partition or site.partition, qos=args.qos or site.qos,
        account=args.account or site.account, stop_before_s=args.stop_before_s,
        extra=tuple(args.extra or ()))
    request.check()
    check_setup(site, args.setup or ())
    space = Path(args.space)
    if not space.is_file():
        raise UsageError(f"{args.space}: no such file.\n  fix: pass the path of a search space JSON file")
    if args.scratch is not None:
        check_scratch(args.scratch)
    # A typo must fail here, not hours later in the queue.
    spec = prepare(space, name=args.name, objective=args.objective, algorithm=args.algorithm,
                   max_trials=args.max_trials, parallel=args.parallel, seed=args.seed,
                   timeout_s=args.timeout_s)
    request = replace(request, nodes=_nodes_for(spec, args.engine, args.nodes, request.extra))
    pythonpath = job_pythonpath(space)
    check_objective(spec, pythonpath)
    # enqueue_compss also puts the project on the job's path (--pythonpath).
    project = [str(_project_root())] if args.engine == "compss" else []
    check_python(args.python, [*project, *pythonpath], (*site.setup, *(args.setup or ())))
    run_dir = (Path(args.runs_dir) / spec.name).resolve()
    _check_run_dir(run_dir, spec, args.storage)
    if not args.dry_run:
        check_free(run_dir, args.after)
    # A COMPSs study stops on its own budget; a Dask one on SLURM's signal, which may come early.
    for warning in request.warnings(0 if args.engine == "compss" else SIGNAL_SLACK_S):
        print(warning, file=sys.stderr)
    resubmit = resubmit_line(args, parser, site)
    job = _job(args, spec, space.resolve(), run_dir, request, site, pythonpath, resubmit)
    try:
        if isinstance(job, CompssJob):  # args.engine == "compss"
            return _submit_compss(job, args.dry_run, resubmit)
        return _submit_dask(job, args.dry_run, args.after)
    except SubmitError as exc:
        raise exc.with_note(_from_profile(args, site)) from None


def _from_profile(args: argparse.Namespace, site: Site) -> str:
    """Which values sent were the site profile's, not the command line's: a
    refused partition may be the profile's, and the fix is then an option."""
    taken = [f"--{key} {getattr(site, key)}" for key in ("partition", "qos", "account")
             if getattr(args, key) is None and getattr(site, key) is not None]
    if not taken:
        return ""
    first = taken[0].split()[0]
    return (f"{', '.join(taken)}: from the site profile {site.source}, not the command line; "
            f"override with {first} NAME (the command line wins), fix the profile, or use "
            "--site none")


def job_pythonpath(space: Path) -> list[str]:
    """The folders the job puts on PYTHONPATH: the space file's (an objective
    module beside it) and the submit directory (the job's working directory),
    as ``hpo run`` and ``hpo validate`` import the objective."""
    from hpo.trial import objective_path

    return objective_path(space)


def _nodes_for(spec, engine: str, asked: int | None, extra: Sequence[str] = ()) -> int:
    """The allocation's nodes: enough for the widest trial (under COMPSs the
    master's node runs no trials once there are several, unless --extra
    gives it CPUs enough: --worker_in_master_cpus)."""
    widest = spec.shape_bounds[1].nodes
    idle_master = engine == "compss" and widest > 1 and not master_runs_trials(extra, spec)
    needed = widest + 1 if idle_master else widest
    if asked is None:
        return needed
    if asked < needed:
        raise UsageError(
            f"study {spec.name!r} has trials on {widest} nodes and --nodes is {asked}"
            + (" (the COMPSs master's node runs none)" if idle_master else "")
            + f".\n  fix: --nodes {needed} or more, or drop --nodes"
            + (f"; or give the master's node trials too: --extra=--worker_in_master_cpus=C, "
               f"C at least {spec.shape_bounds[1].cpus}" if idle_master else ""))
    return asked


def check_python(python: str, pythonpath: Sequence[str], setup: Sequence[str] = ()) -> None:
    """Refuse a ``--python`` that cannot run the job: missing, not executable,
    or without hpo (with the job's PYTHONPATH; if the plain interpreter fails,
    again after the set-up lines, which a module's Python may need). A job
    with such a Python would fail at once, before the study could say why."""
    # Not resolved: a virtual environment's python is a link to the system's, without hpo.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return  # this very interpreter runs hpo
    fix = ("  fix: pass the Python of the project's environment (the one hpo is installed in, "
           "e.g. --python /path/to/venv/bin/python), or leave --python out to use this one "
           f"({sys.executable})")
    if "/" not in python:  # a name: the job finds it on PATH, as this does
        python = shutil.which(python) or python
    if not Path(python).is_file():
        raise UsageError(f"--python {python}: no such file.\n{fix}")
    if not os.access(python, os.X_OK):
        raise UsageError(f"--python {python}: not executable.\n{fix}")
    said = _imports_hpo(python, pythonpath, ())
    if said and setup:  # run on this machine only when needed: they may have side effects
        said = _imports_hpo(python, pythonpath, setup)
    if said:
        raise UsageError(
            f"--python {python} cannot import hpo (with the job's PYTHONPATH, and after the "
            f"set-up lines if any): {said}\n  fix: install hpo into that environment "
            f"({python} -m pip install -e {_project_root()}), or pass the Python that has it "
            f"(this one: {sys.executable})")


def _imports_hpo(python: str, pythonpath: Sequence[str], setup: Sequence[str]) -> str | None:
    """None when ``python`` imports hpo after ``setup``; else the last line it said."""
    env = {**os.environ, "PYTHONPATH": ":".join(
        [*pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])}
    script = "\n".join(["set +u", *setup, 'exec "$0" -c "import hpo"'])
    try:
        done = subprocess.run(["bash", "-c", script, python], env=env, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "it did not answer in 120 s"
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def check_objective(spec, pythonpath: Sequence[str]) -> None:
    """Import the objective as the job will: with ``pythonpath`` before the
    environment's own PYTHONPATH (which sbatch passes on)."""
    from hpo.errors import SpaceError
    from hpo.trial import resolve_objective

    saved = list(sys.path)
    sys.path[:0] = [p for p in pythonpath if p not in sys.path]
    try:
        resolve_objective(spec.objective, spec.source)
    except SpaceError as exc:
        if not isinstance(exc.__cause__, ImportError):
            raise
        module = str(spec.objective).partition(":")[0]
        raise SpaceError(exc.source, exc.path, exc.problem,
                         f"the job imports {module!r} with {':'.join(pythonpath)} (the space file's "
                         "folder and the submit directory) before PYTHONPATH: put the module "
                         "in one of them, or install its package into the job's Python "
                         "(--python)") from exc.__cause__
    finally:
        sys.path[:] = saved


def _job(args, spec, space: Path, run_dir: Path, request: BatchRequest, site: Site,
         pythonpath: list[str], resubmit: str) -> CompssJob | DaskJob:
    """The job of either engine, the command line's options over the site profile's."""
    study_args = ["--runs-dir", str(run_dir.parent)]
    for flag in _PASSED:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            study_args += [flag, str(value)]
    setup = (*site.setup, *(args.setup or ()))
    if args.engine == "compss":
        return _compss_job(args, spec, space, run_dir, request, site, pythonpath, study_args, setup)
    if args.timeout_s is not None:
        study_args += ["--timeout-s", f"{args.timeout_s:g}"]
    request = replace(request, extra=(*site.sbatch, *request.extra))
    return DaskJob(spec, space, run_dir, request, python=args.python, study_args=study_args,
                   pythonpath=pythonpath, interface=args.interface, env=tuple(args.env or ()),
                   resubmit=resubmit, setup=setup, scratch=args.scratch or site.scratch)


def _compss_job(args, spec, space: Path, run_dir: Path, request: BatchRequest, site: Site,
                pythonpath: list[str], study_args: list[str], setup: tuple[str, ...]) -> CompssJob:
    if site.sbatch:
        print(f"hpo: warning: {site.source}: sbatch lines apply to the dask engine only; "
              "enqueue_compss writes its own script, and its --sc_cfg profile holds such "
              "settings", file=sys.stderr)
    root = _project_root()
    return CompssJob(spec, space, run_dir, request, main_script=root / "hpo_main.py",
                     study_args=study_args, timeout_s=args.timeout_s,
                     pythonpath=[str(root), *pythonpath], sc_cfg=args.sc_cfg or site.sc_cfg,
                     dependency=args.after, python=args.python, setup=setup,
                     scratch=args.scratch or site.compss_scratch)


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
        "resubmit": job.resubmit,
    })
    return 0


def _submit_compss(job: CompssJob, dry_run: bool, resubmit: str) -> int:
    argv = job.argv()
    for warning in job.warnings():
        print(warning, file=sys.stderr)
    if dry_run:
        if job.env_script is not None:
            print(f"hpo: {job.env_script} would hold:\n{job.env_script_text()}", file=sys.stderr)
        print(shlex.join(argv))
        return 0
    require("enqueue_compss")
    if not job.main_script.is_file():
        raise UsageError(f"{job.main_script}: not found; enqueue_compss runs the repository's "
                         "hpo_main.py.\n  fix: install hpo from its source tree (pip install -e .)")
    for folder in (job.log_dir, job.worker_dir):
        folder.mkdir(parents=True, exist_ok=True)
    if job.env_script is not None:
        job.env_script.write_text(job.env_script_text())
    job_id = SlurmProvider().submit_command(argv)
    # enqueue_compss names its own output files; scontrol tells where (hpo jobs).
    _record_and_report(job.run_dir, {
        "job_id": job_id, "engine": "compss", "command": argv, "stdout": None, "stderr": None,
        "log_dir": str(job.log_dir), "nodes": job.request.nodes,
        "time_min": job.request.time_min, "after": job.dependency, "resubmit": resubmit,
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


def resubmit_line(args: argparse.Namespace, parser: argparse.ArgumentParser, site: Site) -> str:
    """The command that resumes this study, from any directory: it goes back
    to the submit directory (the job's working directory and PYTHONPATH,
    where relative storage paths point) and repeats every option that was
    given, with the run directory, space and site profile as absolute paths."""
    words = [sys.executable, "-m", "hpo", "submit", str(Path(args.space).resolve()),
             f"--runs-dir={Path(args.runs_dir).resolve()}"]
    if site.source is not None:  # found through $HPO_SITE or ~/.config: named, not looked up again
        words.append(f"--site={site.source}")
    elif args.site is not None:
        words.append("--site=none")
    for action in parser._actions:  # every other option the user changed, in parser order
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in _NOT_REPEATED \
                or value == action.default or value is None:
            continue
        flag = action.option_strings[-1]
        for item in value if isinstance(value, list) else [value]:
            words += [flag] if item is True else [f"{flag}={item}"]
    return f"cd {shlex.quote(str(Path.cwd().resolve()))} && {shlex.join(words)}"


# Not part of a resumption: a one-off, the job it followed, or given above.
_NOT_REPEATED = {"help", "dry_run", "after", "debug", "runs_dir", "site"}


# -- hpo jobs / hpo status -------------------------------------------------------


def _jobs(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    records = read_jobs(run_dir)
    if not records:
        raise UsageError(f"{run_dir}: no {JOBS_FILE}: nothing was submitted for this run directory.\n"
                         "  fix: pass runs/<study-name> of a study sent with hpo submit")
    states = job_statuses(run_dir, [r["job_id"] for r in records])
    summary = progress(run_dir)
    if summary is not None:
        summary["interrupted"] = interrupted(run_dir)
    if args.json:
        jobs = [{**r, **{k: v for k, v in states[r["job_id"]].to_dict().items() if v is not None},
                 "ended": read_ending(run_dir, r["job_id"]),
                 "earlier_runs": earlier_endings(run_dir, r["job_id"])} for r in records]
        print(json.dumps({"jobs": jobs, "study": summary}, indent=2))
        return 0
    for line in _job_lines(run_dir, records, states):
        print(line)
    print(_progress_line(summary))
    if summary is None:
        for line in _output_tail(records[-1], states[records[-1]["job_id"]]):
            print(line)
    return 0


_TAIL_LINES = 15


def _output_tail(record: dict[str, Any], s: JobStatus) -> list[str]:
    """The end of a job's output when it ended before its study started: a
    bad interpreter, a failed set-up line, a missing module say why there."""
    path = s.stdout or record.get("stdout")
    if not s.state.finished or not path:
        return []
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-_TAIL_LINES:]
    except OSError as exc:
        return [f"job {s.job_id} ended before the study started; its output {path} cannot be "
                f"read here ({exc.strerror or exc})"]
    how = f"{s.state.value} {s.exit_code}" if s.exit_code else s.state.value
    return [f"job {s.job_id} ended ({how}) before the study started; the end of its output "
            f"({path}):", *(f"  | {line}" for line in lines)]


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
        notes = _notes(s, read_ending(run_dir, r["job_id"]))
        if r.get("resubmit") and s.state not in ACTIVE and any("again" in n for n in notes):
            notes.append(f"resume: {r['resubmit']}")
        lines += [f"{'':<10} {note}" for note in notes]
    return lines


def _notes(s: JobStatus, ending: dict[str, Any] | None) -> list[str]:
    """What a job's state, and the ending its study recorded, mean for the study."""
    if s.state in ACTIVE and ending is not None:
        notes: list[str | None] = [_requeued(s, ending)]  # the record is its earlier run's
    elif ending is not None:
        notes = [*_ending_notes(ending)]
    else:
        notes = [_unrecorded(s)]
    if s.state is JobState.PENDING and s.reason:
        notes.append(f"waiting: {s.reason}")
    elif s.reason and (s.state is JobState.UNKNOWN or "no longer known to SLURM" in s.reason):
        notes.append(f"SLURM: {s.reason}")
    return [n for n in notes if n]


def _ending_notes(ending: dict[str, Any]) -> list[str]:
    """A recorded ending explained: a stop, or a failure with what the study
    said last in the job's output (its message and fix), and how to go on."""
    said = explain(ending)
    if said is None:
        return []
    if ending.get("signal"):
        return [f"{said}; submit the same command again to resume"]
    lines = ending.get("said") or []
    if not lines:
        return [said]
    if lines[0].startswith("hpo: "):
        more = [f"  {line.strip()}" for line in lines[1:]]
    else:  # no message of hpo's: the end of the output (a traceback)
        more = ["the end of what the study printed:", *(f"  | {line}" for line in lines)]
    return [said, *more, "once that is fixed, submit the same command again to resume"]


def _requeued(s: JobStatus, ending: dict[str, Any]) -> str:
    """A job that ended and is queued or running again: SLURM requeued it, and
    it runs the study again itself; resubmitting would make two."""
    earlier = explain(ending) or "the study ended (exit 0)"
    return (f"requeued by SLURM (restarts: {s.restarts or '?'}): it runs the study again when it "
            f"starts, nothing to resubmit; its earlier run: {earlier}")


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
    # RUNNING in the store but not live: their master ended (a fault, a job killed).
    counts = {**summary["counts"]}
    lost = summary.get("interrupted", 0)
    counts["RUNNING"] -= lost
    words = [f"{n} {s.lower()}" for s, n in counts.items() if n]
    if lost:
        words.append(f"{lost} interrupted: left running when their master ended, resumed "
                     "by the next run")
    n = summary["trials"]
    line = f"study {summary['study']}: {n} trial{'' if n == 1 else 's'} ({', '.join(words) or 'none yet'})"
    if summary["best"]:
        line += f"; best {summary['metric']}={summary['best']['value']:.6g} (trial {summary['best']['number']})"
    return line
