"""Scheduling overhead of hpo against the tools users would otherwise pick.

Sleep workloads ``NxT`` (or ``NxT@P``): N trials that each sleep T seconds on
P slots (default 2); the ideal makespan is N * T / P. Contenders, interleaved
in one run on the same machine:

- hpo, dask engine, default durable store (journal file), on a running
  P-worker LocalCluster (one thread each; cluster start-up is reported apart);
- Optuna ``study.optimize(n_jobs=P)``, in memory and with a journal file;
- plain Dask ``client.map`` on the same cluster, and a plain Dask loop that
  submits the next task as each one ends (``as_completed``), as an adaptive
  search written by hand on Dask must;
- Ray Tune, when installed (``pip install 'hpo[bench]'``).

The default sleep workloads are 200 x 0.1 s and 1000 x 0.02 s on 2 slots, and
``--trials16`` (2,000) x 1 s on 16 slots, after Ray Tune's published
bookkeeping test (10,000 trials of 1 s on 16 CPUs, 14.4% over the ideal): its
16 workers only sleep, so 2 cores carry them.

The ``mlp`` workload is real work: a 27-configuration MLPClassifier grid on
scikit-learn's digits, 3-fold cross-validation each (bench/_digits_mlp.py),
on 2 slots: the whole ``hpo.run`` call against joblib ``Parallel(n_jobs=2)``
over the same configurations and ``GridSearchCV(n_jobs=2, refit=False)``. It
reports the time (median and range) and the best configuration each found,
which must agree. Each contender first runs the first two configurations
untimed, so that imports and process pools are warm for all of them.

The ``torch`` workload is real PyTorch training: a 12-configuration grid of
the digits CNN (``hpo.examples.torch_digits:train``, 5 epochs each, one
thread per trial) on 2 slots: the whole ``hpo.run`` call against a plain
``for`` loop (one process, what a notebook does) and joblib
``Parallel(n_jobs=2)``, each calling the same function with a detached
``hpo.Trial``. Training on a CPU is deterministic, so all find the same best.

The sleep workloads' tables also give the CPU milliseconds each trial cost
this process (hpo's master with the cluster's scheduler, or Optuna's threads)
and the cluster's worker processes: on 2 cores, what the master and the
workers spend beside the sleeps is what the slots wait for.

Run: ``python bench/overhead.py [--repeats R] [--contenders hpo,ray]
[--workloads 200x0.1,2000x1@16,mlp,torch] [--trials16 N]``. The figures are medians
over R rounds; contenders are chosen by name prefix (hpo, optuna, dask, ray,
joblib, gridsearchcv, plain). The last lines are ``overhead_pct=<hpo's overhead at the
first sleep workload>`` (200 x 0.1 s by default) and, with the torch workload,
``torch_overhead_pct=<hpo's time over the plain loop's, in %>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _paths import share_paths

# Dask workers import the digits objective (bench/_digits_mlp.py) by name.
share_paths()

import optuna  # noqa: E402
from distributed import Client, LocalCluster, as_completed  # noqa: E402

import hpo  # noqa: E402

MLP = "mlp"
MLP_SLOTS = 2
TORCH = "torch"
TORCH_GRID = {"optimizer": ["sgd", "adam"], "learning_rate": [0.003, 0.01, 0.03],
              "channels": [8, 16]}
TORCH_FIXED = {"max_epochs": 5, "batch_size": 64}


@dataclass(frozen=True)
class Sleep:
    """N trials of T seconds on P slots."""

    n: int
    t: float
    slots: int = 2

    @classmethod
    def parse(cls, text: str) -> "Sleep":
        trials, _, slots = text.partition("@")
        n, t = trials.split("x")
        return cls(int(n), float(t), int(slots or 2))

    @property
    def ideal(self) -> float:
        return self.n * self.t / self.slots

    def __str__(self) -> str:
        return f"{self.n} x {self.t:g} s on {self.slots} slots"


Contenders = dict[str, Callable[[], object]]


def sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


# -- sleep workloads ------------------------------------------------------------


def run_hpo(w: Sleep, address: str, tmp: Path) -> None:
    space = {
        "name": f"bench-{w.n}-{time.monotonic_ns()}", "objective": "hpo.examples.toy:sleep",
        "metric": {"name": "value"}, "search": {"algorithm": "grid", "parallel": w.slots},
        "fixed": {"sleep_s": w.t}, "space": {"x": {"type": "int", "low": 0, "high": w.n - 1}},
    }
    result = hpo.run(space, engine="dask", scheduler=address, runs_dir=tmp, progress=False)
    if result.counts["COMPLETE"] != w.n:
        raise RuntimeError(f"hpo completed {result.counts}")


def run_optuna(w: Sleep, tmp: Path, journal: bool) -> None:
    storage = None
    if journal:
        path = str(tmp / f"optuna-{time.monotonic_ns()}.log")
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_int("x", 0, w.n - 1)
        time.sleep(w.t)
        return x

    study = optuna.create_study(storage=storage)
    study.optimize(objective, n_trials=w.n, n_jobs=w.slots)


def run_dask_map(w: Sleep, client: Client) -> None:
    client.gather(client.map(sleep_task, [w.t] * w.n, pure=False))


def run_dask_loop(w: Sleep, client: Client) -> None:
    """What an adaptive search written by hand on Dask does: the next task is
    submitted as each one ends (its result could choose it), with as many
    in flight as hpo keeps for grid search (one running and one queued per slot)."""
    submitted = min(2 * w.slots, w.n)
    futures = as_completed([client.submit(sleep_task, w.t, pure=False) for _ in range(submitted)])
    for future in futures:
        future.result()
        if submitted < w.n:
            futures.add(client.submit(sleep_task, w.t, pure=False))
            submitted += 1


def ray_runner(num_cpus: int) -> Callable[[Sleep, Path], None] | None:
    try:
        import ray
        from ray import tune
    except ImportError:
        return None

    def run_ray(w: Sleep, tmp: Path) -> None:
        if not ray.is_initialized():
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR)

        def trainable(config):
            time.sleep(w.t)
            return {"value": config["x"]}

        tune.Tuner(trainable, param_space={"x": tune.grid_search(list(range(w.n)))},
                   tune_config=tune.TuneConfig(max_concurrent_trials=w.slots),
                   run_config=tune.RunConfig(storage_path=str(tmp / "ray"), verbose=0)).fit()

    return run_ray


def sleep_contenders(w: Sleep, cluster: LocalCluster, client: Client, tmp: Path,
                     ray: Callable[[Sleep, Path], None] | None) -> Contenders:
    p = w.slots
    contenders: Contenders = {
        "hpo (dask, journal)": lambda: run_hpo(w, cluster.scheduler_address, tmp),
        f"optuna n_jobs={p} (memory)": lambda: run_optuna(w, tmp, journal=False),
        f"optuna n_jobs={p} (journal)": lambda: run_optuna(w, tmp, journal=True),
        "dask client.map": lambda: run_dask_map(w, client),
        "dask as_completed loop": lambda: run_dask_loop(w, client),
    }
    if ray:
        contenders["ray tune (defaults)"] = lambda: ray(w, tmp)
    return contenders


def report_sleep(w: Sleep, times: dict[str, list[float]], repeats: int,
                 cpu: dict[str, list[tuple[float, float]]]) -> float | None:
    """Print the table of one sleep workload; hpo's overhead in %. The CPU
    columns are per trial: this process's, and the Dask workers' (shown for
    the contenders whose trials run on them)."""
    print(f"\n{w}, ideal {w.ideal:.2f} s (median of {repeats}; CPU ms per trial):")
    print(f"  {'contender':28s} {'makespan_s':>10s} {'overhead_%':>10s} {'cpu_here':>9s} {'cpu_workers':>11s}")
    hpo_pct = None
    for name, values in times.items():
        makespan = statistics.median(values)
        pct = 100 * (makespan - w.ideal) / w.ideal
        here = statistics.median(1000 * c[0] / w.n for c in cpu[name]) if name in cpu else None
        workers = (statistics.median(1000 * c[1] / w.n for c in cpu[name])
                   if name in cpu and name.startswith(("hpo", "dask")) else None)
        print(f"  {name:28s} {makespan:10.2f} {pct:10.1f} {_ms(here):>9s} {_ms(workers):>11s}")
        if name.startswith("hpo"):
            hpo_pct = pct
    return hpo_pct


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# -- the digits MLP grid ---------------------------------------------------------

Best = tuple[float, dict]  # (mean CV accuracy, configuration)


def mlp_hpo(address: str, tmp: Path, configs: list[dict]) -> Best:
    import _digits_mlp

    space = {
        "name": f"bench-mlp-{time.monotonic_ns()}", "objective": "_digits_mlp:cv_accuracy",
        "metric": {"name": "accuracy", "direction": "maximize"},
        "search": {"algorithm": "grid", "parallel": MLP_SLOTS},
        "space": {k: sorted({c[k] for c in configs}) for k in _digits_mlp.GRID},
    }
    result = hpo.run(space, engine="dask", scheduler=address, runs_dir=tmp, progress=False)
    if result.counts["COMPLETE"] != len(configs):
        raise RuntimeError(f"hpo completed {result.counts}")
    return result.best.value, dict(result.best.params)


def mlp_joblib(configs: list[dict]) -> Best:
    from joblib import Parallel, delayed

    from _digits_mlp import cv_accuracy

    scores = Parallel(n_jobs=MLP_SLOTS)(delayed(cv_accuracy)(c) for c in configs)
    return max((s["accuracy"], c) for s, c in zip(scores, configs))


def mlp_gridsearch(configs: list[dict]) -> Best:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV

    import _digits_mlp

    grid = {"hidden_layer_sizes": sorted({(c["units"],) for c in configs}),
            **{k: sorted({c[k] for c in configs}) for k in ("alpha", "learning_rate_init")}}
    search = GridSearchCV(_digits_mlp.model(64, 1e-3, 1e-3), grid, cv=_digits_mlp.FOLDS,
                          n_jobs=MLP_SLOTS, refit=False)  # refit: one fit more than the others do
    search.fit(*load_digits(return_X_y=True))
    params = dict(search.best_params_)
    params["units"] = params.pop("hidden_layer_sizes")[0]
    return float(search.best_score_), params


def mlp_contenders(address: str, tmp: Path, configs: list[dict]) -> dict[str, Callable[[], Best]]:
    return {
        "hpo (dask, journal)": lambda: mlp_hpo(address, tmp, configs),
        f"joblib Parallel(n_jobs={MLP_SLOTS})": lambda: mlp_joblib(configs),
        f"GridSearchCV(n_jobs={MLP_SLOTS})": lambda: mlp_gridsearch(configs),
    }


def report_mlp(times: dict[str, list[float]], bests: dict[str, Best], repeats: int) -> None:
    print_real_workload(f"{MLP}: 27 MLPClassifier configurations x 3-fold CV on digits, "
                        f"{MLP_SLOTS} slots (median of {repeats}):", times, bests,
                        lambda config: ", ".join(f"{k}={config[k]:g}" for k in sorted(config)))
    agree = len({(round(s, 9), tuple(sorted(c.items()))) for s, c in bests.values()}) == 1
    print(f"  same best configuration and score: {'yes' if agree else 'NO'}")


def print_real_workload(title: str, times: dict[str, list[float]], bests: dict[str, Best],
                        shown: Callable[[dict], str]) -> None:
    """One row a contender: median time, range, best score and configuration."""
    print(f"\n{title}")
    print(f"  {'contender':28s} {'time_s':>7s} {'[min-max]':>15s} {'best_acc':>9s}  best configuration")
    for name, values in times.items():
        score, config = bests[name]
        spread = f"[{min(values):.1f}-{max(values):.1f}]"
        print(f"  {name:28s} {statistics.median(values):7.2f} {spread:>15s} {score:9.5f}  "
              f"{shown(config)}")


# -- the PyTorch CNN grid ------------------------------------------------------------


def torch_configurations() -> list[dict]:
    import itertools

    return [{**TORCH_FIXED, **dict(zip(TORCH_GRID, values))}
            for values in itertools.product(*TORCH_GRID.values())]


def torch_one(config: dict) -> Best:
    """One configuration as a user without hpo runs it: a detached trial."""
    from hpo.examples.torch_digits import train

    return train(config, hpo.Trial(0, config))["val_accuracy"], config


def torch_hpo(address: str, tmp: Path, configs: list[dict]) -> Best:
    space = {
        "name": f"bench-torch-{time.monotonic_ns()}", "objective": "hpo.examples.torch_digits:train",
        "metric": {"name": "val_accuracy", "direction": "maximize"},
        "search": {"algorithm": "grid", "parallel": MLP_SLOTS}, "fixed": TORCH_FIXED,
        "space": {k: sorted({c[k] for c in configs}) for k in TORCH_GRID},
    }
    result = hpo.run(space, engine="dask", scheduler=address, runs_dir=tmp, progress=False)
    if result.counts["COMPLETE"] != len(configs):
        raise RuntimeError(f"hpo completed {result.counts}")
    return result.best.value, {**TORCH_FIXED, **result.best.params}


def torch_contenders(address: str, tmp: Path, configs: list[dict]) -> dict[str, Callable[[], Best]]:
    from joblib import Parallel, delayed

    def best(results: list[Best]) -> Best:  # the first of equals, as hpo's leaderboard ranks
        return max(results, key=lambda r: r[0])

    return {
        "hpo (dask, journal)": lambda: torch_hpo(address, tmp, configs),
        "plain for loop (1 process)": lambda: best([torch_one(c) for c in configs]),
        f"joblib Parallel(n_jobs={MLP_SLOTS})": lambda: best(
            Parallel(n_jobs=MLP_SLOTS)(delayed(torch_one)(c) for c in configs)),
    }


def report_torch(times: dict[str, list[float]], bests: dict[str, Best], repeats: int) -> float | None:
    """Print the torch workload's table; hpo's time over the plain loop's, in %
    (None when either was left out)."""
    print_real_workload(f"{TORCH}: {len(torch_configurations())} PyTorch CNN configurations x "
                        f"{TORCH_FIXED['max_epochs']} epochs on digits, {MLP_SLOTS} slots "
                        f"(median of {repeats}):", times, bests,
                        lambda config: ", ".join(f"{k}={config[k]}" for k in sorted(TORCH_GRID)))
    scores = {round(s, 6) for s, _ in bests.values()}
    print(f"  same best score: {'yes' if len(scores) == 1 else 'NO'}")
    hpo_s, plain_s = (times.get(name) for name in ("hpo (dask, journal)", "plain for loop (1 process)"))
    if not hpo_s or not plain_s:
        return None
    return 100 * (statistics.median(hpo_s) / statistics.median(plain_s) - 1)


# -- the run ---------------------------------------------------------------------


def select(contenders: dict, prefixes: list[str] | None) -> dict:
    if not prefixes:
        return contenders
    return {k: v for k, v in contenders.items() if k.lower().startswith(tuple(prefixes))}


def timed_rounds(label: str, contenders: dict, repeats: int, client: Client | None = None,
                 cpu: dict[str, list[tuple[float, float]]] | None = None) -> tuple[dict[str, list[float]], dict]:
    """Interleave the contenders for ``repeats`` rounds: times and the last
    result of each; with ``client``, each round's CPU seconds (this process's,
    the cluster's workers') go to ``cpu``."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    results: dict = {}
    for r in range(repeats):
        for name, contender in contenders.items():
            print(f"  {label} {name}: round {r + 1}/{repeats}...", end="", file=sys.stderr, flush=True)
            used = cpu_seconds(client) if client is not None else None
            begin = time.perf_counter()
            results[name] = contender()
            times[name].append(time.perf_counter() - begin)
            if used is not None and cpu is not None:
                now = cpu_seconds(client)
                cpu.setdefault(name, []).append((now[0] - used[0], now[1] - used[1]))
            print(f" {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    return times, results


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(client: Client) -> tuple[float, float]:
    """CPU seconds so far of this process (hpo's master and the cluster's
    scheduler, or Optuna's threads) and of the cluster's worker processes."""
    return own_cpu_seconds(), sum(client.run(own_cpu_seconds).values())


class Clusters:
    """One warm LocalCluster per slot count, started when first needed."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[LocalCluster, Client]] = {}

    def get(self, slots: int) -> tuple[LocalCluster, Client]:
        if slots not in self._made:
            started = time.perf_counter()
            cluster = LocalCluster(n_workers=slots, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=":0", resources={"CPU": 1})
            self._made[slots] = cluster, Client(cluster)
            print(f"dask LocalCluster of {slots} workers start-up: "
                  f"{time.perf_counter() - started:.2f} s (not in the figures)")
        return self._made[slots]

    def close(self) -> None:
        for cluster, client in self._made.values():
            client.close()
            cluster.close()


def parse_workloads(text: str | None, trials16: int) -> list[Sleep | str]:
    if not text:
        return [Sleep(200, 0.1), Sleep(1000, 0.02), Sleep(trials16, 1.0, 16), MLP, TORCH]
    return [w if w in (MLP, TORCH) else Sleep.parse(w) for w in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--contenders", help="comma-separated name prefixes (default: all)")
    parser.add_argument("--workloads", help="comma-separated NxT[@P], mlp or torch, e.g. "
                        "200x0.1,2000x1@16,mlp (default: 200x0.1, 1000x0.02, <trials16>x1@16, "
                        "mlp and torch)")
    parser.add_argument("--trials16", type=int, default=2000,
                        help="trials of the default 16-slot workload (Ray Tune's test has 10000)")
    args = parser.parse_args()
    workloads = parse_workloads(args.workloads, args.trials16)
    prefixes = args.contenders.lower().split(",") if args.contenders else None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.ERROR)

    clusters = Clusters()
    slots = [w.slots for w in workloads if isinstance(w, Sleep)]
    ray = ray_runner(max(slots, default=2))
    if not ray:
        print("ray tune: not installed (pip install 'hpo[bench]'), left out")
    overheads: list[float] = []
    torch_pct: float | None = None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for w in workloads:
            if w == MLP:
                import _digits_mlp

                configs = _digits_mlp.configurations()
                cluster, _ = clusters.get(MLP_SLOTS)
                contenders = select(mlp_contenders(cluster.scheduler_address, tmp, configs), prefixes)
                warm = select(mlp_contenders(cluster.scheduler_address, tmp, configs[:2]), prefixes)
                timed_rounds("mlp warm-up (untimed)", warm, 1)
                times, bests = timed_rounds(MLP, contenders, args.repeats)
                if times:
                    report_mlp(times, bests, args.repeats)
                continue
            if w == TORCH:
                configs = torch_configurations()
                cluster, _ = clusters.get(MLP_SLOTS)
                address = cluster.scheduler_address
                warm = select(torch_contenders(address, tmp, configs[:2]), prefixes)
                timed_rounds("torch warm-up (untimed)", warm, 1)
                times, bests = timed_rounds(TORCH, select(torch_contenders(address, tmp, configs),
                                                          prefixes), args.repeats)
                if times:
                    torch_pct = report_torch(times, bests, args.repeats)
                continue
            cluster, client = clusters.get(w.slots)
            contenders = select(sleep_contenders(w, cluster, client, tmp, ray), prefixes)
            cpu: dict[str, list[tuple[float, float]]] = {}
            times, _ = timed_rounds(f"{w.n} x {w.t:g}s@{w.slots}", contenders, args.repeats, client, cpu)
            pct = report_sleep(w, times, args.repeats, cpu) if times else None
            if pct is not None:
                overheads.append(pct)
    clusters.close()
    if overheads:
        print(f"overhead_pct={overheads[0]:.1f}")
    if torch_pct is not None:
        print(f"torch_overhead_pct={torch_pct:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
