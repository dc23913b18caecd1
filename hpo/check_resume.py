"""``hpo check-resume``: does an objective resume from its checkpoint as if never stopped?

The schedulers suspend trials (round-robin, convergence-aware, a leaving
worker) and resume them later from their checkpoint. That is only harmless
when the objective restores everything a straight run depends on: model,
optimiser, epoch counter, data order, random state. This check runs one
configuration twice in this process, with no engine and no store:

- run A straight through;
- run B until step K is reported, when ``trial.should_stop()`` turns True (the
  objective checkpoints and returns), then again with a fresh trial holding
  the earlier reports, as the scheduler resumes it;

and compares the two curves of the study's metric step by step.

``--config`` names every searched parameter (a parameter with a single value
in the space may be left out) and may override fixed values, e.g. fewer
epochs for a quick check. Partial configurations are refused rather than
completed with guesses, so the check runs what a study would run.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.errors import UsageError, closest
from hpo.space import StudySpec, is_active, ordered
from hpo.trial import Trial, reference_of, resolve_objective

__all__ = ["add_command", "check_resume", "parse_config"]

Reports = list[tuple[int, dict[str, float]]]


class _TimedTrial(Trial):
    """A trial detached from any study that times its checkpoint saves and restores."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_s: dict[str, list[float]] = {"save": [], "restore": []}

    @contextmanager
    def checkpoint_timer(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.checkpoint_s.setdefault(kind, []).append(time.perf_counter() - started)


class _SuspendingTrial(_TimedTrial):
    """Asks the objective to stop once step ``suspend_at`` is reported, as a segment's end does."""

    def __init__(self, *args: Any, suspend_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.suspend_at = suspend_at

    def should_stop(self) -> bool:
        if self.stop_reason is None and self.reports and self.reports[-1][0] >= self.suspend_at:
            self.stop_reason = "suspended"
        return self.stop_reason is not None


@dataclass
class _Run:
    """One call of the objective: its reports, wall time and checkpoint timings."""

    reports: Reports
    wall_s: float
    checkpoint_s: dict[str, list[float]] = field(default_factory=dict)


def parse_config(text: str, spec: StudySpec) -> dict[str, Any]:
    """The configuration ``--config`` gives, completed with the space's fixed
    values and single-valued parameters; raises UsageError naming what is wrong."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config: invalid JSON: {exc.msg} at character {exc.pos}.\n"
                         """  fix: quote it for the shell, e.g. --config '{"alpha": 0.001}'"""
                         ) from None
    if not isinstance(given, dict):
        raise UsageError(f"--config: expected a JSON object, got {text!r}.\n"
                         """  fix: write an object such as '{"alpha": 0.001}'""")
    known = [*spec.params, *spec.fixed]
    for name in given:
        if name not in known:
            hint = closest(name, known)
            raise UsageError(
                f"--config: unknown parameter {name!r}: {spec.source} has no such parameter "
                "in \"space\" or \"fixed\".\n  fix: "
                + (f'did you mean "{hint}"? ' if hint else "") + f"valid names: {', '.join(known)}")
    config = {**spec.fixed, **given}
    missing = []
    for name in ordered(spec.params):  # a condition's parameters first
        param = spec.params[name]
        if not is_active(param, config):  # a trial never gets it with these values
            if name in given:
                raise UsageError(_inactive(name, param, spec.source))
            continue
        if name in config:
            continue
        values = param.grid_values() if param.is_finite else ()
        if len(values) == 1:
            config[name] = values[0]
        else:
            missing.append(name)
    if missing:
        raise UsageError(f"--config: missing {', '.join(missing)} (searched in {spec.source}).\n"
                         "  fix: give a value to each, e.g. one the study tried "
                         "(hpo status RUN_DIR --trial N shows a trial's parameters)")
    return config


def _inactive(name: str, param: Any, source: str) -> str:
    """Why ``--config`` may not give a conditional parameter its values leave out."""
    condition = " and ".join(f"{parent} in {list(allowed)}" for parent, allowed in param.when)
    return (f"--config: {name!r} is inactive with the values given: {source} uses it only when "
            f"{condition}.\n  fix: drop {name!r} from --config, or give values that make it active")


def check_resume(spec: StudySpec, config: dict[str, Any], suspend_at: int) -> str:
    """Run the objective straight and suspended after step ``suspend_at``; return the
    report (table, costs, verdict).

    Progress goes to standard error. Raises UsageError when the objective
    never reports, or ``suspend_at`` is not a step before its last.
    """
    objective = resolve_objective(spec.objective, spec.source)
    name = reference_of(spec.objective)
    with tempfile.TemporaryDirectory(prefix="hpo-check-resume-") as scratch:
        straight = _call(objective, name, "A (straight through)", config,
                         _TimedTrial(0, dict(config), Path(scratch) / "a"))
        _check_step(straight.reports, suspend_at, name)
        b_dir = Path(scratch) / "b"
        suspended = _call(objective, name, f"B (suspended after step {suspend_at})", config,
                          _SuspendingTrial(0, dict(config), b_dir, suspend_at=suspend_at))
        size = _disk_size(b_dir)
        resumed = _call(objective, name, "B (resumed from its checkpoint)", config,
                        _TimedTrial(0, dict(config), b_dir, reports=suspended.reports))
        # Run A again, warm: its wall time is the fair baseline (run A paid the
        # imports and data loading), and its curve shows whether the objective
        # is deterministic at all, suspended or not.
        again = _call(objective, name, "A' (straight through again)", config,
                      _TimedTrial(0, dict(config), Path(scratch) / "a2"))
    metric = spec.metric.name
    lines = _table(metric, straight.reports, suspended.reports + resumed.reports)
    lines += _costs(again, suspended, resumed, size)
    lines.append(_verdict(metric, straight.reports, suspended.reports, resumed.reports, suspend_at))
    lines.append(_repeat_note(metric, straight.reports, again.reports))
    return "\n".join(lines)


def _repeat_note(metric: str, a: Reports, again: Reports) -> str:
    worst, at = _max_difference(_by_step(a, metric), _by_step(again, metric))
    if at is None:
        return "two straight runs (A, A') are identical: the objective itself is deterministic"
    return (f"two straight runs (A, A') differ too, by up to {worst:.3g} at step {at}: the "
            "objective is not deterministic even without a suspend, so differences of that "
            "size after resume are no evidence against its checkpoint")


def _call(objective: Any, name: str, label: str, config: dict[str, Any],
          trial: _TimedTrial) -> _Run:
    print(f"hpo: run {label}: starting", file=sys.stderr, flush=True)
    earlier = len(trial.reports)  # a resumed trial starts with the suspended run's reports
    started = time.perf_counter()
    try:
        objective(dict(config), trial)
    except Exception as exc:
        raise UsageError(f"the objective {name} failed in run {label}: "
                         f"{type(exc).__name__}: {exc}\n  fix: fix the objective or the "
                         "configuration; --debug shows the traceback") from exc
    wall = time.perf_counter() - started
    reports = list(trial.reports[earlier:])
    steps = f"steps {reports[0][0]} to {reports[-1][0]}" if reports else "no step"
    print(f"hpo: run {label}: done in {wall:.2f} s, {steps}", file=sys.stderr, flush=True)
    return _Run(reports, wall, trial.checkpoint_s)


def _check_step(reports: Reports, suspend_at: int, name: str) -> None:
    if not reports:
        raise UsageError(f"the objective {name} never called trial.report(step, ...).\n"
                         "  fix: report the metric after each step (epoch), and checkpoint, "
                         "so that a trial can be suspended and resumed")
    steps = [step for step, _ in reports]
    if len(steps) == 1:
        raise UsageError(f"--suspend-at {suspend_at}: the objective reports a single step "
                         f"({steps[0]}), so there is nothing to resume.\n"
                         "  fix: give it more steps (epochs) in --config")
    if suspend_at not in steps[:-1]:
        raise UsageError(f"--suspend-at {suspend_at}: the objective reports steps {steps[0]} to "
                         f"{steps[-1]}, so it can be suspended after one of {steps[0]} to "
                         f"{steps[-2]}.\n  fix: pick one of those")


def _disk_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _by_step(reports: Reports, metric: str) -> dict[int, float | None]:
    """The metric at each step; a step reported twice keeps its last value."""
    return {step: metrics.get(metric) for step, metrics in reports}


def _table(metric: str, a: Reports, b: Reports) -> list[str]:
    values_a, values_b = _by_step(a, metric), _by_step(b, metric)
    lines = [f"{'step':>6}  {metric + ' A':>16}  {metric + ' B':>16}  {'difference':>12}"]
    for step in sorted(values_a.keys() | values_b.keys()):
        va, vb = values_a.get(step), values_b.get(step)
        diff = f"{vb - va:+.3g}" if va is not None and vb is not None else "-"
        lines.append(f"{step:>6}  {_shown(va):>16}  {_shown(vb):>16}  {diff:>12}")
    return lines


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.10g}"


def _costs(straight: _Run, suspended: _Run, resumed: _Run, size: int) -> list[str]:
    saves = suspended.checkpoint_s.get("save", [])
    restores = resumed.checkpoint_s.get("restore", [])
    extra = suspended.wall_s + resumed.wall_s - straight.wall_s
    share = f" ({100 * extra / straight.wall_s:+.1f}% of A')" if straight.wall_s > 0 else ""
    lines = [f"\nwall time: straight (A', warm) {straight.wall_s:.2f} s; B {suspended.wall_s:.2f} "
             f"s + {resumed.wall_s:.2f} s; suspend and resume cost {extra:+.2f} s{share}"]
    if saves or restores:
        lines.append(f"checkpoint: {_size(size)} on disk; last save {_ms(saves[-1:])}, "
                     f"restore {_ms(restores)}")
    else:
        lines.append(f"checkpoint: {_size(size)} on disk; save and restore not timed "
                     "(the objective does not use trial.save_checkpoint/load_checkpoint "
                     "or trial.checkpoint_timer)")
    return lines


def _ms(durations: list[float]) -> str:
    return f"{1000 * sum(durations):.1f} ms" if durations else "none"


def _size(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KiB" if size < 2**20 \
        else f"{size / 2**20:.1f} MiB"


def _verdict(metric: str, a: Reports, suspended: Reports, resumed: Reports, suspend_at: int) -> str:
    if suspended and suspended[-1][0] > suspend_at:
        return (f"verdict: not checked: the objective went on to step {suspended[-1][0]} after "
                f"trial.should_stop() returned True at step {suspend_at}; it must checkpoint "
                "and return then")
    if not resumed:
        return "verdict: the resumed run reported no step: it must go on from its checkpoint"
    if resumed[0][0] <= suspend_at:
        return (f"verdict: the resumed run started again at step {resumed[0][0]} instead of "
                f"going on after step {suspend_at}: restore the step counter from the "
                "checkpoint (trial.load_checkpoint() or trial.next_step)")
    values_a, values_b = _by_step(a, metric), _by_step(suspended + resumed, metric)
    if values_a.keys() != values_b.keys():
        only = sorted(values_a.keys() ^ values_b.keys())
        return f"verdict: the runs report different steps ({', '.join(map(str, only[:10]))}): " \
               "the resumed run does not continue where the suspended one stopped"
    worst, at = _max_difference(values_a, values_b)
    if at is None:
        return "verdict: identical after resume"
    return (f"verdict: max |difference| = {worst:.3g} at step {at}; this objective does not "
            "resume deterministically: some state a straight run carries (random state, data "
            "order, optimiser state, a counter) is not saved in the checkpoint or not restored")


def add_command(command: Any) -> None:
    """Declare ``hpo check-resume``; ``command(name, help)`` makes a subcommand parser."""
    parser = command("check-resume", help="run one configuration straight and with a "
                                          "suspend/resume, and compare the curves")
    parser.add_argument("space", help="the search space JSON file (its objective and metric)")
    parser.add_argument("--config", required=True, metavar="JSON",
                        help="the configuration as a JSON object: every searched parameter "
                             "(single-valued ones may be left out); fixed values may be "
                             "overridden, e.g. fewer epochs")
    parser.add_argument("--suspend-at", type=int, required=True, metavar="K",
                        help="the step after which run B is suspended and resumed "
                             "(a step the objective reports, before its last)")
    parser.add_argument("--objective", metavar="MODULE:FUNCTION",
                        help="package.module:function to check (default: the space's)")
    parser.set_defaults(handler=_command)


def _command(args: Any) -> int:
    from hpo.api import prepare

    if args.suspend_at < 0:
        raise UsageError(f"--suspend-at {args.suspend_at}: steps start at 0.\n"
                         "  fix: give a step the objective reports, before its last")
    spec = prepare(args.space, objective=args.objective)
    config = parse_config(args.config, spec)
    print(check_resume(spec, config, args.suspend_at))
    return 0


def _max_difference(a: dict[int, float | None],
                    b: dict[int, float | None]) -> tuple[float, int | None]:
    """The largest |b - a| over the steps both report, and its step (None: identical).
    A value missing on one side only, or unequal non-finite values, count as infinite."""
    worst, at = 0.0, None
    for step in sorted(a.keys() & b.keys()):
        va, vb = a[step], b[step]
        if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)):
            diff = 0.0 if va == vb or (va is not None and vb is not None and math.isnan(va)
                                        and math.isnan(vb)) else math.inf
        else:
            diff = abs(vb - va)
        if diff > worst:
            worst, at = diff, step
    return worst, at
