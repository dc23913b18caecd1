"""Where a short trial's milliseconds go on its worker, besides its objective.

A worker process (spawned, hpo imported, as a Dask worker is after its first
trial) runs ``--trials`` tasks of an objective that returns at once, each
through the study's relay in this process, as the dask engine's worker runs
``hpo.trial.run_trial``. Measured twice in the same worker:

- plain: the time of each ``run_trial`` call, no profiler (the figure that
  counts: the slot a trial holds beyond its objective's own time), for the
  tasks a master makes (their end posted: the call returns once the relay
  holds it) and for tasks that wait for their end to be durable (as a task
  on another node does, and as every task did before);
- profiled (``cProfile``): the share of that time each step of the path
  takes, by the functions that do it, scaled to the plain time. Shares
  overlap where one step calls another (the table says which).

Run: ``python bench/trial_path.py [--trials 300]``. The last line is
``trial_path_ms=<plain median, ms per trial, the end posted>``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from _spawned import in_process  # noqa: E402

from hpo.dashboards.synthetic import write_study  # noqa: E402
from hpo.store import StudyRelay, StudyStore  # noqa: E402
from hpo.trial import TrialTask  # noqa: E402

STUDY = "trial-path"

# Each step of the path, by the function (its file's name and its own name)
# whose cumulative time it is; nested steps are indented.
STEPS = [
    ("start: sent to the relay (TrialLink.begin_start)", "_link.py", "begin_start"),
    ("the attempt (objective included)", "_run.py", "_attempt"),
    ("  cores claimed and pinned (pin_cpus), before the start's answer", "_cpus.py", "pin_cpus"),
    ("  the start's answer, waited for (TrialLink._answer_of)", "_link.py", "_answer_of"),
    ("  the trial's log, opened when first written (trial_log)", "_log.py", "trial_log"),
    ("  thread pools limited (limit_threads)", "_cpus.py", "limit_threads"),
    ("  child processes listed before and after (reaping)", "_reaper.py", "children"),
    ("  the Trial handle, its folder made when asked for (trial_for)", "_attempt.py", "trial_for"),
    ("  the objective", "trial_path.py", "noop"),
    ("heartbeat thread told (beating)", "_pulse.py", "beating"),
    ("checkpoint files listed (checkpoint_files)", "_attempt.py", "checkpoint_files"),
    ("end: sent to the relay (TrialLink.end)", "_link.py", "end"),
]


def noop(config: dict, trial) -> dict:
    return {"value": 1.0}


def _worker(tasks: list[TrialTask], profile: bool, out) -> None:
    import hpo.trial

    times = []
    profiler = cProfile.Profile() if profile else None
    for task in tasks:
        began = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        hpo.trial.run_trial(task)
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - began)
    shares = {}
    if profiler is not None:
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        total = sum(times)
        for label, file, name in STEPS:
            spent = sum(entry[3] for (path, _, function), entry in stats.items()
                        if function == name and path.endswith(file))
            shares[label] = spent / total
    out.send((times, shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(BENCH.parent),
                                                             os.environ.get("PYTHONPATH")]))
    print(f"{args.trials} trials of an objective that returns at once, one worker process, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        run_dir = write_study(Path(tmp_name) / "study", 0, name=STUDY)
        with StudyRelay(str(run_dir / "journal.log"), STUDY, control=run_dir / "control.json") as relay:
            store = StudyStore(relay.storage, STUDY)

            def tasks(end_waits: bool) -> list[TrialTask]:
                made = []
                for _ in range(args.trials):
                    trial_id, number = store.create_trial({}, {})
                    made.append(TrialTask(
                        storage=relay.writers_url, study_name=STUDY, trial_id=trial_id, number=number,
                        config={}, objective="trial_path:noop", metric="value",
                        checkpoint_dir=str(run_dir / "trials" / str(number)),
                        control=str(run_dir / "control.json"), end_waits=end_waits))
                return made

            waited, _ = in_process(_worker, tasks(True), False)
            plain, _ = in_process(_worker, tasks(False), False)
            profiled, shares = in_process(_worker, tasks(False), True)
    median_ms = 1000 * statistics.median(plain)
    print(f"\nper trial, median, the end awaited until durable: "
          f"{1000 * statistics.median(waited):.2f} ms plain")
    print(f"per trial, median, the end posted (the master's tasks): {median_ms:.2f} ms plain, "
          f"{1000 * statistics.median(profiled):.2f} ms profiled (the shares below are of the "
          "profiled time, shown in ms of the plain time)")
    print(f"  {'step':62s} {'share':>6s} {'ms':>6s}")
    for label, _, _ in STEPS:
        share = shares.get(label, 0.0)
        print(f"  {label:62s} {100 * share:5.1f}% {share * median_ms:6.2f}")
    print(f"trial_path_ms={median_ms:.2f}")


if __name__ == "__main__":
    main()
