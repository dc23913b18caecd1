"""Store ingest: reports per second while many processes write one study at once.

P separate processes (multiprocessing, spawn) each own one trial and report
steps 0..R-1 with two metrics, all starting at the same instant, as P trials
on P workers do. The figure is P * R over the wall time from that instant to
the last process finishing (interpreter start-up and opening the store are not
counted). Contenders, interleaved in one run on the same disk:

- hpo, journal file with its relay (the default store): the study's
  ``hpo.store.StudyRelay`` runs in this process, as ``hpo.run`` opens it, and
  each process reports through a store-backed ``hpo.trial.Trial``, as the
  trial task builds it on a worker; a report is one request answered once
  its two records (the intermediate value of the study's metric, and one
  attribute holding all metrics of the step) are durable, group-committed
  with the other processes' (one write and one fsync per round);
- hpo, journal file without the relay (``HPO_RELAY=off``, and what a worker
  that cannot reach the master does): each process appends under the
  journal's file lock, one append per report;
- hpo, SQLite: the relay in front of a ``sqlite:///`` URL (two writes per report);
- Optuna, journal file: ``study.ask()`` in each process, then
  ``trial.report(value, step)``, one write per report: what a user would
  otherwise write;
- Optuna, SQLite: the same with ``storage="sqlite:///..."`` (Optuna's defaults).

Fairness is the slowest process's time over the fastest's (1.0: all finish
together). ``--groups`` starts each writer in its own session and process
group, as writers on separate nodes are, and ``--dir`` puts the stores on a
path standing for a shared file system.

After each run the store is read back and every report counted; a run that
lost one stops the benchmark; a run where a writer got an error (SQLite:
"database is locked") is counted as failed, with the reason, and left out of
the median.

Run: ``python bench/store_ingest.py [--procs 8] [--reports 2000] [--repeats R]
[--contenders hpo,optuna] [--stores relay,journal] [--dir DIR] [--groups]``. ``--dir`` puts the stores on that
file system (default: the system temp dir); use it to measure a shared one
(NFS, GPFS, Lustre). Figures are medians over R rounds; contenders are chosen
by name prefix. The last lines are ``fairness=<hpo, default store>``,
``relay_cpu_us=<the relay thread's CPU per report, hpo's default store>``
(Linux) and ``reports_per_s=<hpo, default store>``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from hpo.store import StudyRelay, StudyStore, open_storage  # noqa: E402
from hpo.store.records import REPORT_ATTR  # noqa: E402
from hpo.trial import TrialTask, open_trial  # noqa: E402

STUDY = "ingest"
_TICK = 50  # reports between progress-counter updates
_START_TIMEOUT_S = 300


def metrics_of(number: int, step: int) -> dict[str, float]:
    return {"value": number + step / 4096, "loss": 1.0 / (step + 1)}


# ------------------------------------------------------------ writers (child processes)


def _hpo_writer(url: str, number: int, trial_id: int) -> Callable[[int], None]:
    ckpt = tempfile.mkdtemp(prefix="hpo-ingest-")
    trial = open_trial(TrialTask(storage=url, study_name=STUDY, trial_id=trial_id, number=number,
                                 config={}, objective="none:none", metric="value",
                                 checkpoint_dir=ckpt))
    return lambda step: trial.report(step, **metrics_of(number, step))


def _optuna_storage(url: str):
    if "://" in url:
        return url  # what a user passes: Optuna builds RDBStorage(url) with its defaults
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))


def _optuna_writer(url: str, number: int, trial_id: int) -> Callable[[int], None]:
    trial = optuna.load_study(study_name=STUDY, storage=_optuna_storage(url)).ask()
    return lambda step: trial.report(metrics_of(number, step)["value"], step)


_WRITERS = {"hpo": _hpo_writer, "optuna": _optuna_writer}


def _writer(kind: str, url: str, number: int, trial_id: int, reports: int,
            ready, go, counter, error_file: str, own_group: bool, times) -> None:
    if own_group:
        os.setsid()  # as a writer on another node: no process group shared with the others
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report = _WRITERS[kind](url, number, trial_id)
    ready.release()
    if not go.wait(_START_TIMEOUT_S):
        raise SystemExit("never told to start")
    begin = time.perf_counter()
    step = 0
    try:
        for step in range(reports):
            report(step)
            if step % _TICK == _TICK - 1:
                with counter.get_lock():
                    counter.value += _TICK
    except Exception as exc:  # e.g. "database is locked": a result of the benchmark
        Path(error_file).write_text(f"{_root_cause(exc)} (at step {step})")
        raise SystemExit(1) from None
    with counter.get_lock():
        counter.value += reports % _TICK
    times[number] = time.perf_counter() - begin


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


# ------------------------------------------------------------ one timed run


class RunFailed(Exception):
    """A writer could not write: the store refused (a finding, not a crash)."""


def run_once(label: str, kind: str, url: str, procs: int, reports: int, work: Path,
             groups: bool, relay: bool) -> tuple[float, float, float | None]:
    """Time one run; return reports per second over all processes, the
    slowest process's time over the fastest's, and the CPU the relay's
    thread spent per report, in microseconds (None: no relay).

    Raises RunFailed when a writer failed, with the first reason."""
    if relay:
        with StudyRelay(url, STUDY) as served:
            return _run_writers(label, kind, url, served.writers_url, served.storage, procs, reports,
                                work, groups)
    storage = open_storage(url) if kind == "hpo" else _optuna_storage(url)
    return _run_writers(label, kind, url, url, storage, procs, reports, work, groups)


def _relay_cpu_s() -> float | None:
    """The CPU time (user and system) of this process's relay thread so
    far, from /proc (Linux); None where it cannot be read."""
    relay = next((t for t in threading.enumerate() if t.name == "hpo-study-relay"), None)
    if relay is None or relay.native_id is None:
        return None
    try:
        fields = Path(f"/proc/self/task/{relay.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _run_writers(label: str, kind: str, store_url: str, url: str, storage, procs: int,
                 reports: int, work: Path, groups: bool) -> tuple[float, float, float | None]:
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    # hpo: the master creates the trials; optuna: each process asks for its own.
    trial_ids = [StudyStore.trial_id(study.ask()) if kind == "hpo" else -1 for _ in range(procs)]
    ctx = mp.get_context("spawn")
    ready, go, counter = ctx.Semaphore(0), ctx.Event(), ctx.Value("q", 0)
    times = ctx.Array("d", procs)
    errors = [work / f"writer-{n}.error" for n in range(procs)]
    writers = [ctx.Process(target=_writer, args=(kind, url, n, trial_ids[n], reports, ready, go,
                                                 counter, str(errors[n]), groups, times))
               for n in range(procs)]
    for writer in writers:
        writer.start()
    total = procs * reports
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        for _ in writers:
            while not ready.acquire(timeout=0.5):
                if time.monotonic() > deadline or not all(w.is_alive() for w in writers):
                    raise RuntimeError(f"{label}: a writer did not start (exit codes "
                                       f"{[w.exitcode for w in writers]})")
        begin, relay_before = time.perf_counter(), _relay_cpu_s()
        go.set()
        while any(w.is_alive() for w in writers):
            _status(f"{label}: {counter.value:,}/{total:,} reports, "
                    f"{time.perf_counter() - begin:.0f} s")
            for writer in writers:
                writer.join(timeout=0.5)
                if writer.is_alive():
                    break
        elapsed = time.perf_counter() - begin
        relay_after = _relay_cpu_s()
    finally:
        go.set()
        for writer in writers:
            if writer.is_alive():
                writer.kill()
                writer.join()
    failed = [(w, e) for w, e in zip(writers, errors) if w.exitcode != 0]
    if failed:
        writer, error = failed[0]
        reason = error.read_text() if error.exists() else f"exit code {writer.exitcode}"
        raise RunFailed(f"{len(failed)} of {procs} writers failed; first: {reason}")
    _check_complete(label, kind, store_url, procs, reports)
    relay_us = (None if relay_before is None or relay_after is None
                else 1e6 * (relay_after - relay_before) / total)
    return total / elapsed, max(times) / min(times), relay_us


def _check_complete(label: str, kind: str, url: str, procs: int, reports: int) -> None:
    """Read the store back through a new storage object and count every report."""
    fresh = (optuna.storages.RDBStorage(url) if "://" in url else
             optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url)))
    trials = optuna.load_study(study_name=STUDY, storage=fresh).get_trials(deepcopy=False)
    values = sum(len(t.intermediate_values) for t in trials)
    attrs = sum(k.startswith(REPORT_ATTR) for t in trials for k in t.system_attrs)
    want_attrs = procs * reports if kind == "hpo" else 0
    if len(trials) != procs or values != procs * reports or attrs != want_attrs:
        raise RuntimeError(f"{label}: stored {len(trials)} trials, {values} values, {attrs} "
                           f"report attributes; wrote {procs} x {reports}")
    if isinstance(fresh, optuna.storages.RDBStorage):
        fresh.engine.dispose()


_last_status = 0


def _status(line: str) -> None:
    """Rewrite the status line on a terminal; elsewhere (a log file) stay quiet."""
    global _last_status
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line.ljust(_last_status) + "\r")
        sys.stderr.flush()
        _last_status = len(line)


# ------------------------------------------------------------ main


CONTENDERS = [  # name, kind, store, writes per report
    ("hpo Trial.report", "hpo", "relay", 1),
    ("hpo Trial.report", "hpo", "journal", 1),
    ("hpo Trial.report", "hpo", "sqlite", 2),
    ("optuna trial.report", "optuna", "journal", 1),
    ("optuna trial.report", "optuna", "sqlite", 1),
]
DEFAULT_STORE = ("hpo Trial.report", "relay")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8, help="writer processes (default 8)")
    parser.add_argument("--reports", type=int, default=2000,
                        help="reports per process (default 2000)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--contenders", help="comma-separated name prefixes (default: all)")
    parser.add_argument("--stores", help="comma-separated stores: relay, journal, sqlite (default: all)")
    parser.add_argument("--dir", help="directory for the stores (default: the system temp dir)")
    parser.add_argument("--groups", action="store_true",
                        help="each writer in its own session and process group, as on separate nodes")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    contenders = CONTENDERS
    if args.contenders:
        contenders = [c for c in CONTENDERS if c[0].startswith(tuple(args.contenders.split(",")))]
    if args.stores:
        contenders = [c for c in contenders if c[2] in args.stores.split(",")]

    print(f"{args.procs} processes x {args.reports:,} reports each, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, Optuna {optuna.__version__}", flush=True)
    rates: dict[tuple[str, str], list[float]] = {(c[0], c[2]): [] for c in contenders}
    spreads: dict[tuple[str, str], list[float]] = {(c[0], c[2]): [] for c in contenders}
    failures: dict[tuple[str, str], list[str]] = {(c[0], c[2]): [] for c in contenders}
    relay_cpu: dict[tuple[str, str], list[float]] = {(c[0], c[2]): [] for c in contenders}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="store-ingest-") as tmp_name:
        print(f"stores in {tmp_name}", flush=True)
        for repeat in range(args.repeats):
            for name, kind, store, _ in contenders:  # interleaved
                work = Path(tmp_name) / f"{kind}-{store}-{repeat}"
                work.mkdir()
                url = f"sqlite:///{work}/study.db" if store == "sqlite" else f"{work}/journal.log"
                label = f"[{repeat + 1}/{args.repeats}] {name}, {store}"
                try:
                    rate, spread, relay_us = run_once(label, kind, url, args.procs, args.reports, work,
                                                      args.groups, relay=kind == "hpo" and store != "journal")
                except RunFailed as exc:
                    failures[(name, store)].append(str(exc))
                    outcome = f"FAILED: {exc}"
                else:
                    rates[(name, store)].append(rate)
                    spreads[(name, store)].append(spread)
                    outcome = f"{rate:,.0f} reports/s, slowest/fastest process {spread:.2f}"
                    if relay_us is not None:
                        relay_cpu[(name, store)].append(relay_us)
                        outcome += f", relay thread {relay_us:.0f} us of CPU a report"
                _status("")
                print(f"  {label}: {outcome}", file=sys.stderr, flush=True)

    print(f"\nreports per second, all {args.procs} processes together "
          f"(median of the runs that finished, of {args.repeats}):")
    print(f"  {'contender':22s} {'store':8s} {'writes/report':>13s} {'reports/s':>10s} "
          f"{'ms/report':>10s} {'vs optuna':>10s} {'slow/fast':>9s} {'failed runs':>11s} "
          f"{'relay us/report':>15s}")
    medians = {key: statistics.median(values) for key, values in rates.items() if values}
    for name, kind, store, writes in contenders:
        failed = f"{len(failures[(name, store)])}/{args.repeats}"
        rate = medians.get((name, store))
        if rate is None:
            print(f"  {name:22s} {store:8s} {writes:13d} {'-':>10s} {'-':>10s} {'':10s} {'-':>9s} "
                  f"{failed:>11s}")
            continue
        # What one process waits per report: P processes share the rate.
        latency_ms = 1000 * args.procs / rate
        plain = medians.get(("optuna trial.report", "journal" if store == "relay" else store))
        ratio = f"{rate / plain:9.2f}x" if plain and kind == "hpo" else ""
        spread = statistics.median(spreads[(name, store)])
        cpu = relay_cpu[(name, store)]
        relay_us = f"{statistics.median(cpu):15.0f}" if cpu else f"{'':15s}"
        print(f"  {name:22s} {store:8s} {writes:13d} {rate:10,.0f} {latency_ms:10.2f} "
              f"{ratio:>10s} {spread:9.2f} {failed:>11s} {relay_us}")
    for (name, store), reasons in failures.items():
        for reason in reasons:
            print(f"  {name}, {store}: {reason}")
    print("  (relay: journal file, appends group-committed by the master's relay; journal: "
          "each process appends under the file lock; hpo's sqlite: behind the relay)")
    if DEFAULT_STORE in medians:
        print(f"fairness={statistics.median(spreads[DEFAULT_STORE]):.2f}")
        if relay_cpu[DEFAULT_STORE]:
            print(f"relay_cpu_us={statistics.median(relay_cpu[DEFAULT_STORE]):.0f}")
        print(f"reports_per_s={medians[DEFAULT_STORE]:.0f}")


if __name__ == "__main__":
    main()
