"""GPU allocation policies on an emulated heterogeneous cluster.

Two nodes of four virtual GPUs each, of speeds 1, 1, 0.5 and 0.25 (a Dask
scheduler and one worker per node, on 127.0.0.1 and 127.0.0.2, declaring
``GPU=4`` and ``HPO_GPU_SPEEDS``). 24 trials (``hpo.examples.emulated_gpu``) sleep
through their batches at FLEET's rate curve for their GPU count and their
slowest GPU's speed, with single-GPU rates spread like FLEET's DNNs (21 to
176 samples/s, log-uniform) and the same work each; the real master,
engine, store and allocator do everything else. Compared, interleaved:

- ``fifo-1gpu``: every trial on one GPU, in proposal order (what hpo did before);
- ``longest-first``: the cost model's longest trials first;
- ``rate``: FLEET's flotillas (GPU counts from the rate curves, packed on
  nodes), growing running trials onto GPUs that free up;
- ``rate+speed``: the same, with the fastest GPUs to the trials that gain most.

Figures per policy (medians over rounds): makespan (first start to last
end), GPU idle % (1 - GPU-busy seconds / (8 x makespan)), time until the
best configuration is known (its trial's end), and the cost model's
step-time error (each allocation's predicted step time against the
trial's measured profile). ``oracle_error_pct`` is measured on the real
thing instead: the paraDL model against Keras training the digits MLP on
this machine (4 configurations).

Run: ``python bench/allocation.py [--rounds R] [--scale S]``. Last lines:
``makespan_speedup=<fifo-1gpu / best>``, ``gpu_idle_pct=<best policy>``,
``oracle_error_pct=<median Keras step-time error>``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))
# Dask workers import the objective; they run where this is run from.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import hpo  # noqa: E402
from hpo.store import RunDir  # noqa: E402
from hpo.store.records import allocations_of, profiles_of, run_of  # noqa: E402

SPEEDS = "1,1,0.5,0.25"
HOSTS = ("127.0.0.1", "127.0.0.2")
GPUS = 8
POLICIES = {
    "fifo-1gpu": {"policy": "fifo"},
    "longest-first": {"policy": "longest_first"},
    "rate": {"policy": "rate"},
    "rate+speed": {"policy": "rate", "placement": "speed"},
}


def trials(count: int, scale: float, seed: int) -> list[dict]:
    """The 24 emulated trainings: FLEET's spread of single-GPU rates, the same work each."""
    rng = random.Random(seed)
    batch = 8
    samples = batch * round(22 * scale)  # an epoch: ~2 s on one GPU at 88 samples/s
    return [{"rate": round(math.exp(rng.uniform(math.log(21), math.log(176))), 1),
             "efficiency": round(rng.uniform(0.85, 0.95), 3), "quality": round(rng.random(), 4),
             "profile_error": round(rng.uniform(-0.1, 0.1), 3), "weights": 10_000_000,
             "batch_size": batch, "samples": samples, "epochs": 4} for _ in range(count)]


def space(name: str, policy: dict, configs: list[dict]) -> dict:
    return {"name": name, "objective": "hpo.examples.emulated_gpu:train", "metric": {"name": "value"},
            "search": {"algorithm": "grid", "parallel": GPUS},
            "resources": {"gpus": 1}, "allocation": {**policy, "cost_model": "hpo.examples.emulated_gpu:cost",
                                                      "profile_batches": 24},
            "fixed": {"configs": configs}, "space": {"i": list(range(len(configs)))}}


def start_cluster(tmp: Path) -> tuple[str, list[subprocess.Popen]]:
    scheduler_file = tmp / "scheduler.json"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", HOSTS[0],
                               "--port", "0", "--scheduler-file", str(scheduler_file),
                               "--dashboard-address", ":0"], **quiet)]
    while not scheduler_file.exists():
        time.sleep(0.1)
    for host in HOSTS:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
             "--nthreads", "4", "--host", host, "--no-dashboard", "--local-directory", str(tmp),
             "--resources", "GPU=4 CPU=4"],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3", "HPO_GPU_SPEEDS": SPEEDS}, **quiet))
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file)) as client:
        client.wait_for_workers(len(HOSTS), timeout=120)
    return str(scheduler_file), procs


def measure(run_dir: Path, configs: list[dict]) -> dict[str, float]:
    """Makespan, GPU idle %, time to the best, step-time error, from the store."""
    study = RunDir(run_dir).load_study()
    runs = [(t, run_of(t)) for t in study.trials]
    start = min(r["started_at"] for _, r in runs)
    end = max(t.datetime_complete.timestamp() for t, _ in runs)
    busy = sum(r.get("gpu_seconds", 0.0) for _, r in runs)
    best = max(runs, key=lambda tr: configs[tr[0].params["i"]]["quality"])[0]
    errors = []
    for trial, _ in runs:
        for allocation in allocations_of(trial):
            profile = profiles_of(trial).get(float(allocation["gpus"]))
            if profile and allocation.get("predicted_step_s"):
                errors.append(abs(allocation["predicted_step_s"] - profile["batch_s"]) / profile["batch_s"])
    grown = sum(1 for t, _ in runs for a in allocations_of(t)[1:] if a["gpus"] > allocations_of(t)[0]["gpus"])
    return {"makespan": end - start, "idle": 100 * (1 - busy / (GPUS * (end - start))),
            "to_best": best.datetime_complete.timestamp() - start,
            "error": 100 * statistics.median(errors) if errors else float("nan"), "grown": grown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--scale", type=float, default=1.0, help="work per trial (1: ~6-50 s on one GPU)")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--keep", type=Path, help="keep the studies' run directories here")
    parser.add_argument("--no-keras", action="store_true", help="skip the Keras cost-model check")
    args = parser.parse_args()
    configs = trials(args.trials, args.scale, seed=7)
    found: dict[str, list[dict]] = {name: [] for name in args.policies}
    with tempfile.TemporaryDirectory(prefix="hpo-alloc-") as tmp:
        address, procs = start_cluster(Path(tmp))
        try:
            for round_ in range(args.rounds):
                for name in args.policies:
                    label = f"{name.replace('+', '-')}-{round_}"
                    status(f"round {round_ + 1}/{args.rounds}: {name} ...")
                    began = time.monotonic()
                    runs = args.keep or Path(tmp) / "runs"
                    hpo.run(space(label, POLICIES[name], configs), engine="dask", scheduler=address,
                            runs_dir=runs, progress=False)
                    found[name].append(measure(runs / label, configs))
                    status(f"round {round_ + 1}/{args.rounds}: {name} done in "
                           f"{time.monotonic() - began:.0f} s\n")
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
    report(found, digits_error() if not args.no_keras else float("nan"))


def digits_error() -> float:
    """The paraDL model against Keras on the digits MLP (fit step times)."""
    status("cost model against Keras (digits MLP) ...")
    out = subprocess.run([sys.executable, str(BENCH / "_oracle_digits.py")], capture_output=True,
                         text=True, check=True).stdout
    status("\n")
    print(out.strip())
    return float(out.strip().splitlines()[-1].split("=")[1])


def report(found: dict[str, list[dict]], oracle_error: float) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in found[name])

    print(f"\n{'policy':<15}{'makespan s':>11}{'speedup':>9}{'GPU idle %':>11}{'to best s':>10}"
          f"{'step err %':>11}{'grown':>7}")
    fifo = median("fifo-1gpu", "makespan") if "fifo-1gpu" in found else float("nan")
    for name in found:
        print(f"{name:<15}{median(name, 'makespan'):>11.1f}{fifo / median(name, 'makespan'):>9.2f}"
              f"{median(name, 'idle'):>11.1f}{median(name, 'to_best'):>10.1f}"
              f"{median(name, 'error'):>11.1f}{median(name, 'grown'):>7.0f}")
    best = min(found, key=lambda n: median(n, "makespan"))
    print(f"\nbest policy: {best}")
    print(f"makespan_speedup={fifo / median(best, 'makespan'):.2f}")
    print(f"gpu_idle_pct={median(best, 'idle'):.1f}")
    print(f"oracle_error_pct={oracle_error:.1f}")


def status(text: str) -> None:
    sys.stderr.write("\r" + text if not text.endswith("\n") else "\r" + text)
    sys.stderr.flush()


if __name__ == "__main__":
    main()
