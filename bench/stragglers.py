"""Stragglers: hpo's asynchronous refill against batch-synchronous rounds.

eager-SGD's lesson (do not let the slowest hold the rest back), measured on
trial scheduling. N trials with log-normal durations (mean ``--mean-s``,
coefficient of variation ``--cv``, 0.57 as the paper's LSTM batches:
sigma^2 = ln(1 + CV^2)) and a random quality each, on P slots of one warm
P-worker Dask cluster, the same durations, qualities and order for both:

- ``async``: ``hpo.run`` (dask engine, grid over the trial index, parallel P):
  a slot that frees starts the next trial at once;
- ``sync``: the same trials in rounds of P with Dask ``client.map``, each
  round waiting for its slowest trial before the next is proposed (what a
  batch-synchronous search does).

Utilisation is busy slot-seconds / (P x makespan), both from the trials' own
start and end times (first start to last end). Time to target is the time
from the first start until a trial whose quality reaches the target (the
``--hits`` best qualities do) finishes.

Run: ``python bench/stragglers.py [--repeats R] [--trials N] [--slots P]``;
each repetition draws new durations (seed + repetition); figures are medians
over R. Last lines: ``async_utilisation=``, ``sync_utilisation=``,
``time_to_target_ratio=<sync / async>``.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _paths import share_paths

# Dask workers import this module by name to run the trials.
share_paths()

import numpy as np  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402

import hpo  # noqa: E402

Span = tuple[float, float]  # a trial's (start, end), epoch seconds


def work(config: dict, trial: object = None) -> dict[str, float]:
    """One trial: sleep its drawn duration, return its drawn quality."""
    i = int(config["i"])
    time.sleep(float(config["durations"][i]))
    return {"value": float(config["values"][i])}


def timed_work(i: int, durations: list[float], values: list[float]) -> tuple[float, float, float]:
    started = time.time()
    value = work({"i": i, "durations": durations, "values": values})["value"]
    return started, time.time(), value


def draw(n: int, mean_s: float, cv: float, seed: int) -> tuple[list[float], list[float]]:
    """Log-normal durations of the given mean and CV, and uniform qualities."""
    sigma = math.sqrt(math.log(1 + cv**2))
    mu = math.log(mean_s) - sigma**2 / 2  # E[X] = exp(mu + sigma^2 / 2)
    rng = np.random.default_rng(seed)
    return rng.lognormal(mu, sigma, n).tolist(), rng.uniform(0, 1, n).tolist()


def run_async(durations: list[float], values: list[float], slots: int, address: str,
              tmp: Path) -> list[tuple[Span, float]]:
    n = len(durations)
    space = {
        "name": f"stragglers-{time.monotonic_ns()}", "objective": "stragglers:work",
        "metric": {"name": "value"}, "search": {"algorithm": "grid", "parallel": slots},
        "fixed": {"durations": durations, "values": values},
        "space": {"i": {"type": "int", "low": 0, "high": n - 1}},
    }
    result = hpo.run(space, engine="dask", scheduler=address, runs_dir=tmp, progress=False)
    if result.counts["COMPLETE"] != n:
        raise RuntimeError(f"hpo completed {result.counts}")
    return [((t.started_at, t.ended_at), t.value) for t in result.trials]


def run_sync(durations: list[float], values: list[float], slots: int,
             client: Client) -> list[tuple[Span, float]]:
    done = []
    for first in range(0, len(durations), slots):
        futures = client.map(timed_work, range(first, min(first + slots, len(durations))),
                             durations=durations, values=values, pure=False)
        wait(futures)  # the round ends with its slowest trial
        done += [((start, end), value) for start, end, value in client.gather(futures)]
    return done


def measure(trials: list[tuple[Span, float]], slots: int, target: float) -> tuple[float, float]:
    """(utilisation, time to target) of one run."""
    begin = min(start for (start, _), _ in trials)
    makespan = max(end for (_, end), _ in trials) - begin
    busy = sum(end - start for (start, end), _ in trials)
    hit = min(end for (_, end), value in trials if value >= target)
    return busy / (slots * makespan), hit - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions (median)")
    parser.add_argument("--trials", type=int, default=48, help="trials per run")
    parser.add_argument("--slots", type=int, default=4, help="trials at once (Dask workers)")
    parser.add_argument("--mean-s", type=float, default=0.5, help="mean trial duration, s")
    parser.add_argument("--cv", type=float, default=0.57, help="coefficient of variation of durations")
    parser.add_argument("--hits", type=int, default=3, help="trials that reach the target")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first repetition")
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.ERROR)

    started = time.perf_counter()
    cluster = LocalCluster(n_workers=args.slots, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=":0", resources={"CPU": 1})
    client = Client(cluster)
    print(f"dask LocalCluster start-up: {time.perf_counter() - started:.2f} s (not in the figures)")
    figures: dict[str, dict[str, list[float]]] = {
        name: {"utilisation": [], "ttt": []} for name in ("async", "sync")}
    with tempfile.TemporaryDirectory() as tmp_name:
        for rep in range(args.repeats):
            durations, values = draw(args.trials, args.mean_s, args.cv, args.seed + rep)
            target = sorted(values)[-args.hits]
            for name in ("async", "sync"):  # interleaved, same draws
                if name == "async":
                    trials = run_async(durations, values, args.slots, cluster.scheduler_address,
                                       Path(tmp_name))
                else:
                    trials = run_sync(durations, values, args.slots, client)
                utilisation, ttt = measure(trials, args.slots, target)
                figures[name]["utilisation"].append(utilisation)
                figures[name]["ttt"].append(ttt)
                print(f"  repetition {rep + 1}/{args.repeats} {name}: utilisation "
                      f"{utilisation:.3f}, time to target {ttt:.2f} s", file=sys.stderr, flush=True)
    client.close()
    cluster.close()

    ideal = args.trials * args.mean_s / args.slots
    print(f"\n{args.trials} trials, log-normal durations mean {args.mean_s} s CV {args.cv}, "
          f"{args.slots} slots (ideal makespan ~{ideal:.1f} s); target met by {args.hits} "
          f"trials; medians of {args.repeats}:")
    print(f"  {'scheduling':34s} {'utilisation':>11s} {'time_to_target_s':>16s}")
    medians = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    labels = {"async": "asynchronous refill (hpo.run)", "sync": "synchronous rounds (client.map)"}
    for name, label in labels.items():
        print(f"  {label:34s} {medians[name]['utilisation']:11.3f} {medians[name]['ttt']:16.2f}")
    print(f"async_utilisation={medians['async']['utilisation']:.3f}")
    print(f"sync_utilisation={medians['sync']['utilisation']:.3f}")
    print(f"time_to_target_ratio={medians['sync']['ttt'] / medians['async']['ttt']:.2f}")


if __name__ == "__main__":
    main()
