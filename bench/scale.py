"""A simulated 1,000-worker study: does hpo keep a thousand slots busy?

W workers are threads of a few Dask worker processes (``--per-process`` each,
started as separate processes so that the master's CPU
time is its own). Every trial sleeps and reports once a second, as real
trials do (``trial.report(step, value=...)`` then ``trial.should_stop()``, via
``hpo.examples.toy.curve``), for ``--steps`` seconds (give or take
``--spread``); the study has ``--trials`` trials (3 per worker by default)
and is driven by ``hpo.run(parallel=W)`` against the real durable store (the
journal file). Each trial logs its start, end and the latency of every
report and should_stop call (bench/_ticking.py). Contenders, interleaved:

- ``hpo``: ``hpo.run``, dask engine, journal store;
- ``optuna``: what a user would otherwise write, ``study.optimize(n_jobs=W)``
  (W threads in this process) on a journal file, ``trial.report`` then
  ``trial.should_prune()`` (NopPruner), the same trials;
- ``dask``: plain ``client.map`` of the same trials with no store, on the
  same workers: the ceiling this machine allows.

The scheduler runs with ``worker-saturation`` 1.0 (``--saturation``): with
Dask's default 1.1 a worker is sent 10% more tasks than it has threads, and
those wait behind whole trials while other workers run dry at the end (both
Dask rows lose about a quarter of their utilisation at 200 workers). The
workers run without Dask's statistical profiler, which samples every thread
every 10 ms: with 250 threads a process it took half of the workers' CPU.

Figures: utilisation = busy worker-seconds in trials / (W x makespan), the
makespan being the whole call; work = the same with the trials' nominal
length (steps x step_s): the difference is time trials spent blocked in
report and should_stop; fill = seconds until W trials had started;
trial length as observed (reports that block stretch it); gap = a worker
thread's idle seconds between one trial and its next (median); report latency
(median, p99, max) and should_stop p99; reports/s over the makespan; CPU
seconds of the master (this process: for hpo the master alone, for Optuna
everything, trials included), of the Dask scheduler and of the workers.

``--workers`` takes several sizes (``250,1000,2000,4000``): each gets a
cluster of its own, ``--per-process`` threads a worker process (250), and a
table; a summary follows with hpo's utilisation beside plain Dask's and the
master's CPU per report (the master, its relay included, in this process).
Every trial must complete: a run that lost one says which and how it ended.

Run: ``python bench/scale.py [--workers 1000] [--per-process 250] [--steps 15]
[--spread 0] [--trials N] [--repeats R] [--contenders hpo,optuna,dask]``.
Figures are medians over R rounds. The last line is
``utilisation_pct=<hpo's utilisation at 1,000 workers, else the first size>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _paths import share_paths

# The Dask workers import the trial (bench/_ticking.py) by name.
share_paths()

import numpy as np  # noqa: E402
import optuna  # noqa: E402
import psutil  # noqa: E402
from distributed import Client  # noqa: E402

import hpo  # noqa: E402
from _ticking import NoStore, OptunaTrial, work  # noqa: E402


@dataclass(frozen=True)
class Setup:
    workers: int
    processes: int
    steps: int
    spread: int
    step_s: float
    trials: int
    saturation: float

    def fixed(self, log_dir: Path) -> dict:
        """The configuration every trial shares (``i`` tells them apart)."""
        return {"steps": self.steps, "spread": self.spread, "step_s": self.step_s,
                "log_dir": str(log_dir)}


class Cluster:
    """A Dask scheduler and worker processes, started apart from this process."""

    def __init__(self, setup: Setup, tmp: Path) -> None:
        python = sys.executable
        file = tmp / "scheduler.json"
        # Dask's default saturation (1.1) sends a worker of 250 threads 275 tasks:
        # 25 wait there behind whole trials while other workers idle at the end.
        saturation = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": str(setup.saturation)}
        self.scheduler = subprocess.Popen(
            [python, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(file)], stderr=subprocess.DEVNULL,
            env={**os.environ, **saturation})
        # Dask's statistical profiler walks every thread's stack every 10 ms: with
        # 250 threads a worker it took half of the workers' CPU.
        quiet = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
        shares = np.array_split(np.arange(setup.workers), setup.processes)
        self.workers = [subprocess.Popen(
            [python, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(file),
             "--nthreads", str(len(share)), "--no-nanny", "--no-dashboard", "--memory-limit", "0",
             "--name", f"w{k}"], stderr=subprocess.DEVNULL, env={**os.environ, **quiet})
            for k, share in enumerate(shares)]
        while not file.exists():
            time.sleep(0.1)
        self.client = Client(scheduler_file=str(file))
        self.client.wait_for_workers(setup.processes, timeout=300)
        self.address = self.client.scheduler.address

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the scheduler and of all workers."""
        def cpu(p: subprocess.Popen) -> float:
            times = psutil.Process(p.pid).cpu_times()
            return times.user + times.system
        return cpu(self.scheduler), sum(cpu(w) for w in self.workers)

    def close(self) -> None:
        self.client.close()
        for process in [*self.workers, self.scheduler]:
            process.terminate()
        for process in [*self.workers, self.scheduler]:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # threads still in a trial keep a worker alive
                process.kill()
                process.wait()


# -- contenders -------------------------------------------------------------------


def run_hpo(setup: Setup, cluster: Cluster, log_dir: Path, tmp: Path) -> int:
    space = {
        "name": f"scale-{time.monotonic_ns()}", "objective": "_ticking:work",
        "metric": {"name": "value"},
        "search": {"algorithm": "grid", "parallel": setup.workers},
        "fixed": setup.fixed(log_dir),
        "space": {"i": {"type": "int", "low": 0, "high": setup.trials - 1}},
    }
    result = hpo.run(space, engine="dask", scheduler=cluster.address, runs_dir=tmp, progress=False)
    others = [t for t in result.trials if t.state is not hpo.TrialStatus.COMPLETE]
    for trial in others:  # a benchmark may not lose a trial: say what became of it
        print(f"    trial {trial.number} ended {trial.state.value}: {trial.error or trial.events}",
              file=sys.stderr, flush=True)
    return result.counts["COMPLETE"]


def run_optuna(setup: Setup, log_dir: Path, tmp: Path) -> int:
    path = str(tmp / f"optuna-{time.monotonic_ns()}.log")
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    fixed = setup.fixed(log_dir)

    def objective(trial: optuna.Trial) -> float:
        return work({**fixed, "i": trial.number}, OptunaTrial(trial))["value"]

    study = optuna.create_study(storage=storage, direction="maximize",
                                sampler=optuna.samplers.RandomSampler(), pruner=optuna.pruners.NopPruner())
    study.optimize(objective, n_trials=setup.trials, n_jobs=setup.workers)
    return len(study.get_trials(states=[optuna.trial.TrialState.COMPLETE]))


def plain_trial(config: dict) -> dict:
    return work(config, NoStore())


def run_dask(setup: Setup, cluster: Cluster, log_dir: Path) -> int:
    fixed = setup.fixed(log_dir)
    futures = cluster.client.map(plain_trial, [{**fixed, "i": i} for i in range(setup.trials)],
                                 pure=False)
    return len(cluster.client.gather(futures))


# -- measuring --------------------------------------------------------------------


@dataclass
class Run:
    """One contender's run: its wall time, trial logs and CPU seconds."""

    wall: float
    complete: int
    trials: list[dict]
    master_cpu: float
    scheduler_cpu: float
    workers_cpu: float


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def read_logs(log_dir: Path) -> list[dict]:
    """Every trial's log line; ``slot`` names the worker thread (process and thread) it ran on."""
    trials = []
    for f in log_dir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            trial = json.loads(line)
            trials.append({**trial, "slot": f"{f.stem}-{trial['thread']}"})
    return trials


def refill_gaps(trials: list[dict]) -> list[float]:
    """Idle seconds of each worker thread between one trial's end and its next trial's start."""
    by_slot: dict[str, list[dict]] = {}
    for t in trials:
        by_slot.setdefault(t["slot"], []).append(t)
    gaps = []
    for runs in by_slot.values():
        runs.sort(key=lambda t: t["start"])
        gaps += [b["start"] - a["end"] for a, b in zip(runs, runs[1:])]
    return gaps


def status(label: str, log_dir: Path, total: int, done: threading.Event) -> None:
    """A line on stderr every 10 s while a contender runs."""
    begin = time.monotonic()
    while not done.wait(10):
        finished = sum(f.read_text().count("\n") for f in log_dir.glob("*.jsonl"))
        print(f"    {label}: {time.monotonic() - begin:.0f} s, {finished}/{total} trials done",
              file=sys.stderr, flush=True)


def measure(label: str, contender: Callable[[Path], int], cluster: Cluster, total: int,
            tmp: Path) -> Run:
    log_dir = Path(tempfile.mkdtemp(dir=tmp, prefix="log-"))
    done = threading.Event()
    watcher = threading.Thread(target=status, args=(label, log_dir, total, done), daemon=True)
    watcher.start()
    scheduler0, workers0 = cluster.cpu_s()
    cpu0, begin = own_cpu_s(), time.time()
    try:
        complete = contender(log_dir)
    finally:
        done.set()
    wall, cpu = time.time() - begin, own_cpu_s() - cpu0
    scheduler1, workers1 = cluster.cpu_s()
    trials = read_logs(log_dir)
    for t in trials:
        t["start"] -= begin
        t["end"] -= begin
    return Run(wall, complete, trials, cpu, scheduler1 - scheduler0, workers1 - workers0)


def figures(run: Run, workers: int) -> dict[str, float]:
    """The table's figures of one run."""
    reports = np.array([s for t in run.trials for s in t["report_s"]] or [np.nan]) * 1e3
    stops = np.array([s for t in run.trials for s in t["stop_s"]] or [np.nan]) * 1e3
    starts = sorted(t["start"] for t in run.trials)
    busy = sum(t["end"] - t["start"] for t in run.trials)
    work = sum(t["steps"] * t["step_s"] for t in run.trials)
    gaps = refill_gaps(run.trials) or [float("nan")]
    return {
        "complete": run.complete, "makespan_s": run.wall,
        "util_pct": 100 * busy / (workers * run.wall),
        "work_pct": 100 * work / (workers * run.wall),
        "fill_s": starts[workers - 1] if len(starts) >= workers else float("nan"),
        "trial_s": busy / max(1, len(run.trials)), "gap_p50_s": float(np.median(gaps)),
        "rep_p50_ms": float(np.median(reports)), "rep_p99_ms": float(np.percentile(reports, 99)),
        "rep_max_ms": float(np.max(reports)), "stop_p99_ms": float(np.percentile(stops, 99)),
        "reports_per_s": sum(len(t["report_s"]) for t in run.trials) / run.wall,
        "master_cpu_s": run.master_cpu, "sched_cpu_s": run.scheduler_cpu,
        "workers_cpu_s": run.workers_cpu,
        "master_ms_per_report": 1000 * run.master_cpu / max(1, sum(len(t["report_s"]) for t in run.trials)),
    }


COLUMNS = [("complete", "{:8.0f}"), ("makespan_s", "{:10.1f}"), ("util_pct", "{:8.1f}"), ("work_pct", "{:8.1f}"),
           ("fill_s", "{:6.1f}"), ("trial_s", "{:7.2f}"), ("gap_p50_s", "{:9.2f}"), ("rep_p50_ms", "{:10.1f}"),
           ("rep_p99_ms", "{:10.1f}"), ("rep_max_ms", "{:10.1f}"), ("stop_p99_ms", "{:11.1f}"),
           ("reports_per_s", "{:13.0f}"), ("master_cpu_s", "{:12.1f}"),
           ("sched_cpu_s", "{:11.1f}"), ("workers_cpu_s", "{:13.1f}")]


def print_table(setup: Setup, medians: dict[str, dict[str, float]], repeats: int) -> None:
    print(f"\n{setup.trials} trials of {setup.steps} +- {setup.spread} reports, one every "
          f"{setup.step_s:g} s, on {setup.workers} workers ({setup.processes} Dask worker "
          f"processes of ~{setup.workers // setup.processes} threads); median of {repeats}:")
    head = "  ".join(f"{name:>{len(fmt.format(0))}s}" for name, fmt in COLUMNS)
    print(f"  {'contender':26s} {head}")
    for name, row in medians.items():
        cells = "  ".join(fmt.format(row[key]) for key, fmt in COLUMNS)
        print(f"  {name:26s} {cells}")


def measure_size(args: argparse.Namespace, workers: int) -> dict[str, dict[str, float]]:
    """Every contender on a cluster of ``workers`` slots; their median rows."""
    processes = max(1, -(-workers // args.per_process))
    setup = Setup(workers, processes, args.steps, args.spread, args.step_s,
                  args.trials or 3 * workers, args.saturation)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        cluster = Cluster(setup, tmp)
        print(f"{workers} workers: dask scheduler and {processes} worker processes start-up: "
              f"{time.perf_counter() - started:.1f} s (not in the figures)", file=sys.stderr, flush=True)
        contenders: dict[str, Callable[[Path], int]] = {
            "hpo (dask, journal)": lambda logs: run_hpo(setup, cluster, logs, tmp),
            f"optuna n_jobs={setup.workers} (journal)": lambda logs: run_optuna(setup, logs, tmp),
            "dask client.map (no store)": lambda logs: run_dask(setup, cluster, logs),
        }
        chosen = args.contenders.split(",")
        contenders = {k: v for k, v in contenders.items() if k.startswith(tuple(chosen))}
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        try:
            for r in range(args.repeats):
                for name, contender in contenders.items():  # interleaved
                    print(f"  {name}: round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
                    run = measure(name, contender, cluster, setup.trials, tmp)
                    rows[name].append(figures(run, setup.workers))
                    print(f"  {name}: {run.wall:.1f} s, utilisation "
                          f"{rows[name][-1]['util_pct']:.1f}%", file=sys.stderr, flush=True)
        finally:
            cluster.close()
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
               for name, runs in rows.items()}
    print_table(setup, medians, args.repeats)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1000", help="slots (threads in all); several: 250,1000")
    parser.add_argument("--per-process", type=int, default=250, help="threads a Dask worker process")
    parser.add_argument("--steps", type=int, default=15, help="reports (seconds) per trial")
    parser.add_argument("--spread", type=int, default=0, help="trials last steps +- spread")
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds between reports")
    parser.add_argument("--trials", type=int, help="trials in the study (default: 3 per worker)")
    parser.add_argument("--saturation", type=float, default=1.0,
                        help="Dask's scheduler worker-saturation (its default: 1.1)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds (median)")
    parser.add_argument("--contenders", default="hpo,optuna,dask", help="comma-separated, in order")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    sizes = [int(n) for n in args.workers.split(",")]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    by_size = {workers: measure_size(args, workers) for workers in sizes}
    print("\nsummary: utilisation, and the master's CPU per report")
    print(f"  {'workers':>7s}  {'hpo util %':>10s}  {'dask util %':>11s}  {'points behind':>13s}  "
          f"{'master ms/report':>16s}  {'complete':>8s}")
    for workers, medians in by_size.items():
        mine = next((row for name, row in medians.items() if name.startswith("hpo")), None)
        dask = next((row for name, row in medians.items() if name.startswith("dask")), None)
        if mine is None:
            continue
        behind = f"{dask['util_pct'] - mine['util_pct']:13.1f}" if dask else f"{'-':>13s}"
        print(f"  {workers:7d}  {mine['util_pct']:10.1f}  "
              f"{dask['util_pct'] if dask else float('nan'):11.1f}  {behind}  "
              f"{mine['master_ms_per_report']:16.2f}  {mine['complete']:8.0f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    headline = by_size.get(1000, next(iter(by_size.values())))
    hpo_row = next((row for name, row in headline.items() if name.startswith("hpo")), None)
    if hpo_row:
        print(f"utilisation_pct={hpo_row['util_pct']:.1f}")


if __name__ == "__main__":
    main()
