"""Time until the good configurations are found: FIFO against early stopping
and the scheduling policies.

Workload (real training, bundled data): scikit-learn ``MLPClassifier`` on the
digits data, trained epoch by epoch (``hpo.examples.sklearn_digits:train_mlp``),
16 configurations in bins as in Hermes: learning rates from far too small to
too large, two optimizers, two widths; only a few are good. Metric: validation
log loss (minimised). Policies, on 2 slots of one warm 2-worker Dask cluster:

- ``fifo``: every trial to its end, in the grid's order (what the original
  PyCOMPSs study did);
- ``fifo+asha``: the same with successive halving pruning;
- ``round_robin`` and ``convergence``: resumable segments of 3 epochs that
  double at loss milestones 0.3 and 0.15; the next segment goes to the trial
  that has waited longest, or to the fastest-converging one (Hermes).

A first FIFO run to the end defines the best loss L* over all configurations.
A configuration "reaches 90% of the best loss" when it has gone 90% of the way
from an untrained classifier's loss (L0 = ln 10, uniform guesses over the ten
digits) to L*: loss <= L0 - 0.9 (L0 - L*). The *good* configurations are those
that get there in the FIFO run. For each policy: the wall time from the study's first trial start until
every good configuration has reached that loss (the study is then stopped by
SIGTERM, its clean stop), and the best loss found by then with its
configuration. The store is polled every 0.2 s, so times are +-0.2 s.

Run: ``python bench/time_to_target.py [--repeats R] [--epochs E]``; medians over
R interleaved rounds. Last line: ``speedup_vs_fifo=<FIFO time / best policy time>``.
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

POLICIES = {
    "fifo": {},
    "fifo+asha": {"early_stopping": {"pruner": "asha", "min_steps": 2}},
    "round_robin": {"scheduling": {"policy": "round_robin", "segment_steps": 4, "milestones": [0.3, 0.15]}},
    "convergence": {"scheduling": {"policy": "convergence", "segment_steps": 4, "milestones": [0.3, 0.15]}},
}
POLL_S = 0.2
UNTRAINED_LOSS = math.log(10)  # log loss of uniform guesses over ten classes


def space(name: str, epochs: int, extra: dict) -> dict:
    return {
        "name": name, "objective": "hpo.examples.sklearn_digits:train_mlp",
        "metric": {"name": "val_loss", "direction": "minimize"},
        "search": {"algorithm": "grid", "parallel": 2},
        "fixed": {"max_epochs": epochs, "batch_size": 16, "reports_per_epoch": 4},
        # Bins: far too small (flat), too small (slow), good, too large
        # (diverges). Grid order: learning rate first, as a user would write it.
        "space": {"learning_rate": [1e-6, 1e-4, 1e-2, 1.0], "solver": ["sgd", "adam"],
                  "units": [64, 512]},
        **extra,
    }


def run(policy: str, epochs: int, address: str, tmp: Path, target: float | None,
        good: set[int] | None) -> dict:
    """Run one study; stop it once every good configuration reached ``target``."""
    name = f"{policy.replace('+', '-')}-{time.monotonic_ns()}"
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(space(name, epochs, POLICIES[policy])))
    command = [sys.executable, "-m", "hpo", "run", str(path), "--engine", "dask",
               "--scheduler", address, "--runs-dir", str(tmp), "--quiet"]
    study_proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reached: dict[int, float] = {}
    run_dir = RunDir(tmp / name)
    while study_proc.poll() is None:
        time.sleep(POLL_S)
        trials = _trials(run_dir)
        now = time.time()
        for t in trials:
            if target is not None and t.number not in reached and \
                    any(v <= target for v in t.intermediate_values.values()):
                reached[t.number] = now
        status(f"{policy}: {len(trials)} trials started, "
               f"{sum(1 for n in reached if good and n in good)}/{len(good or ())} good reached")
        if good and good <= set(reached):
            study_proc.send_signal(signal.SIGTERM)  # the clean stop
            study_proc.wait()
    trials = _trials(run_dir)
    start = min(run_of(t)["started_at"] for t in trials if run_of(t))
    losses = {t.number: min(t.intermediate_values.values()) for t in trials if t.intermediate_values}
    best = min(losses, key=losses.get)
    done = good is not None and good <= set(reached)
    return {
        "time_s": max(reached[n] for n in good) - start if done else float("nan"),
        "best_loss": losses[best], "best_config": _config(trials, best), "losses": losses,
        "configs": {t.number: _config(trials, t.number) for t in trials},
        "reports": sum(len(t.intermediate_values) for t in trials),
    }


def _trials(run_dir: RunDir) -> list[optuna.trial.FrozenTrial]:
    try:
        return run_dir.load_study().get_trials(deepcopy=False)
    except Exception:  # not created yet
        return []


def _config(trials: list[optuna.trial.FrozenTrial], number: int) -> str:
    params = next(t.params for t in trials if t.number == number)
    return f"{params['solver']} lr={params['learning_rate']:g} units={params['units']}"


def status(text: str) -> None:
    sys.stderr.write(f"\r\033[K{text}")
    sys.stderr.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--epochs", type=int, default=48, help="epochs of a full trial")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per slot, as the engine plans
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # diverging bins overflow
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster, \
            tempfile.TemporaryDirectory(prefix="hpo-ttt-", ignore_cleanup_errors=True) as tmp:
        reference = run("fifo", args.epochs, cluster.scheduler_address, Path(tmp), None, None)
        best_loss = reference["best_loss"]
        target = UNTRAINED_LOSS - 0.9 * (UNTRAINED_LOSS - best_loss)
        good = {n for n, loss in reference["losses"].items() if loss <= target}
        print(f"\rreference FIFO run: L*={best_loss:.4f} ({reference['best_config']}), target "
              f"loss {target:.4f}, good: {', '.join(reference['configs'][n] for n in sorted(good))}",
              file=sys.stderr)
        results: dict[str, list[dict]] = {p: [] for p in POLICIES}
        order = list(POLICIES)
        for round_ in range(args.repeats):
            for policy in order[round_ % len(order):] + order[:round_ % len(order)]:
                results[policy].append(run(policy, args.epochs, cluster.scheduler_address,
                                           Path(tmp), target, good))
        status("")
        report(results, target, good, args)


def report(results: dict[str, list[dict]], target: float, good: set[int], args) -> None:
    print(f"\rtime until every good configuration reaches loss {target:.4f} (90% of the way to L*); "
          f"{len(good)} good of 16; medians of {args.repeats}; 2 slots; {args.epochs} epochs a trial")
    print(f"{'policy':<13} {'time_s':>7} {'vs FIFO':>8} {'reports':>7} {'best loss':>10}  best configuration")
    fifo = statistics.median(r["time_s"] for r in results["fifo"])
    times = {}
    for policy, runs in results.items():
        # A policy that never got every good configuration there (a pruner
        # stopped one) counts as infinitely slow.
        times[policy] = statistics.median(math.inf if math.isnan(r["time_s"]) else r["time_s"]
                                          for r in runs)
        last = runs[-1]
        print(f"{policy:<13} {times[policy]:7.1f} {fifo / times[policy]:7.2f}x "
              f"{statistics.median(r['reports'] for r in runs):7.0f} {last['best_loss']:10.4f}  "
              f"{last['best_config']}")
    best_policy = min((p for p in times if p != "fifo"), key=times.get)
    print(f"best policy: {best_policy}")
    print(f"speedup_vs_fifo={fifo / times[best_policy]:.2f}")


if __name__ == "__main__":
    main()
