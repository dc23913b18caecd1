"""Is the simulated engine faithful? The same LCBench studies on simulated
time and for real, side by side.

Each task runs twice with the same seed and policy (random search + ASHA by
default): on the simulated engine, and on the Dask engine with an embedded
cluster of ``--workers`` worker processes, where each epoch is a real sleep
of the surrogate's training time divided by ``--scale`` (1,000). Both runs
get the same budget in those scaled seconds. Printed per task: the trials
each started, the share of trials that ended the same way after the same
number of epochs (decisions), whether the trials ended in the same order
(and Kendall's tau of the two orders), and the best validation error found
by 10%, 25%, 50% and 100% of the budget in each run, with the largest gap
between the two regret curves (regret normalised by the median error of a
random configuration, as in ``bench/lcbench.py``).

Run: ``python bench/sim_vs_real.py [--tasks 3945,7593] [--workers 32]
[--budget 50] [--scale 1000] [--policy asha]``. Last line
``max_regret_gap=<largest gap over tasks and budget shares>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import share_paths

# The embedded cluster's workers import the timed objective from here.
share_paths()

import hpo  # noqa: E402
from hpo.engines import SimulatedEngine  # noqa: E402
from hpo.examples.lcbench import open_surrogate, space  # noqa: E402

SHARES = (0.10, 0.25, 0.50, 1.00)
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yahpo"


def study(task: str, data: Path, policy: str, seed: int, workers: int, budget_s: float,
          scale: float) -> dict[str, Any]:
    settings = {"search": {"algorithm": "random", "seed": seed, "max_trials": 1_000_000,
                           "parallel": workers, "timeout_s": budget_s / scale},
                "early_stopping": {"pruner": policy}}
    body = space(task, data, name=f"faithful-{task}", **settings)
    body["objective"] = "_timed_lcbench:train"
    body["fixed"] = {**body["fixed"], "time_scale": 1.0 / scale}
    return body


def run(body: dict[str, Any], engine: Any, workers: int, first_cost: Any) -> tuple[hpo.StudyResult, float]:
    """The study's result and when its first trial started, on the clock its
    reports carry (the first report's clock less that epoch's cost:
    ``first_cost(params)``); a cluster's start-up is not the study's time."""
    with tempfile.TemporaryDirectory(prefix="hpo-faithful-") as runs:
        options = {"workers": workers} if engine == "dask" else {}
        result = hpo.run(body, engine=engine, runs_dir=runs, progress=False, **options)
    params = {t.number: t.params for t in result.trials}
    began = min((curve[0][1]["clock"] - first_cost(params[n]) for n, curve in result.curves.items()
                 if curve and curve[0][0] == 0), default=0.0)
    return result, began


def best_by(result: hpo.StudyResult, began: float, at: float) -> float:
    """The best validation error reported by ``at`` seconds into the study."""
    values = [m["val_error"] for curve in result.curves.values() for _, m in curve
              if m.get("clock", float("inf")) - began <= at]
    return min(values, default=float("nan"))


def decisions(result: hpo.StudyResult) -> dict[int, tuple[str, int]]:
    return {t.number: (t.state.value, t.steps) for t in result.trials}


def end_order(result: hpo.StudyResult) -> list[int]:
    last = {n: max((m.get("clock", 0.0) for _, m in curve), default=0.0)
            for n, curve in result.curves.items()}
    return sorted(last, key=lambda n: (last[n], n))


def kendall_tau(a: list[int], b: list[int]) -> float:
    common = [n for n in a if n in set(b)]
    where = {n: i for i, n in enumerate(b)}
    pairs = agree = 0
    for i in range(len(common)):
        for j in range(i + 1, len(common)):
            pairs += 1
            agree += where[common[i]] < where[common[j]]
    return (2 * agree - pairs) / pairs if pairs else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="3945,7593")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--budget", type=float, default=50, help="full-training equivalents")
    parser.add_argument("--scale", type=float, default=1000.0)
    parser.add_argument("--policy", default="asha", choices=("median", "asha", "hyperband"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not (args.data / "lcbench").is_dir():
        print(f"sim_vs_real: no LCBench surrogate in {args.data}.\n  fix: pass --data, the folder "
              "holding lcbench/ (YAHPO Gym's surrogate data)", file=sys.stderr)
        return 2
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
          f"{args.workers} workers, {args.budget:g} full-training equivalents, time / {args.scale:g}, "
          f"random + {args.policy}, seed {args.seed}")
    surrogate = open_surrogate(args.data, "lcbench")
    gaps = []
    for task in args.tasks.split(","):
        sample = surrogate.sample(256, seed=0)
        curves = [surrogate.curve(task, p) for p in sample]
        full_s = statistics.median(float(c.costs.sum()) for c in curves)
        y_random = statistics.median(float(c.errors[-1]) for c in curves)
        budget_s = args.budget * full_s / args.workers
        body = study(task, args.data, args.policy, args.seed, args.workers, budget_s, args.scale)
        t0 = time.perf_counter()
        def first_cost(params: dict[str, Any], task: str = task) -> float:
            return float(surrogate.curve(task, params).costs[0]) / args.scale

        simulated, sim_began = run(body, SimulatedEngine(slots=args.workers), args.workers, first_cost)
        sim_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        real, real_began = run(body, "dask", args.workers, first_cost)
        real_wall = time.perf_counter() - t0
        same = decisions(simulated), decisions(real)
        common = set(same[0]) & set(same[1])
        agree = sum(same[0][n] == same[1][n] for n in common) / max(len(common), 1)
        orders = end_order(simulated), end_order(real)
        y_best = min(best_by(simulated, sim_began, float("inf")), best_by(real, real_began, float("inf")))
        print(f"\ntask {task}: budget {budget_s:,.0f} s simulated ({budget_s / args.scale:.1f} s real); "
              f"trials {len(same[0])} simulated, {len(same[1])} real; same end after the same epochs "
              f"{agree:.0%} of {len(common)}; same order {orders[0] == orders[1]}, "
              f"Kendall tau {kendall_tau(*orders):.2f}; wall {sim_wall:.1f} s simulated, {real_wall:.1f} s real")
        print("share  best simulated  best real  regret simulated  regret real  gap")
        for share in SHARES:
            at = share * budget_s / args.scale
            sim = best_by(simulated, sim_began, at)
            rl = best_by(real, real_began, at)
            regret = [(y - y_best) / max(y_random - y_best, 1e-12) for y in (sim, rl)]
            gap = abs(regret[0] - regret[1])
            gaps.append(gap)
            print(f"{share:>4.0%}  {sim:14.4f}  {rl:9.4f}  {regret[0]:16.3f}  {regret[1]:11.3f}  {gap:.3f}")
    print(f"\nmax_regret_gap={max(gaps):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
