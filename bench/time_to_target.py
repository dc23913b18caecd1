"""Time until the good configurations are found: FIFO against early stopping
and the time-sharing policies, in Hermes' two bins.

Workload (real training, bundled data): scikit-learn ``MLPClassifier`` on the
digits data, trained epoch by epoch, 4 reports an epoch, with an emulated
resume cost (``bench/_resume_cost.py``: a resumed trial first sleeps
``--resume-cost-s``, timed as a checkpoint restore). Two bins of 16
configurations (2 solvers x 2 widths x 4 learning rates), as in the Hermes
paper (Electronics 2021): bin 1 has 4 good configurations, bin 2 has 12. Jobs
enter in a random order, the same for every policy (as the paper randomises
the queue with a fixed seed). Policies, on 2 slots of one warm 2-worker Dask
cluster:

- ``fifo``: every trial to its end (what the original PyCOMPSs study did);
- ``fifo+asha``: the same with successive halving pruning;
- ``round_robin`` and ``slaq``: time-sharing with quanta 3x Hermes' (the paper
  gave Gandiva and SLAQ 30 s against Hermes' 10 s);
- ``convergence``: Hermes as published (time quanta that grow with
  preemptions, preemption only when a waiting trial converges faster);
- ``convergence+milestones``: the same with quanta doubled at 75% and 90%
  loss decrease (the paper leaves the milestones to the user);
- ``convergence+bayes``: ``convergence`` with TPE proposing the order,
  learning from suspended trials' curves.

Quanta keep Hermes' proportions: its 10 s was about 1/8 of its median job
(1,000 iterations in 30 to 110 s), so ``--quantum-s`` defaults to 1/8 of the
first reference run's median trial, and the resume cost to 15% of the
quantum (Hermes measured 0.67 to 1.57 s). ``--max-checkpoint-share`` is 0.2
here: hpo's default 0.05 would stretch such a quantum to 3x its length, which
Hermes does not do.

A first FIFO run of each bin gives its best loss L*. A configuration is good
when it gets 90% of the way from an untrained classifier's loss (ln 10) to
L*; the paper's metric is the *average* time until the good configurations
get there; "every" is the time until the last one does (the study is then
stopped by SIGTERM, its clean stop). The store is polled every 0.2 s.

Then search: convergence with random search against convergence with TPE,
same budget (16 of the 32 configurations of both bins together), time until
a trial reaches loss 0.10 (7 of the 32 do), seeds varied per round.

Run: ``python bench/time_to_target.py [--repeats R]``; medians over R
interleaved rounds. Last lines: ``speedup_vs_fifo_min=<the smaller of the two
bins' best-policy speedups, paper's metric>`` and
``bayes_vs_random=<time to target of convergence+random / convergence+bayes>``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
from distributed import LocalCluster  # noqa: E402

from hpo.store import RunDir  # noqa: E402
from hpo.store.records import run_of  # noqa: E402

BINS = {  # learning rates; with 2 solvers and 2 widths, 16 configurations
    "bin1": [1e-6, 1e-5, 3e-3, 1.0],  # 4 good: lr 3e-3
    "bin2": [3e-4, 1e-3, 3e-3, 1.0],  # 12 good: all but the diverging lr 1.0
}
POOL = [1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 1.0]  # both bins and more: 32 configurations
SEARCH_TARGET = 0.10
POLL_S = 0.2
UNTRAINED_LOSS = math.log(10)  # log loss of uniform guesses over ten classes


def policies(quantum_s: float, share: float) -> dict[str, dict]:
    hermes = {"policy": "convergence", "quantum_s": quantum_s, "max_checkpoint_share": share}
    baseline = {"quantum_s": 3 * quantum_s, "max_checkpoint_share": share}
    return {
        "fifo": {},
        "fifo+asha": {"early_stopping": {"pruner": "asha", "min_steps": 2}},
        "round_robin": {"scheduling": {"policy": "round_robin", **baseline}},
        "slaq": {"scheduling": {"policy": "slaq", **baseline}},
        "convergence": {"scheduling": hermes},
        "convergence+milestones": {"scheduling": {**hermes, "milestones": ["75%", "90%"]}},
        "convergence+bayes": {"scheduling": hermes, "search": {"algorithm": "bayesian"}},
    }


def space(name: str, rates: list[float], args, extra: dict, seed: int, budget: int) -> dict:
    search = {"algorithm": "random", "seed": seed, "max_trials": budget, "parallel": 2,
              **extra.get("search", {})}
    return {
        "name": name, "objective": "_resume_cost:train",
        "metric": {"name": "val_loss", "direction": "minimize"},
        "fixed": {"max_epochs": args.epochs, "batch_size": 16, "reports_per_epoch": 4,
                  "resume_cost_s": args.resume_cost_s or 0.0},
        "space": {"learning_rate": rates, "solver": ["sgd", "adam"], "units": [64, 512]},
        **{k: v for k, v in extra.items() if k != "search"}, "search": search,
    }


def run(label: str, study: dict, address: str, tmp: Path, target: float | None,
        good: set[str] | None, first_only: bool = False) -> dict:
    """Run one study; stop it once every good configuration reached
    ``target`` (with ``first_only``: run it to its budget, timing the first
    configuration that gets there)."""
    name = study["name"]
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(study))
    command = [sys.executable, "-m", "hpo", "run", str(path), "--engine", "dask",
               "--scheduler", address, "--runs-dir", str(tmp), "--quiet"]
    study_proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reached: dict[str, float] = {}
    run_dir = RunDir(tmp / name)
    while study_proc.poll() is None:
        time.sleep(POLL_S)
        trials = _trials(run_dir)
        now = time.time()
        for t in trials:  # (a trial TPE is still sampling has no parameters yet: no reports either)
            if target is not None and any(v <= target for v in t.intermediate_values.values()):
                reached.setdefault(_config(t), now)
        wanted = f"{len(reached)}/1 reached" if first_only else \
            f"{sum(1 for c in reached if good and c in good)}/{len(good or ())} good reached"
        status(f"{label}: {len(trials)} trials started, {wanted}")
        if good and good <= set(reached):
            study_proc.send_signal(signal.SIGTERM)  # the clean stop
            study_proc.wait()
    trials = _trials(run_dir)
    start = min(run_of(t)["started_at"] for t in trials if run_of(t))
    losses = {_config(t): min(t.intermediate_values.values()) for t in trials if t.intermediate_values}
    best = min(losses, key=losses.get)
    times = [min(reached.values()) - start] if first_only and reached else \
        [reached[c] - start for c in (good or ()) if c in reached]
    complete = bool(reached) if first_only else bool(good) and good <= set(reached)
    return {
        "average_s": statistics.mean(times) if complete else math.inf,
        "every_s": max(times) if complete else math.inf,
        "best_loss": losses[best], "best_config": best, "losses": losses,
        "reports": sum(len(t.intermediate_values) for t in trials),
        "trial_s": [(t.datetime_complete - t.datetime_start).total_seconds()
                    for t in trials if t.state is optuna.trial.TrialState.COMPLETE],
    }


def _trials(run_dir: RunDir) -> list[optuna.trial.FrozenTrial]:
    try:
        return run_dir.load_study().get_trials(deepcopy=False)
    except Exception:  # not created yet
        return []


def _config(trial: optuna.trial.FrozenTrial) -> str:
    params = trial.params
    return f"{params['solver']} lr={params['learning_rate']:g} units={params['units']}"


def status(text: str) -> None:
    sys.stderr.write(f"\r\033[K{text}")
    sys.stderr.flush()


def unique(label: str) -> str:
    return f"{label.replace('+', '-')}-{time.monotonic_ns()}"


def bins(args, address: str, tmp: Path) -> dict[str, dict]:
    """Each bin: its reference FIFO run, then every policy, interleaved."""
    found = {}
    for bin_name in args.bins:
        rates = BINS[bin_name]
        reference = run(f"{bin_name} reference", space(unique("ref"), rates, args, {}, 0, 16),
                        address, tmp, None, None)
        scale(args, reference)
        target = UNTRAINED_LOSS - 0.9 * (UNTRAINED_LOSS - reference["best_loss"])
        good = {c for c, loss in reference["losses"].items() if loss <= target}
        print(f"\r{bin_name} reference FIFO run: L*={reference['best_loss']:.4f} "
              f"({reference['best_config']}), target loss {target:.4f}, {len(good)} good",
              file=sys.stderr)
        runs: dict[str, list[dict]] = {p: [] for p in args.policies}
        order = list(runs)
        for round_ in range(args.repeats):
            for policy in order[round_ % len(order):] + order[:round_ % len(order)]:
                extra = policies(args.quantum_s, args.max_checkpoint_share)[policy]
                study = space(unique(policy), rates, args, extra, 0, 16)
                runs[policy].append(run(f"{bin_name} {policy}", study, address, tmp, target, good))
        found[bin_name] = {"target": target, "good": good, "runs": runs, "reference": reference}
    return found


def scale(args, reference: dict) -> None:
    """Hermes' quantum and resume cost in proportion to these trials, from
    the first reference run: its 10 s quantum was 1/8 of its median job (1,000
    iterations in 30 to 110 s, Table 2) and a resume cost 0.67 to 1.57 s,
    15% of the quantum at most."""
    if args.quantum_s is None:
        median = statistics.median(reference["trial_s"])  # a FIFO run completes its trials
        args.quantum_s = round(median / 8, 2)
        print(f"\rquantum {args.quantum_s:g} s: 1/8 of the reference run's median trial "
              f"({median:.2f} s)", file=sys.stderr)
    if args.resume_cost_s is None:
        args.resume_cost_s = round(0.15 * args.quantum_s, 3)


def search(args, address: str, tmp: Path) -> dict[str, list[dict]]:
    """Convergence-aware with random search against TPE, seeds varied per
    round, each to the end of its budget (to compare what they found)."""
    runs: dict[str, list[dict]] = {"random": [], "bayes": []}
    hermes = policies(args.quantum_s, args.max_checkpoint_share)["convergence"]
    for round_ in range(args.repeats):
        for kind in (["random", "bayes"] if round_ % 2 == 0 else ["bayes", "random"]):
            extra = {**hermes, "search": {"algorithm": "bayesian"}} if kind == "bayes" else hermes
            study = space(unique(f"search-{kind}"), POOL, args, extra, seed=round_ + 1, budget=16)
            runs[kind].append(run(f"search {kind} (round {round_ + 1})", study, address, tmp,
                                  SEARCH_TARGET, None, first_only=True))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--epochs", type=int, default=48, help="epochs of a full trial")
    parser.add_argument("--quantum-s", type=float,
                        help="Hermes' quantum (default: 1/8 of a reference trial, as in the paper)")
    parser.add_argument("--resume-cost-s", type=float,
                        help="emulated cost of each resume (default: 15%% of the quantum, as "
                             "Hermes' 1.5 s of 10 s)")
    parser.add_argument("--max-checkpoint-share", type=float, default=0.2,
                        help="scheduling.max_checkpoint_share (hpo's default 0.05 would stretch "
                             "the scaled quantum; Hermes' own share was up to 0.16)")
    parser.add_argument("--bins", nargs="+", choices=list(BINS), default=list(BINS))
    names = list(policies(quantum_s=1.0, share=1.0))  # (the names only)
    parser.add_argument("--policies", nargs="+", default=names, choices=names,
                        help="fifo is the reference, always run")
    parser.add_argument("--no-search", action="store_true", help="skip random against TPE")
    args = parser.parse_args()
    args.policies = ["fifo", *(p for p in args.policies if p != "fifo")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per slot, as the engine plans
    # Workers and the study's master import the objective from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench"), str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # diverging bins overflow
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster, \
            tempfile.TemporaryDirectory(prefix="hpo-ttt-", ignore_cleanup_errors=True) as tmp:
        found = bins(args, cluster.scheduler_address, Path(tmp))
        searched = {} if args.no_search else search(args, cluster.scheduler_address, Path(tmp))
        status("")
        report(found, searched, args)


def report(found: dict[str, dict], searched: dict[str, list[dict]], args) -> None:
    print(f"\rtime until the good configurations reach 90% of the way to L*; medians of "
          f"{args.repeats}; 2 slots; {args.epochs} epochs a trial; quantum {args.quantum_s:g} s; "
          f"resume cost {args.resume_cost_s:g} s; max_checkpoint_share {args.max_checkpoint_share:g}")
    speedups = {}
    for bin_name, result in found.items():
        runs = result["runs"]
        print(f"\n{bin_name}: {len(result['good'])} good of 16, target loss {result['target']:.4f}")
        print(f"{'policy':<22} {'average_s':>9} {'vs FIFO':>8} {'every_s':>8} {'vs FIFO':>8} "
              f"{'reports':>7} {'best loss':>10}  best configuration")
        average = {p: statistics.median(r["average_s"] for r in rs) for p, rs in runs.items()}
        every = {p: statistics.median(r["every_s"] for r in rs) for p, rs in runs.items()}
        for policy, rs in runs.items():
            last = rs[-1]
            print(f"{policy:<22} {_s(average[policy])} {_x(average['fifo'], average[policy])} "
                  f"{_s(every[policy], 8)} {_x(every['fifo'], every[policy])} "
                  f"{statistics.median(r['reports'] for r in rs):7.0f} {last['best_loss']:10.4f}  "
                  f"{last['best_config']}")
        best = min((p for p in average if p != "fifo"), key=average.get)
        speedups[bin_name] = average["fifo"] / average[best]
        print(f"best policy: {best} ({speedups[bin_name]:.2f}x, average time of the good ones)")
    medians = report_search(searched) if searched else None
    print(f"speedup_vs_fifo_min={min(speedups.values()):.2f}")
    if medians:
        print(f"bayes_vs_random={medians['random'] / medians['bayes']:.2f}")


def report_search(searched: dict[str, list[dict]]) -> dict[str, float]:
    """Print random against TPE; their median times to the target."""
    print(f"\nsearch: convergence-aware, 16 of the 32 configurations, time until loss <= {SEARCH_TARGET}")
    print(f"{'search':<8} {'time_s':>7} {'best loss':>10}  best configuration (per round)")
    medians = {}
    for kind, rs in searched.items():
        medians[kind] = statistics.median(r["average_s"] for r in rs)
        bests = "; ".join(f"{r['best_config']} ({r['best_loss']:.4f})" for r in rs)
        print(f"{kind:<8} {_s(medians[kind], 7)} {min(r['best_loss'] for r in rs):10.4f}  {bests}")
    return medians


def _x(fifo: float, value: float) -> str:
    """The speedup over FIFO in an 8-wide cell; ``-`` for a policy that never got there."""
    return f"{'-':>8}" if math.isinf(value) else f"{fifo / value:7.2f}x"


def _s(value: float, width: int = 9) -> str:
    return f"{'never':>{width}}" if math.isinf(value) else f"{value:{width}.1f}"


if __name__ == "__main__":
    main()
