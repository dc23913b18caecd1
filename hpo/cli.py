"""hpo: hyperparameter optimisation for HPC clusters (COMPSs, Dask, SLURM).

Run a study from a JSON search space, follow it, review and export its
results, and send it to SLURM. Bad input exits with status 2 and a message
naming the place and the fix; a traceback only with --debug.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shlex
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from hpo.errors import EngineLost, StopRequested, StoreUnavailable, UsageError
from hpo.registry import ALGORITHMS, ENGINES
from hpo.store import TrialStatus

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpo`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `hpo`: what there is to do
        parser.print_help(sys.stderr)
        return 2
    # SIGTERM (kill) and SIGUSR1 (what `sbatch --signal` sends before the walltime).
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGUSR1, _terminate)
    try:
        status = args.handler(args)
        sys.stdout.flush()  # a reader gone shows here, not as a traceback at the interpreter's exit
        return status
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe (an engine's, a database's): a fault to show
        return _reader_gone()
    except UsageError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"hpo: error: {exc}", file=sys.stderr)
        return 2
    except EngineLost as exc:
        print(f"\nhpo: {exc}.\n  Trials still running on workers finish by themselves; the others "
              "are resumed when the same command runs again once a scheduler is up.", file=sys.stderr)
        return 75  # EX_TEMPFAIL: try again later
    except StoreUnavailable as exc:
        print(f"\nhpo: {exc}", file=sys.stderr)
        return 75
    except (KeyboardInterrupt, StopRequested) as exc:
        # The engine was shut down on the way out; the store has every result.
        # In a job of hpo submit, the job's last line says how to resume instead.
        if args.command == "run" and not os.environ.get("HPO_JOB_SAYS_RESUME"):
            print("\nhpo: interrupted; run the same command again to resume", file=sys.stderr)
        return 128 + exc.signum if isinstance(exc, StopRequested) else 130


def _terminate(signum, frame) -> None:
    # One stop at a time: SLURM may signal again (USR1, then SIGTERM) while
    # running trials are given their grace; a second raise would cut it short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    raise StopRequested(signum)


def _stdout_gone() -> bool:
    """Whether nothing reads standard output any more (a pipe or socket without reader)."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _reader_gone() -> int:
    """Stop quietly when the reader of the output went away (``hpo status | head -1``).

    Exit status 141 (128 + SIGPIPE), what a Unix tool killed by SIGPIPE reports
    (``set -o pipefail`` then sees it, as for ``yes | head -1``). Standard output
    goes to /dev/null so that flushing it at the interpreter's exit cannot fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (0 is refused, not taken as "the default")."""
    try:
        if int(text) >= 1:
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")


def _positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        if 0 < float(text) < math.inf:
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")


_EPILOG = """\
first steps:
  hpo validate search_spaces/digits_quick.json     check a space file, say what it will run
  hpo run search_spaces/digits_quick.json          run (or resume) it; results in runs/<name>/
  hpo status runs/digits-quick                     the leaderboard again; --trial N for one trial
  hpo dashboard runs/digits-quick                  review it in the browser

'hpo COMMAND --help' describes each command."""


def _parser() -> argparse.ArgumentParser:
    from hpo import __version__

    parser = argparse.ArgumentParser(
        prog="hpo", description=__doc__.split("\n\n")[0].replace("\n", " "), epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hpo {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                                   parents=[common], formatter_class=_HelpFormatter)

    run = command("run", help="run or resume a study")
    run.add_argument("space", help="the search space JSON file (see docs/guide/space.md)")
    run.add_argument("--engine", default="auto", choices=("auto", *ENGINES.names),
                     help="auto: compss under runcompss, else dask")
    run.add_argument("--scheduler", metavar="ADDRESS_OR_FILE",
                     help="dask: address or scheduler file of a running scheduler")
    run.add_argument("--workers", type=_positive_int, metavar="N",
                     help="dask: worker processes of the embedded cluster "
                          "(default: one per trial slot that fits the machine); "
                          "simulated: slots (1 to 4096)")
    run.add_argument("--simulated-costs", metavar="NAME=S,...",
                     help="simulated: hpo's own costs added to simulated time, in seconds "
                          "(dispatch, start, save, restore; default: the measured ones)")
    add_study_options(run, parallel_default="the space's, else every slot")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.add_argument("--allow-changes", action="store_true",
                     help="resume although the space, fixed values, objective or metric name "
                          "changed since the study's first run")
    run.set_defaults(handler=_run)

    validate = command("validate", help="check a space file and say what it would run")
    validate.add_argument("space", help="the search space JSON file")
    validate.add_argument("--algorithm", choices=ALGORITHMS.names, metavar="ALGORITHM",
                          help=f"check it as searched by: {', '.join(ALGORITHMS.names)}")
    validate.set_defaults(handler=_validate)

    status = command("status", help="the leaderboard, counts by state and the best trial")
    status.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>; a folder "
                                        "of them (runs) gives one line per study")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=_positive_int, default=_STATUS_ROWS, metavar="N",
                       help="leaderboard rows to show")
    shown.add_argument("--all", action="store_true", help="show every trial")
    shown.add_argument("--trial", type=int, metavar="N",
                       help="one trial in full: parameters, reports, events, attempts, "
                            "the whole traceback and its log")
    shown.add_argument("--json", action="store_true", help="the summary, machine-readable")
    status.set_defaults(handler=_status)

    export = command("export", help="every trial as CSV or JSON, or the learning curves")
    export.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>")
    export.add_argument("--format", choices=("csv", "json"), default="csv",
                        help="csv: one row per trial; json: every trial with its reports")
    export.add_argument("--curves", action="store_true",
                        help="csv only: the learning curves in long format, one row per "
                             "trial, step and metric")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.set_defaults(handler=_export)

    repair = command("repair", help="salvage the intact records of a damaged journal")
    repair.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>")
    repair.set_defaults(handler=_repair)

    from hpo.check_resume import add_command as add_check_resume

    add_check_resume(command)

    # Review and submission live beside the library, in dashboards/ and launchers/.
    from hpo.dashboards.commands import add_commands as add_review_commands
    from hpo.launchers.commands import add_commands as add_launch_commands

    add_review_commands(command)
    add_launch_commands(command)
    return parser


def add_study_options(parser, *, parallel_default: str, timeout_default: str = "none") -> None:
    """The options that name, place and size a study, as ``hpo run`` and
    ``hpo submit`` share them (``parser``: a parser or an argument group)."""
    algorithms = ", ".join(ALGORITHMS.names)
    parser.add_argument("--runs-dir", default="runs", metavar="DIR", help="parent of run directories")
    parser.add_argument("--storage", metavar="URL",
                        help="Optuna storage URL instead of the run directory's journal")
    parser.add_argument("--name", help="study name (default: the space's \"name\", else the file's name)")
    parser.add_argument("--objective", metavar="MODULE:FUNCTION",
                        help="package.module:function to optimise (default: the space's)")
    parser.add_argument("--algorithm", choices=ALGORITHMS.names, metavar="ALGORITHM",
                        help=f"search algorithm, one of: {algorithms} (default: the space's, else grid)")
    parser.add_argument("--max-trials", type=_positive_int, metavar="N",
                        help="trial budget (default: the space's; a grid's size)")
    parser.add_argument("--parallel", type=_positive_int, metavar="N",
                        help=f"trials in flight at once (default: {parallel_default})")
    parser.add_argument("--seed", type=int, help="seed of random and Bayesian search, 0 to 2**32-1 "
                                                 "(default: the space's)")
    parser.add_argument("--timeout-s", type=_positive_float, metavar="S",
                        help=f"wall-clock budget of the study, seconds (default: {timeout_default})")


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help, where it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text
                and action.option_strings and "default" not in text):
            text += " (default: %(default)s)"
        return text


_STATUS_ROWS = 20  # leaderboard rows of `hpo run` and `hpo status`


def _run(args: argparse.Namespace) -> int:
    from hpo.api import prepare, run
    from hpo.engines import default_engine_name

    spec = prepare(args.space, name=args.name, objective=args.objective, algorithm=args.algorithm,
                   max_trials=args.max_trials, parallel=args.parallel, seed=args.seed,
                   timeout_s=args.timeout_s)
    engine = default_engine_name() if args.engine == "auto" else args.engine
    run_dir = Path(args.runs_dir) / spec.name
    print(f"study {spec.name}: {spec.search.algorithm} search, up to {spec.max_trials} trials, "
          f"engine {engine}, results in {run_dir}", file=sys.stderr)
    simulated = _simulated_engine(args, spec, engine)
    result = run(spec, engine=simulated or engine, scheduler=args.scheduler,
                 workers=None if simulated else args.workers,
                 storage=args.storage, runs_dir=args.runs_dir, progress=not args.quiet,
                 allow_changes=args.allow_changes)
    if simulated is not None:
        print(f"simulated time: {simulated.clock.now():,.0f} s on {simulated.slots} slots, with hpo's "
              f"costs: {simulated.costs.describe()}", file=sys.stderr)
    _print_pareto(result)
    print(result.table(limit=_STATUS_ROWS))
    _print_summary(result, run_dir)
    print(f"\nmore: hpo status {shlex.quote(str(run_dir))} (--all, --trial N); "
          f"hpo dashboard {shlex.quote(str(run_dir))}")
    # Trials ran and none completed: a batch script should notice.
    return 1 if result.trials and result.best is None else 0


def _simulated_engine(args: argparse.Namespace, spec, engine: str):
    """The simulated engine of ``--engine simulated`` (its costs from the
    command line), or None for another engine."""
    if engine != "simulated":
        if args.simulated_costs:
            raise UsageError("--simulated-costs is for the simulated engine.\n"
                             "  fix: add --engine simulated, or drop it")
        return None
    from hpo.engines import SimulatedCosts, SimulatedEngine

    costs = SimulatedCosts.parse(args.simulated_costs) if args.simulated_costs else None
    return SimulatedEngine(args.workers or spec.search.parallel or 1, costs)


def _print_summary(result, run_dir: Path) -> None:
    from hpo.units import format_number, format_resource_time

    counts = ", ".join(f"{n} {s.lower()}" for s, n in result.counts.items() if n)
    print(f"\n{len(result.trials)} trials: {counts or 'none'}")
    if result.stop:
        print(f"stopped early: {result.stop['reason']}")
    failed = [t for t in result.trials if t.state in (TrialStatus.FAILED, TrialStatus.TIMEOUT)]
    if failed:
        print(f"first failure: trial {failed[0].number}: {failed[0].error}\n"
              f"  the whole traceback and the trial's log: "
              f"hpo status {shlex.quote(str(run_dir))} --trial {failed[0].number}")
    if result.multi_objective:
        front = result.pareto_front
        print(f"Pareto front: {len(front)} trials ({', '.join(str(t.number) for t in front) or 'none yet'})")
    elif result.best:
        print(f"best: trial {result.best.number}, {result.metric}={format_number(result.best.value, 6)}, "
              f"config {json.dumps(result.best.params)}")
    cost = result.cost
    print(f"cost: {format_resource_time(cost['core_hours'])}"
          + (f", {format_resource_time(cost['gpu_hours'], 'GPU')}" if cost["gpu_hours"] else ""))


def _print_pareto(result) -> None:
    """A multi-objective study's Pareto front, before its leaderboard."""
    if result.multi_objective:
        print(result.pareto_table() + "\n")


def _validate(args: argparse.Namespace) -> int:
    from hpo.api import prepare
    from hpo.trial import preflight, resolve_objective

    spec = prepare(args.space, algorithm=args.algorithm)
    print(f"hpo: importing the objective {spec.objective} to check it", file=sys.stderr, flush=True)
    preflight(resolve_objective(spec.objective, spec.source), spec.fixed, spec.source)
    print(spec.describe())
    return 0


def _status(args: argparse.Namespace) -> int:
    from hpo.results import StudyResult

    _refuse_misspelt(Path(args.run_dir))
    studies = _studies_in(Path(args.run_dir))
    if studies:
        return _status_of_studies(args, studies)
    if args.trial is not None:
        from hpo.trial_details import trial_details

        print(trial_details(Path(args.run_dir), args.trial))
        return 0
    result = StudyResult.load(args.run_dir)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
        return 0
    run_dir = shlex.quote(args.run_dir)
    _print_pareto(result)
    print(result.table(limit=None if args.all else args.limit))
    if not args.all and len(result.trials) > args.limit:
        print(f"  (the best {args.limit} shown: --all for every trial, --limit N for more)")
    _print_summary(result, Path(args.run_dir))
    from hpo.launchers.commands import status_lines  # SLURM jobs sent with hpo submit

    for line in status_lines(Path(args.run_dir)):
        print(line)
    print(f"\none trial in full: hpo status {run_dir} --trial N; every trial and its "
          f"curves: hpo export {run_dir} --format json")
    return 0


def _refuse_misspelt(run_dir: Path) -> None:
    """A run directory that is not there, named like one beside it: say which."""
    from hpo.errors import closest

    if run_dir.exists() or not run_dir.parent.is_dir():
        return
    hint = closest(run_dir.name, [p.name for p in run_dir.parent.iterdir() if p.is_dir()])
    if hint:
        meant = shlex.quote(str(run_dir.parent / hint))
        raise UsageError(f"{run_dir}: no such directory.\n  fix: did you mean {meant}? "
                         f"(hpo status {meant})")


def _studies_in(folder: Path) -> list[Path]:
    """The run directories inside ``folder`` when it is a folder of studies
    (``runs/``, as ``hpo dashboard runs`` takes it), else none."""
    if (folder / "study.json").exists() or not folder.is_dir():
        return []
    return sorted(p.parent for p in folder.glob("*/study.json"))


def _status_of_studies(args: argparse.Namespace, studies: list[Path]) -> int:
    """One line per study of a runs folder; one that cannot be read is named
    with its fix on stderr, and the status is then 2."""
    from hpo.results import StudyResult
    from hpo.units import format_number

    if args.trial is not None:
        raise UsageError(f"{args.run_dir}: a folder of {len(studies)} studies; --trial needs one.\n"
                         f"  fix: name the study, e.g. hpo status {shlex.quote(str(studies[0]))} "
                         f"--trial {args.trial}")
    summaries, failed = [], False
    for run_dir in studies:
        try:
            result = StudyResult.load(run_dir)
        except UsageError as exc:
            print(f"hpo: error: {exc}", file=sys.stderr)
            failed = True
            continue
        if args.json:
            summaries.append({"run_dir": str(run_dir), **result.summary()})
            continue
        counts = ", ".join(f"{n} {s.lower()}" for s, n in result.counts.items() if n)
        line = f"{run_dir}  {len(result.trials)} trials: {counts or 'none'}"
        if result.multi_objective:
            line += f"; Pareto front: {len(result.pareto_front)} trials"
        elif result.best and result.best.value is not None:  # a completed trial: it has one
            line += (f"; best {result.metric}={format_number(result.best.value, 6)} "
                     f"(trial {result.best.number})")
        print(line)
    if args.json:
        print(json.dumps(summaries, indent=2))
    else:
        print(f"\none study in full: hpo status {shlex.quote(str(studies[0]))}")
    return 2 if failed else 0


def _export(args: argparse.Namespace) -> int:
    from hpo.results import StudyResult

    if args.curves and args.format != "csv":
        raise UsageError("--curves goes with --format csv (JSON holds the curves already, as "
                         "each trial's \"reports\").\n  fix: drop --curves, or --format json")
    result = StudyResult.load(args.run_dir)
    if args.format == "json":
        text = result.to_json()
    else:
        text = result.curves_csv() if args.curves else result.to_csv()
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise UsageError(f"{args.output}: cannot write the export: {exc.strerror or exc}.\n"
                             "  fix: pass -o a file path in an existing directory you can write to"
                             ) from None
    else:
        sys.stdout.write(text)
    return 0


def _repair(args: argparse.Namespace) -> int:
    from hpo.store import RunDir

    for line in RunDir(Path(args.run_dir)).repair():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
