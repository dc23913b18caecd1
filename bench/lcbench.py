"""Search quality on LCBench: hpo's policies against Optuna's own loop, at equal
simulated wall-clock, on a YAHPO Gym surrogate.

Workload: the YAHPO Gym surrogate of a scenario (``--scenario``, LCBench by
default: 34 OpenML tasks, 52-epoch curves of funnel-shaped MLPs, each epoch
costing the training time the surrogate predicts), read offline from
``--data`` (``hpo.examples.lcbench``; nothing is downloaded). A scenario whose
fidelity is a training-set fraction runs the same way, its steps being
fractions. Every contender gets, per task and seed, the same simulated
wall-clock budget on ``--workers`` workers: ``--budget`` full-training
equivalents, i.e. ``budget x (median over a fixed sample of 256 random
configurations of the full training time on that task) / workers`` seconds.

Contenders, in the same run (bench/_lcbench_runs.py says how each runs):

- hpo, through its real master on the simulated engine (hpo's own
  dispatch, process start and checkpoint costs added to simulated time):
  random search and TPE (``bayesian``), each with the median, ASHA and
  Hyperband pruners and with convergence-aware scheduling (segments of 4
  epochs, time-sharing as many configurations as the budget could train
  fully, as Hermes schedules a given set of jobs); and multi-fidelity TPE (``sampler: multifidelity``) with
  Hyperband;
- Optuna through its own ask/tell on the same simulated clock, none of hpo's
  code in its loop: TPE + ``HyperbandPruner(min_resource=1,
  max_resource=52)``, TPE + ``SuccessiveHalvingPruner``, random search
  without pruning;
- DEHB, when ``import dehb`` works; it does not install beside numpy 2
  (DEHB 0.1.2 pins ``numpy<2``), and the run says so once.

What is measured: the best validation error (1 - accuracy) reported so far,
at any epoch of any trial, over simulated time. Regret is normalised per
task as ``(y - y_best) / (y_random - y_best)``, clipped to [0, 1]: ``y_best``
the best value any contender found on the task (any seed, within the
budget), ``y_random`` the median final validation error of the 256 random
configurations (a random configuration trained to the end). So 0 is the
best anyone found and 1 is no better than a typical random configuration
(or nothing reported yet).

TPE's truncated-normal masses call ``scipy.special.log_ndtr`` instead of
Optuna's pure-Python loop over ``math.erf``, for hpo's TPE and Optuna's
alike: the same function to a relative 5.6e-8, and an Optuna TPE + Hyperband
run 2.8 times faster (task 3945: 25.6 to 9.2 s). Rounding differs, so a run
takes a different path than with Optuna's own; ``--exact-tpe`` keeps it.

Run: ``python bench/lcbench.py [--scenario lcbench] [--data FOLDER]
[--tasks N|all|ID,ID] [--seeds N] [--workers N] [--budget N] [--jobs J]
[--contenders PREFIX,...] [--out DIR] [--exact-tpe]``. Defaults: the data in
``/work/shared/data/yahpo`` if it is there (else ``--data`` is required:
exit 2 with how to get it), 3 tasks, 1 seed, 32 workers, 200 full-training
equivalents, one process per core. The full sweep is ``--tasks all --seeds 5``.

It prints the machine's load at start and end, a progress line per run
(task, seed, contender, done/total, elapsed), then per task a table of
median regret over seeds at 10%, 25%, 50% and 100% of the budget (and the
trials each contender started), the same as a median over tasks, the
Wilcoxon signed-rank test over tasks at 50% of the budget between hpo's best
policy (lowest median regret over tasks at 50%, chosen on these same runs)
and every other contender (the full matrix is in the JSON), and the wall
time each contender took. ``--out`` (``bench-out/lcbench``) receives
``lcbench.json`` (every run's curve, the budgets, the tables, the p-values)
and ``lcbench.html`` (median regret over simulated time per contender; a
task-by-contender map of ranks at 50% of the budget; Plotly, offline).
Last lines: ``tasks_won=W of T`` (tasks where hpo's best policy has a lower
median regret than Optuna's TPE + Hyperband at 50% of the budget) and
``wilcoxon_p=<p>`` (the two of them, over tasks, at 50%).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any, NamedTuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import _lcbench_runs as runs

from hpo.examples.lcbench import SCENARIOS, DataMissing, Surrogate, open_surrogate

DEFAULT_DATA = Path("/work/shared/data/yahpo")
FRACTIONS = (0.10, 0.25, 0.50, 1.00)
CALIBRATION = 256  # random configurations measuring a task's full training time and random value
CURVE_POINTS = 101  # of the plotted regret curves


def status(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{text}")
    else:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count() or 1} cores"


# ------------------------------------------------------------------ the runs


class Task(NamedTuple):
    """A task's budget and the two ends of its regret scale."""

    task: str
    full_s: float  # median full training time of the calibration sample
    budget_s: float  # simulated wall-clock budget of every contender
    y_random: float  # median final error of the calibration sample


def calibrate(surrogate: Surrogate, task: str, budget: float, workers: int) -> Task:
    curves = surrogate.curves(task, surrogate.sample(CALIBRATION, seed=0))
    full = statistics.median(float(c.times[-1]) for c in curves)
    y_random = statistics.median(float(c.errors[-1]) for c in curves)
    return Task(task, full, budget * full / workers, y_random)


def fast_tpe() -> None:
    """Optuna's TPE with scipy's log_ndtr (see the module docstring)."""
    import scipy.special  # type: ignore[import-untyped]
    from optuna.samplers._tpe import _truncnorm

    _truncnorm._log_ndtr = scipy.special.log_ndtr


_SURROGATE: Surrogate | None = None


def _start_worker(data: str, scenario: str, exact_tpe: bool) -> None:
    global _SURROGATE
    _SURROGATE = open_surrogate(data, scenario)
    if not exact_tpe:
        fast_tpe()
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # Optuna's experimental-feature warnings, once per process
    logging.getLogger("hpo").setLevel(logging.ERROR)


def _run_unit(name: str, task: str, workers: int, budget_s: float, seed: int, pool: int) -> dict[str, Any]:
    if _SURROGATE is None:
        raise RuntimeError("lcbench: a run outside a worker started by _start_worker")
    trace = runs.run(name, _SURROGATE, task, workers, budget_s, seed, pool)
    return trace.as_dict()


def contenders(chosen: str | None) -> list[str]:
    names = list(runs.HPO) + list(runs.OPTUNA)
    if not chosen:
        return names
    prefixes = [p.strip() for p in chosen.split(",") if p.strip()]
    picked = [n for n in names if any(n.startswith(p) for p in prefixes)]
    if not picked:
        raise SystemExit(f"lcbench: --contenders {chosen!r} matches none of {', '.join(names)}")
    if runs.REFERENCE not in picked:
        picked.append(runs.REFERENCE)  # tasks_won and wilcoxon_p are against it
    return picked


def dehb_note() -> str | None:
    try:
        import dehb  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return ("dehb: not installed, left out (DEHB 0.1.2 on PyPI pins numpy<2; this "
                f"environment has numpy {__import__('numpy').__version__})")
    return "dehb: installed, but no DEHB contender is written yet; left out"


def run_all(args: argparse.Namespace, tasks: list[Task], names: list[str]) -> dict[tuple, dict]:
    """Every (task, seed, contender), in ``args.jobs`` processes; the heaviest first."""
    units = [(name, t, seed) for t in tasks for seed in range(args.seeds) for name in names]
    units.sort(key=lambda u: ("tpe" not in u[0] and "multifidelity" not in u[0]))
    results: dict[tuple, dict] = {}
    began = time.monotonic()

    def done(name: str, t: Task, seed: int, trace: dict) -> None:
        results[(t.task, seed, name)] = trace
        best = trace["points"][-1][1] if trace["points"] else math.nan
        status(f"[{len(results)}/{len(units)}] task {t.task} seed {seed} {name}: best {best:.4f}, "
               f"{trace['trials']} trials, {trace['wall_s']:.1f} s; elapsed {_elapsed(began)}")

    init = (str(args.data), args.scenario, args.exact_tpe)
    pool = max(1, round(args.budget))  # the configurations a time-sharing policy schedules
    if args.jobs == 1:
        _start_worker(*init)
        for name, t, seed in units:
            done(name, t, seed, _run_unit(name, t.task, args.workers, t.budget_s, seed, pool))
    else:
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"),
                                 initializer=_start_worker, initargs=init) as processes:
            futures = {processes.submit(_run_unit, name, t.task, args.workers, t.budget_s, seed, pool):
                       (name, t, seed) for name, t, seed in units}
            for future in as_completed(futures):
                done(*futures[future], future.result())
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    return results


def _elapsed(began: float) -> str:
    s = int(time.monotonic() - began)
    return f"{s // 60}m{s % 60:02d}s"


# ---------------------------------------------------------------- statistics


def best_at(points: list, t: float) -> float:
    best = math.inf
    for when, value in points:
        if when > t:
            break
        best = value
    return best


def regret(value: float, y_best: float, y_random: float) -> float:
    """``(value - y_best) / (y_random - y_best)`` in [0, 1]; 1 before anything is reported."""
    if not math.isfinite(value):
        return 1.0
    if y_random <= y_best:  # nobody beat a typical random configuration: no scale to measure on
        return 0.0 if value <= y_best else 1.0
    return min(max((value - y_best) / (y_random - y_best), 0.0), 1.0)


class Regrets(NamedTuple):
    """Median regret over seeds: ``table[task][contender]`` at each fraction of
    the budget, and the curves ``curves[task][contender]`` at ``grid``."""

    y_best: dict[str, float]
    table: dict[str, dict[str, list[float]]]
    trials: dict[str, dict[str, float]]
    grid: list[float]
    curves: dict[str, dict[str, list[float]]]


def regrets(results: dict[tuple, dict], tasks: list[Task], names: list[str], seeds: int) -> Regrets:
    y_best, table, trials, curves = {}, {}, {}, {}
    grid = [i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
    for t in tasks:
        finals = [best_at(results[(t.task, s, n)]["points"], t.budget_s) for s in range(seeds) for n in names]
        y_best[t.task] = min(finals)

        def at(name: str, fraction: float, t: Task = t) -> float:
            return statistics.median(
                regret(best_at(results[(t.task, s, name)]["points"], fraction * t.budget_s),
                       y_best[t.task], t.y_random) for s in range(seeds))

        table[t.task] = {n: [at(n, f) for f in FRACTIONS] for n in names}
        trials[t.task] = {n: statistics.median(results[(t.task, s, n)]["trials"] for s in range(seeds))
                          for n in names}
        curves[t.task] = {n: [at(n, f) for f in grid] for n in names}
    return Regrets(y_best, table, trials, grid, curves)


def over_tasks(r: Regrets, name: str, column: int) -> float:
    return statistics.median(r.table[t][name][column] for t in r.table)


def best_hpo(r: Regrets, names: list[str]) -> str:
    """hpo's policy with the lowest median regret over tasks at 50% (then the lowest mean)."""
    half = FRACTIONS.index(0.5)
    hpo_names = [n for n in names if n.startswith("hpo:")] or names
    return min(hpo_names, key=lambda n: (over_tasks(r, n, half),
                                         statistics.mean(r.table[t][n][half] for t in r.table), n))


def wilcoxon(r: Regrets, a: str, b: str) -> tuple[float, int, int, int]:
    """Two-sided Wilcoxon signed-rank p over tasks at 50% of the budget, and
    the tasks where ``a`` is lower, higher, equal. 1.0 when all are equal."""
    from scipy.stats import wilcoxon as test  # type: ignore[import-untyped]

    half = FRACTIONS.index(0.5)
    x = [r.table[t][a][half] for t in r.table]
    y = [r.table[t][b][half] for t in r.table]
    lower = sum(u < v for u, v in zip(x, y))
    higher = sum(u > v for u, v in zip(x, y))
    if lower + higher == 0:
        return 1.0, 0, 0, len(x)
    p = float(test(x, y).pvalue)  # zero differences dropped (Wilcoxon's own rule)
    return p, lower, higher, len(x) - lower - higher


# ------------------------------------------------------------------ the report


def _r(value: float) -> str:
    return f"{value:8.4f}"


def print_tables(r: Regrets, tasks: list[Task], names: list[str], args: argparse.Namespace) -> None:
    width = max(len(n) for n in names) + 1
    head = f"{'contender':<{width}}" + "".join(f"{f'{f:.0%}':>9}" for f in FRACTIONS) + f"{'trials':>9}"
    print(f"\nregret (y - y_best) / (y_random - y_best), median over {args.seeds} seed(s), "
          f"at a share of each task's budget")
    for t in tasks:
        print(f"\ntask {t.task}: budget {t.budget_s:,.0f} s simulated ({args.budget:g} full trainings "
              f"of {t.full_s:,.1f} s on {args.workers} workers); y_best {r.y_best[t.task]:.5f}, "
              f"y_random {t.y_random:.5f}")
        print(head)
        for n in names:
            print(f"{n:<{width}}" + " ".join(_r(v) for v in r.table[t.task][n])
                  + f" {r.trials[t.task][n]:8.0f}")
    print(f"\nall {len(tasks)} tasks: median over tasks of the median regret over seeds")
    print(head[:-9] + f"{'wins@50%':>9}")
    half = FRACTIONS.index(0.5)
    for n in names:
        wins = sum(1 for t in r.table if r.table[t][n][half] == min(r.table[t][m][half] for m in names))
        print(f"{n:<{width}}" + " ".join(_r(over_tasks(r, n, i)) for i in range(len(FRACTIONS)))
              + f" {wins:8d}")


def print_wilcoxon(r: Regrets, names: list[str], best: str) -> dict[str, dict[str, float]]:
    matrix: dict[str, dict[str, float]] = {a: {} for a in names}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            matrix[a][b] = matrix[b][a] = wilcoxon(r, a, b)[0]
    width = max(len(n) for n in names) + 1
    print(f"\nWilcoxon signed-rank over {len(r.table)} tasks at 50% of the budget: {best} "
          "(hpo's best policy there) against each")
    print(f"{'against':<{width}} {'lower':>6} {'higher':>6} {'equal':>6} {'p':>8}")
    for b in names:
        if b != best:
            p, lower, higher, equal = wilcoxon(r, best, b)
            print(f"{b:<{width}} {lower:6d} {higher:6d} {equal:6d} {p:8.4f}")
    return matrix


def print_wall(results: dict[tuple, dict], names: list[str], args: argparse.Namespace, total_s: float) -> None:
    width = max(len(n) for n in names) + 1
    per = {n: [v["wall_s"] for (_, _, m), v in results.items() if m == n] for n in names}
    print(f"\nwall time per run (one task, one seed), seconds, on {args.jobs} process(es)")
    print(f"{'contender':<{width}} {'median':>8} {'max':>8}")
    for n in names:
        print(f"{n:<{width}} {statistics.median(per[n]):8.2f} {max(per[n]):8.2f}")
    one = sum(statistics.median(per[n]) for n in names)
    runs_done = len({(t, s) for t, s, _ in results})
    full = 34 * 5 if args.scenario == "lcbench" else None
    print(f"one task x one seed x all {len(names)} contenders: {one:.1f} s of one process; this run: "
          f"{runs_done} task-seeds in {total_s / 60:.1f} min on {args.jobs} process(es)")
    if full:
        print(f"extrapolated to the full sweep (34 tasks x 5 seeds) at these settings: {one * full / args.jobs / 60:.0f} min "
              f"on {args.jobs} process(es)")


# --------------------------------------------------------------------- plots


class Figures(NamedTuple):
    """What the two plots show, before any drawing."""

    grid: list[float]
    median_curves: dict[str, list[float]]  # contender -> median over tasks at each grid point
    tasks: list[str]
    names: list[str]
    ranks: list[list[float]]  # [task][contender], 1 = lowest regret at 50%
    regret50: list[list[float]]


FLOOR = 1e-4  # a regret of 0 is drawn here on the log scale


def figures(r: Regrets, names: list[str]) -> Figures:
    tasks = list(r.table)
    median_curves = {n: [max(statistics.median(r.curves[t][n][i] for t in tasks), FLOOR)
                         for i in range(len(r.grid))] for n in names}
    half = FRACTIONS.index(0.5)
    regret50 = [[r.table[t][n][half] for n in names] for t in tasks]
    ranks = []
    for row in regret50:
        order = sorted(row)
        ranks.append([order.index(v) + 1 + (order.count(v) - 1) / 2 for v in row])  # ties share
    return Figures(r.grid, median_curves, tasks, names, ranks, regret50)


def draw(f: Figures, path: Path, title: str) -> None:
    import plotly.graph_objects as go  # type: ignore[import-untyped]

    curves = go.Figure()
    for n in f.names:
        curves.add_trace(go.Scatter(x=[100 * g for g in f.grid], y=f.median_curves[n], name=n, mode="lines",
                                    line={"dash": "solid" if n.startswith("hpo:") else "dash"}))
    curves.update_layout(title=f"{title}: median normalised regret over tasks", xaxis_title="% of the budget "
                         "(simulated wall-clock)", yaxis_title=f"regret (log; 0 drawn at {FLOOR:g})",
                         yaxis_type="log", height=600)
    wins = go.Figure(go.Heatmap(z=f.ranks, x=f.names, y=[f"task {t}" for t in f.tasks], colorscale="RdYlGn",
                                reversescale=True, text=[[f"{v:.3f}" for v in row] for row in f.regret50],
                                texttemplate="%{text}", colorbar={"title": "rank"}))
    wins.update_layout(title=f"{title}: rank per task at 50% of the budget (1 = lowest regret; "
                       "text: the regret)", height=max(400, 28 * len(f.tasks) + 200))
    html = ("<html><head><meta charset='utf-8'><title>" + title + "</title></head><body>"
            + curves.to_html(full_html=False, include_plotlyjs=True)
            + wins.to_html(full_html=False, include_plotlyjs=False) + "</body></html>")
    path.write_text(html)


# ---------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="lcbench", choices=sorted(SCENARIOS))
    parser.add_argument("--data", type=Path, default=None,
                        help=f"the YAHPO data folder (default {DEFAULT_DATA}, if it is there)")
    parser.add_argument("--tasks", default="3", help="N (the scenario's first N), all, or ids: 3945,7593")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--budget", type=float, default=200, help="full-training equivalents per task")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes running the runs")
    parser.add_argument("--contenders", default=None, help="name prefixes, e.g. hpo:tpe,optuna")
    parser.add_argument("--out", type=Path, default=Path("bench-out/lcbench"))
    parser.add_argument("--exact-tpe", action="store_true", help="Optuna's own log_ndtr in TPE")
    args = parser.parse_args(argv)
    for name in ("seeds", "workers", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not args.budget > 0:
        parser.error("--budget must be > 0")
    return args


def open_data(args: argparse.Namespace) -> Surrogate:
    if args.data is None:
        if not (DEFAULT_DATA / args.scenario).is_dir():
            print(f"lcbench: error: no --data given and no {DEFAULT_DATA / args.scenario}.\n  fix: "
                  f"pass --data FOLDER, the folder holding {args.scenario}/model.onnx: "
                  "yahpo_data v1.0.2 from https://github.com/slds-lmu/yahpo_data "
                  "(git clone, then --data yahpo_data)", file=sys.stderr)
            raise SystemExit(2)
        args.data = DEFAULT_DATA
    try:
        surrogate = open_surrogate(args.data, args.scenario)
        surrogate.session()
    except (DataMissing, ImportError, ValueError) as exc:
        print(f"lcbench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return surrogate


def pick_tasks(surrogate: Surrogate, spec: str) -> list[str]:
    if spec == "all":
        return list(surrogate.tasks)
    if spec.isdigit() and int(spec) <= len(surrogate.tasks) and "," not in spec and spec not in surrogate.tasks:
        return list(surrogate.tasks[:int(spec)])
    try:
        return [surrogate.check_task(t.strip()) for t in spec.split(",") if t.strip()]
    except ValueError as exc:
        print(f"lcbench: error: --tasks {spec}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    surrogate = open_data(args)
    if not args.exact_tpe:
        fast_tpe()
    names = contenders(args.contenders)
    print(f"lcbench: {load()}")
    print(dehb_note())
    task_ids = pick_tasks(surrogate, args.tasks)
    tasks = [calibrate(surrogate, t, args.budget, args.workers) for t in task_ids]
    print(f"scenario {args.scenario} ({args.data}), {len(tasks)} task(s), {args.seeds} seed(s), "
          f"{args.workers} workers, {args.budget:g} full-training equivalents per task, "
          f"{len(names)} contenders, {args.jobs} process(es)")
    began = time.monotonic()
    results = run_all(args, tasks, names)
    total_s = time.monotonic() - began
    r = regrets(results, tasks, names, args.seeds)
    print_tables(r, tasks, names, args)
    best = best_hpo(r, names)
    matrix = print_wilcoxon(r, names, best)
    print_wall(results, names, args, total_s)
    half = FRACTIONS.index(0.5)
    won = sum(1 for t in r.table if r.table[t][best][half] < r.table[t][runs.REFERENCE][half])
    p = wilcoxon(r, best, runs.REFERENCE)[0]

    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": sys.argv, "scenario": args.scenario, "data": str(args.data), "workers": args.workers,
        "budget_fte": args.budget, "seeds": args.seeds, "exact_tpe": args.exact_tpe,
        "fractions": FRACTIONS, "normalisation": "(y - y_best) / (y_random - y_best), clipped to [0, 1]",
        "tasks": {t.task: {**t._asdict(), "y_best": r.y_best[t.task], "regret": r.table[t.task],
                           "trials": r.trials[t.task]} for t in tasks},
        "runs": {f"{task}/{seed}/{name}": v for (task, seed, name), v in results.items()},
        "best_hpo": best, "reference": runs.REFERENCE, "tasks_won": won, "wilcoxon_p": p,
        "wilcoxon_matrix": matrix, "wall_s": total_s,
    }
    (args.out / "lcbench.json").write_text(json.dumps(record, indent=1))
    draw(figures(r, names), args.out / "lcbench.html", f"{args.scenario}, {args.workers} workers, "
         f"{args.budget:g} full trainings")
    print(f"\nwrote {args.out / 'lcbench.json'} and {args.out / 'lcbench.html'}")
    print(f"hpo's best policy at 50%: {best}; reference: {runs.REFERENCE}")
    print(f"lcbench: {load()}")
    print(f"tasks_won={won} of {len(tasks)}")
    print(f"wilcoxon_p={p:.4f}")


if __name__ == "__main__":
    main()
