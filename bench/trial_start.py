"""Trial start: what a trial's start costs on a worker as the study grows.

For studies that already hold 0, 10,000 and 100,000 trials (synthetic, with
hpo's records: ``hpo.dashboards.synthetic``), the master opens the study as
``hpo.run`` does (its relay: the one replay of the journal), creates one
more trial, and a warm worker process (hpo imported, as a Dask worker is
after its first trial) runs its task. The study is first opened once and
ended as a master ends a study (``StudyRelay.save_snapshot``: the store's
snapshot when at least ``SNAPSHOT_EVERY`` records came since the last), so
the master measured opens it as the next run of a real study does; that
first open, a replay of the whole journal, is reported beside it.
Figures, medians over ``--trials`` tasks, each in a fresh worker process:

- start: from ``run_trial`` being called to the objective's first line;
- worker: the worker process's memory (RSS) after the trial, and how much
  of the journal it opened (hpo's trials open it 0 times);
- isolated: a trial in a process of its own (``time_limit_s`` or GPUs): the
  same from the task's start, and the trial process's peak memory; forked
  from the worker's warm process (the first trial starts that), and each in
  a fresh Python (``HPO_WARM_START=0``, as before warm processes);
- resumed: the second segment of a time-shared trial (``segment_steps`` 1,
  suspended after its first two reports because a trial waits), in a
  process of its own forked from a warm worker's warm process, with the
  context the master hands it (its first segment's reports and record):
  from its task's start to its objective's first line, the checkpoint
  restore left out (the objective has none);
- beside it, what a worker does with Optuna's own storage
  (``optuna.load_study`` on the journal, as Optuna's distributed examples
  do, and as hpo's workers did before their relay answered them): the time
  to load and the memory after.

Run: ``python bench/trial_start.py [--sizes 0,10000,100000] [--trials 3]``.
The last lines: ``start_growth_ms=<start at the largest size minus at 0>``,
``isolated_start_ms=`` (warm, at the first size), ``resumed_start_ms=``
(a resumed segment, at the first size), ``master_replay_s=`` (the
open without a snapshot) and ``master_open_s=`` (with the snapshot the
study's end wrote), both at the largest size.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _paths import share_paths

share_paths()

import optuna  # noqa: E402
from _spawned import in_process  # noqa: E402

from hpo.dashboards.synthetic import write_study  # noqa: E402
from hpo.store import StudyRelay, StudyStore, context_of  # noqa: E402
from hpo.store.records import TrialStatus, run_of, status_of  # noqa: E402
from hpo.trial import QuantumRule, TrialTask  # noqa: E402

STUDY = "synthetic"


def first_line(config: dict, trial) -> float:
    """The probe objective: when its first line ran, and the peak memory of its process."""
    Path(config["probe"]).write_text(f"{time.time()} {_peak_mb()}")
    return 1.0


def segments_line(config: dict, trial) -> float:
    """The probe of a time-shared trial: its first segment reports twice (a
    first quantum needs a slope) and yields its slot; the next one notes its
    first line, as ``first_line``."""
    Path(config["probe"]).write_text(f"{time.time()} {_peak_mb()}")
    if trial.reports:
        return 1.0
    trial.report(0, val_accuracy=0.5)
    trial.report(1, val_accuracy=0.6)
    if not trial.should_stop():
        raise RuntimeError("the first segment was not told to yield its slot")
    return 0.5


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(tasks: list[TrialTask], journal: str, warm: bool, out) -> None:
    """A warm worker: hpo imported, then ``tasks`` in turn; counts its opens
    of the journal. ``warm``: isolated trials start from a warm process."""
    import hpo.trial

    os.environ["HPO_WARM_START"] = "1" if warm else "0"
    opened = []
    sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" and
                     str(args[0]) == journal else None)
    figures = []
    for task in tasks:
        began = time.time()
        hpo.trial.run_trial(task)
        at, peak = Path(task.config["probe"]).read_text().split()
        figures.append((float(at) - began, _rss_mb(), len(opened), float(peak)))
    hpo.trial.close_warm_processes()
    out.send(figures)


def _optuna_worker(journal: str, out) -> None:
    """What a worker with Optuna's own storage does before its trial."""
    began = time.time()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    optuna.load_study(study_name=STUDY, storage=storage)
    out.send((time.time() - began, _rss_mb()))


def measure(size: int, trials: int, tmp: Path) -> dict[str, float]:
    run_dir = write_study(tmp / f"study-{size}", size, name=STUDY)
    journal = str(run_dir / "journal.log")
    # The study ran and ended before: its master wrote what a study's end writes.
    began = time.perf_counter()
    with StudyRelay(journal, STUDY, control=run_dir / "control.json") as relay:
        replayed = time.perf_counter() - began
        snapshot = relay.save_snapshot()
    began = time.perf_counter()
    starts, rss, opens, loads, load_rss = [], [], [], [], []
    with StudyRelay(journal, STUDY, control=run_dir / "control.json") as relay:
        opened = time.perf_counter() - began
        if snapshot and relay._feed.restored_from is None:
            raise RuntimeError("the master replayed the whole journal beside its snapshot")
        store = StudyStore(relay.storage, STUDY)

        def task(isolate: bool, segmented: bool = False) -> TrialTask:
            trial_id, number = store.create_trial({}, {})
            probe = tmp / f"probe-{size}-{number}"
            return TrialTask(storage=relay.writers_url, study_name=STUDY, trial_id=trial_id,
                             number=number, config={"probe": str(probe)},
                             objective=f"trial_start:{'segments' if segmented else 'first'}_line",
                             metric="val_accuracy", quantum=QuantumRule(steps=1) if segmented else None,
                             checkpoint_dir=str(run_dir / "trials" / str(number)),
                             control=str(run_dir / "control.json"), isolate=isolate)

        for _ in range(trials):
            ((start_s, worker_mb, worker_opens, _),) = in_process(_worker, [task(False)], journal, True)
            starts.append(start_s)
            rss.append(worker_mb)
            opens.append(worker_opens)
            load_s, load_mb = in_process(_optuna_worker, journal)
            loads.append(load_s)
            load_rss.append(load_mb)
        # Isolated trials, one worker each way: from its warm process (the
        # first starts it), and each in a fresh Python (HPO_WARM_START=0).
        warm = in_process(_worker, [task(True) for _ in range(trials + 1)], journal, True)
        fresh = in_process(_worker, [task(True) for _ in range(trials)], journal, False)
        resumed = _resumed_segments(store, journal, [task(True, segmented=True) for _ in range(trials + 1)])
    med = statistics.median
    return {"master_open_s": opened, "master_replay_s": replayed, "snapshot": snapshot,
            "start_ms": 1000 * med(starts), "worker_mb": med(rss),
            "journal_opens": max(opens), "isolated_first_ms": 1000 * warm[0][0],
            "isolated_start_ms": 1000 * med(f[0] for f in warm[1:]),
            "isolated_peak_mb": med(f[3] for f in warm[1:]),
            "isolated_fresh_ms": 1000 * med(f[0] for f in fresh),
            "isolated_fresh_peak_mb": med(f[3] for f in fresh),
            "resumed_start_ms": 1000 * med(resumed),
            "optuna_load_ms": 1000 * med(loads), "optuna_worker_mb": med(load_rss)}


def _resumed_segments(store: StudyStore, journal: str, firsts: list[TrialTask]) -> list[float]:
    """Each trial's first segment, suspended (a trial waits: the master's
    contender), then the second segments of all but the first trial in a
    warm worker whose warm process (one per objective) the first trial's
    second segment started: those segments' starts (s)."""
    store.set_contender(math.inf)
    in_process(_worker, firsts, journal, True)
    seconds = []
    for first in firsts:
        stored = store.trial(first.trial_id)
        if status_of(stored) is not TrialStatus.SUSPENDED:
            raise RuntimeError(f"trial {first.number}'s first segment did not suspend: "
                               f"{status_of(stored)}, {run_of(stored)}")
        seconds.append(dataclasses.replace(first, after_segment=run_of(stored).get("segment", -1),
                                           context=context_of(stored)))
    figures = in_process(_worker, seconds, journal, True)[1:]
    store.set_contender(None)
    for second in seconds:
        stored = store.trial(second.trial_id)
        if status_of(stored) is not TrialStatus.COMPLETE or stored.values != [1.0]:
            raise RuntimeError(f"trial {second.number} did not resume: {status_of(stored)}")
    return [f[0] for f in figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,10000,100000",
                        help="trials already in the study (default 0,10000,100000)")
    parser.add_argument("--trials", type=int, default=3, help="tasks per size (default 3)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, Optuna {optuna.__version__}; "
          f"medians of {args.trials} tasks, each in a fresh worker process", flush=True)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="trial-start-") as tmp:
        for size in sizes:
            print(f"  {size:,} trials ...", file=sys.stderr, flush=True)
            rows[size] = measure(size, args.trials, Path(tmp))
    print(f"\n{'trials in study':>15s} {'master opens':>12s} {'(replay)':>9s} {'hpo start':>10s} "
          f"{'worker RSS':>10s} {'journal opens':>13s} {'optuna load':>11s} {'optuna RSS':>10s}")
    for size, row in rows.items():
        print(f"{size:15,d} {row['master_open_s']:11.2f}s {row['master_replay_s']:8.2f}s "
              f"{row['start_ms']:8.1f}ms "
              f"{row['worker_mb']:8.0f}MB {row['journal_opens']:13d} {row['optuna_load_ms']:9.0f}ms "
              f"{row['optuna_worker_mb']:8.0f}MB")
    print(f"\nisolated trials (a process of its own), start to the objective's first line:\n"
          f"{'trials in study':>15s} {'warm':>8s} {'first (starts it)':>17s} {'fresh Python':>12s} "
          f"{'warm peak':>9s} {'fresh peak':>10s}")
    for size, row in rows.items():
        print(f"{size:15,d} {row['isolated_start_ms']:6.1f}ms {row['isolated_first_ms']:15.0f}ms "
              f"{row['isolated_fresh_ms']:10.0f}ms {row['isolated_peak_mb']:7.0f}MB "
              f"{row['isolated_fresh_peak_mb']:8.0f}MB")
    print("\na time-shared trial's second segment, resumed in a process of its own (warm), "
          "start to its first line:")
    for size, row in rows.items():
        print(f"{size:15,d} {row['resumed_start_ms']:6.1f}ms")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    first, last = rows[sizes[0]], rows[sizes[-1]]
    print(f"worker_growth_mb={last['worker_mb'] - first['worker_mb']:.1f}")
    print(f"start_growth_ms={last['start_ms'] - first['start_ms']:.1f}")
    print(f"isolated_start_ms={first['isolated_start_ms']:.1f}")
    print(f"resumed_start_ms={first['resumed_start_ms']:.1f}")
    print(f"master_replay_s={last['master_replay_s']:.2f}  # no snapshot: the whole journal replayed")
    kind = "from its snapshot and the journal's tail" if last["snapshot"] else "no snapshot (too few records)"
    print(f"master_open_s={last['master_open_s']:.2f}  # with {sizes[-1]:,} trials in the study, {kind}")


if __name__ == "__main__":
    main()
