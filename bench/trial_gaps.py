"""Where a slot's time goes between two short trials, on a running Dask cluster.

A 2-worker LocalCluster (one thread each, ``CPU=1``, the scheduler in this
process, as in bench/overhead.py) runs N sleeps of T seconds, through
``hpo.run`` (grid search, the journal store) and through plain Dask
``client.map``, interleaved. Each sleep notes its first and last line, and
a worker plugin notes each task's start and end, both on the worker's own
clock (bench/_timed_sleep.py), so on each worker, between two trials:

- last line -> task end: what runs after the objective returns (hpo: the
  end sent to the relay, the heartbeat stopped, the log closed, the cores
  released, the processes the trial left listed), and Dask's hand-back of
  the task's result to the worker's event loop;
- task end -> next task start: the event loop between the two (it starts
  the next task in the same turn, when one is waiting on the worker);
- task start -> first line: Dask's hand-over to its executor thread, and
  what runs before the objective (hpo: the start sent to the relay and its
  answer, the cores claimed, the log and the ``Trial`` made, the thread
  pools limited);
- the slot's gap: one trial's last line to the next one's first line, the
  sum of the three.

Figures are medians over every pair of consecutive trials of a worker, then
over the rounds; the last column is hpo's figure less plain Dask's. The
makespan's excess over the ideal (N * T / 2) is printed beside them: the
gaps are most of it.

Run: ``python bench/trial_gaps.py [--trials 1000] [--sleep 0.02] [--repeats 3]``.
The last line is ``trial_gap_ms=<hpo's median slot gap>``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _paths import share_paths

# The cluster's worker processes import the objective from here too.
share_paths()

from _timed_sleep import TaskSpans, sleep_noted, taken_spans  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import hpo  # noqa: E402

SLOTS = 2
PARTS = ("last line -> task end", "task end -> next task start", "task start -> first line",
         "the slot's gap")
Span = tuple[float, float]


def run_hpo(client: Client, n: int, seconds: float, out: Path) -> None:
    space = {
        "name": f"gaps-{time.monotonic_ns()}", "objective": "_timed_sleep:objective",
        "metric": {"name": "value"}, "search": {"algorithm": "grid", "parallel": SLOTS},
        "fixed": {"sleep_s": seconds, "out": str(out)},
        "space": {"x": {"type": "int", "low": 0, "high": n - 1}},
    }
    result = hpo.run(space, engine="dask", scheduler=client.scheduler.address, runs_dir=out.parent,
                     progress=False)
    if result.counts["COMPLETE"] != n:
        raise RuntimeError(f"hpo completed {result.counts}")


def run_dask(client: Client, n: int, seconds: float, out: Path) -> None:
    client.gather(client.map(sleep_noted, [seconds] * n, [str(out)] * n, pure=False))


def measure(run: Callable[..., None], client: Client, n: int, seconds: float) -> tuple[dict[str, float], float]:
    """One round: the median of each part (ms), and the makespan (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "notes"
        out.mkdir()
        client.run(taken_spans)  # what ran before this round
        began = time.perf_counter()
        run(client, n, seconds, out)
        makespan = time.perf_counter() - began
        pids = client.run(os.getpid)
        parts: dict[str, list[float]] = {part: [] for part in PARTS}
        for worker, spans in client.run(taken_spans).items():
            lines = sorted(_spans(out / f"{pids[worker]}.txt"))
            for part, values in _parts(sorted(spans), lines).items():
                parts[part] += values
    return {part: 1000 * statistics.median(v) for part, v in parts.items() if v}, makespan


def _spans(notes: Path) -> list[Span]:
    if not notes.exists():
        return []
    return [(float(a), float(b)) for a, b in (line.split() for line in notes.read_text().splitlines())]


def _parts(tasks: list[Span], lines: list[Span]) -> dict[str, list[float]]:
    """The parts between consecutive trials of one worker: each objective
    matched to the task whose span holds its first line."""
    starts = [start for start, _ in tasks]
    matched = []
    for first, last in lines:
        at = bisect.bisect_right(starts, first) - 1
        if at >= 0 and first <= tasks[at][1]:
            matched.append((tasks[at], (first, last)))
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    for (task, line), (next_task, next_line) in zip(matched, matched[1:]):
        parts[PARTS[0]].append(task[1] - line[1])
        parts[PARTS[1]].append(next_task[0] - task[1])
        parts[PARTS[2]].append(next_line[0] - next_task[0])
        parts[PARTS[3]].append(next_line[0] - line[1])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.02, help="each trial's sleep, seconds")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ideal = args.trials * args.sleep / SLOTS
    print(f"{args.trials} x {args.sleep:g} s on {SLOTS} slots (ideal {ideal:.2f} s), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    contenders = {"hpo (dask, journal)": run_hpo, "dask client.map": run_dask}
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    makespans: dict[str, list[float]] = {name: [] for name in contenders}
    with LocalCluster(n_workers=SLOTS, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster, \
            Client(cluster) as client:
        client.register_plugin(TaskSpans())
        for round_ in range(1, args.repeats + 1):
            for name, run in contenders.items():
                parts, makespan = measure(run, client, args.trials, args.sleep)
                figures[name].append(parts)
                makespans[name].append(makespan)
                print(f"  [{round_}/{args.repeats}] {name}: {makespan:.2f} s, slot's gap "
                      f"{parts[PARTS[3]]:.2f} ms", flush=True)
    print(f"\nbetween two trials on a worker, ms (median of each round's medians, of {args.repeats}):")
    names = list(contenders)
    print(f"  {'':30s}" + "".join(f"{name:>22s}" for name in names) + f"{'hpo - dask':>12s}")
    for part in PARTS:
        hpo_ms, dask_ms = (statistics.median(f[part] for f in figures[name]) for name in names)
        print(f"  {part:30s}{hpo_ms:22.2f}{dask_ms:22.2f}{hpo_ms - dask_ms:12.2f}")
    print(f"  {'makespan over the ideal, %':30s}" + "".join(
        f"{100 * (statistics.median(makespans[name]) - ideal) / ideal:22.1f}" for name in names))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"trial_gap_ms={statistics.median(f[PARTS[3]] for f in figures[names[0]]):.2f}")


if __name__ == "__main__":
    main()
