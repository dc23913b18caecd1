"""Trial start: what a trial's start costs on a worker as the study grows.

For studies that already hold 0, 10,000 and 100,000 trials (synthetic, with
hpo's records: ``hpo.dashboards.synthetic``), the master opens the study as
``hpo.run`` does (its relay: the one replay of the journal), creates one
more trial, and a warm worker process (hpo imported, as a Dask worker is
after its first trial) runs its task. Figures, medians over ``--trials``
tasks, each in a fresh worker process:

- start: from ``run_trial`` being called to the objective's first line;
- worker: the worker process's memory (RSS) after the trial, and how much
  of the journal it opened (hpo's trials open it 0 times);
- isolated: a trial in a process of its own (``time_limit_s`` or GPUs): the
  same from the task's start, the child's interpreter start included, and
  the child's peak memory;
- beside it, what a worker does with Optuna's own storage
  (``optuna.load_study`` on the journal, as Optuna's distributed examples
  do, and as hpo's workers did before their relay answered them): the time
  to load and the memory after.

Run: ``python bench/trial_start.py [--sizes 0,10000,100000] [--trials 3]``.
The last line is ``start_growth_ms=<start at the largest size minus at 0>``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(BENCH.parent),
                                                         os.environ.get("PYTHONPATH")]))

import optuna  # noqa: E402

from hpo.dashboards.synthetic import write_study  # noqa: E402
from hpo.store import StudyRelay, StudyStore  # noqa: E402
from hpo.trial import TrialTask  # noqa: E402

STUDY = "synthetic"


def first_line(config: dict, trial) -> float:
    """The probe objective: when its first line ran, and the peak memory of its process."""
    Path(config["probe"]).write_text(f"{time.time()} {_peak_mb()}")
    return 1.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(task: TrialTask, journal: str, out) -> None:
    """A warm worker: hpo imported, then one task; counts its opens of the journal."""
    import hpo.trial

    opened = []
    sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" and
                     str(args[0]) == journal else None)
    began = time.time()
    hpo.trial.run_trial(task)
    at, peak = Path(task.config["probe"]).read_text().split()
    out.send((float(at) - began, _rss_mb(), len(opened), float(peak)))


def _optuna_worker(journal: str, out) -> None:
    """What a worker with Optuna's own storage does before its trial."""
    began = time.time()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    optuna.load_study(study_name=STUDY, storage=storage)
    out.send((time.time() - began, _rss_mb()))


def _in_process(target, *args):
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(*args, send))
    process.start()
    result = receive.recv()
    process.join()
    return result


def measure(size: int, trials: int, tmp: Path) -> dict[str, float]:
    run_dir = write_study(tmp / f"study-{size}", size, name=STUDY)
    journal = str(run_dir / "journal.log")
    began = time.perf_counter()
    starts, rss, opens, iso_starts, iso_peaks, loads, load_rss = [], [], [], [], [], [], []
    with StudyRelay(journal, STUDY, control=run_dir / "control.json") as relay:
        opened = time.perf_counter() - began
        store = StudyStore(relay.storage, STUDY)
        for n in range(trials):
            for isolate in (False, True):
                trial_id, number = store.create_trial({}, {})
                probe = tmp / f"probe-{size}-{n}-{isolate}"
                task = TrialTask(storage=relay.writers_url, study_name=STUDY, trial_id=trial_id,
                                 number=number, config={"probe": str(probe)},
                                 objective="trial_start:first_line", metric="val_accuracy",
                                 checkpoint_dir=str(run_dir / "trials" / str(number)),
                                 control=str(run_dir / "control.json"), isolate=isolate)
                start_s, worker_mb, worker_opens, peak_mb = _in_process(_worker, task, journal)
                if isolate:
                    iso_starts.append(start_s)
                    iso_peaks.append(peak_mb)
                else:
                    starts.append(start_s)
                    rss.append(worker_mb)
                    opens.append(worker_opens)
            load_s, load_mb = _in_process(_optuna_worker, journal)
            loads.append(load_s)
            load_rss.append(load_mb)
    med = statistics.median
    return {"master_open_s": opened, "start_ms": 1000 * med(starts), "worker_mb": med(rss),
            "journal_opens": max(opens), "isolated_start_ms": 1000 * med(iso_starts),
            "isolated_peak_mb": med(iso_peaks), "optuna_load_ms": 1000 * med(loads),
            "optuna_worker_mb": med(load_rss)}


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
    print(f"\n{'trials in study':>15s} {'master opens':>12s} {'hpo start':>10s} {'worker RSS':>10s} "
          f"{'journal opens':>13s} {'isolated start':>14s} {'isolated peak':>13s} "
          f"{'optuna load':>11s} {'optuna RSS':>10s}")
    for size, row in rows.items():
        print(f"{size:15,d} {row['master_open_s']:11.1f}s {row['start_ms']:8.1f}ms "
              f"{row['worker_mb']:8.0f}MB {row['journal_opens']:13d} {row['isolated_start_ms']:12.0f}ms "
              f"{row['isolated_peak_mb']:11.0f}MB {row['optuna_load_ms']:9.0f}ms "
              f"{row['optuna_worker_mb']:8.0f}MB")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    first, last = rows[sizes[0]], rows[sizes[-1]]
    print(f"worker_growth_mb={last['worker_mb'] - first['worker_mb']:.1f}")
    print(f"start_growth_ms={last['start_ms'] - first['start_ms']:.1f}")


if __name__ == "__main__":
    main()
