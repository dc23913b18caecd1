"""Scheduling overhead of hpo against the tools users would otherwise pick.

Workloads: N trials that each sleep T seconds, on P = 2 slots; the ideal
makespan is N * T / P. Contenders, interleaved in one run on the same machine:

- hpo, dask engine, default durable store (journal file), on a running
  2-worker LocalCluster (cluster start-up is reported apart);
- Optuna ``study.optimize(n_jobs=2)``, in memory and with a journal file;
- plain Dask ``client.map`` on the same cluster;
- Ray Tune, when installed (``pip install 'hpo[bench]'``).

Run: ``python bench/overhead.py [--repeats R] [--contenders hpo,ray]
[--workloads 200x0.1]``. The figures are medians over R rounds; contenders are
chosen by name prefix. The last line is ``overhead_pct=<hpo's overhead at the
first workload>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import hpo  # noqa: E402

SLOTS = 2
WORKLOADS = [(200, 0.1), (1000, 0.02)]


def sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def run_hpo(n: int, t: float, address: str, tmp: Path) -> None:
    space = {
        "name": f"bench-{n}-{time.monotonic_ns()}", "objective": "hpo.examples.toy:sleep",
        "metric": {"name": "value"}, "search": {"algorithm": "grid", "parallel": SLOTS},
        "fixed": {"sleep_s": t}, "space": {"x": {"type": "int", "low": 0, "high": n - 1}},
    }
    result = hpo.run(space, engine="dask", scheduler=address, runs_dir=tmp, progress=False)
    if result.counts["COMPLETE"] != n:
        raise RuntimeError(f"hpo completed {result.counts}")


def run_optuna(n: int, t: float, tmp: Path, journal: bool) -> None:
    storage = None
    if journal:
        path = str(tmp / f"optuna-{time.monotonic_ns()}.log")
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_int("x", 0, n - 1)
        time.sleep(t)
        return x

    study = optuna.create_study(storage=storage)
    study.optimize(objective, n_trials=n, n_jobs=SLOTS)


def run_dask_map(n: int, t: float, client: Client) -> None:
    futures = client.map(sleep_task, [t] * n, pure=False)
    client.gather(futures)


def ray_runner() -> Callable[[int, float, Path], None] | None:
    try:
        import ray
        from ray import tune
    except ImportError:
        return None

    def run_ray(n: int, t: float, tmp: Path) -> None:
        if not ray.is_initialized():
            ray.init(num_cpus=SLOTS, include_dashboard=False, logging_level=logging.ERROR)

        def trainable(config):
            time.sleep(t)
            return {"value": config["x"]}

        tune.Tuner(trainable, param_space={"x": tune.grid_search(list(range(n)))},
                   tune_config=tune.TuneConfig(max_concurrent_trials=SLOTS),
                   run_config=tune.RunConfig(storage_path=str(tmp / "ray"), verbose=0)).fit()

    return run_ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--contenders", help="comma-separated name prefixes (default: all)")
    parser.add_argument("--workloads", help="comma-separated NxT, e.g. 200x0.1 (default: both)")
    args = parser.parse_args()
    workloads = WORKLOADS if not args.workloads else [
        (int(n), float(t)) for n, t in (w.split("x") for w in args.workloads.split(","))]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.ERROR)

    started = time.perf_counter()
    cluster = LocalCluster(n_workers=SLOTS, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=":0", resources={"CPU": 1})
    client = Client(cluster)
    print(f"dask LocalCluster start-up: {time.perf_counter() - started:.2f} s (not in the figures)")

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        contenders: dict[str, Callable[[int, float], None]] = {
            "hpo (dask, journal)": lambda n, t: run_hpo(n, t, cluster.scheduler_address, tmp),
            "optuna n_jobs=2 (memory)": lambda n, t: run_optuna(n, t, tmp, journal=False),
            "optuna n_jobs=2 (journal)": lambda n, t: run_optuna(n, t, tmp, journal=True),
            "dask client.map": lambda n, t: run_dask_map(n, t, client),
        }
        ray = ray_runner()
        if ray:
            contenders["ray tune (defaults)"] = lambda n, t: ray(n, t, tmp)
        else:
            print("ray tune: not installed (pip install 'hpo[bench]'), left out")
        if args.contenders:
            prefixes = args.contenders.split(",")
            contenders = {k: v for k, v in contenders.items() if k.startswith(tuple(prefixes))}

        overheads: dict[tuple[int, float], float] = {}
        for n, t in workloads:
            ideal = n * t / SLOTS
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(args.repeats):
                for name, contender in contenders.items():  # interleaved
                    begin = time.perf_counter()
                    contender(n, t)
                    times[name].append(time.perf_counter() - begin)
                    print(f"  {n} x {t}s {name}: {times[name][-1]:.2f} s", file=sys.stderr)
            print(f"\n{n} trials x {t} s on {SLOTS} slots, ideal {ideal:.2f} s "
                  f"(median of {args.repeats}):")
            print(f"  {'contender':28s} {'makespan_s':>10s} {'overhead_%':>10s}")
            for name, values in times.items():
                makespan = statistics.median(values)
                pct = 100 * (makespan - ideal) / ideal
                print(f"  {name:28s} {makespan:10.2f} {pct:10.1f}")
                if name.startswith("hpo"):
                    overheads[(n, t)] = pct
    client.close()
    cluster.close()
    if workloads[0] in overheads:
        print(f"overhead_pct={overheads[workloads[0]]:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
