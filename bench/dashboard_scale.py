"""How the dashboard and the report scale with the number of trials.

Writes a synthetic study (``hpo.dashboards.synthetic``: the attributes hpo
writes, reports every step, retries, suspended segments, running trials) into
a temporary run directory, then times, over ``--repeats`` rounds, each from a
cold snapshot:

- reading the store and building the trial views, from the snapshots beside
  the journal (``journal.log.views``, ``journal.log.snapshot``) and without
  them (Optuna's journal replay);
- each view: the figure built server-side and serialised to JSON, as Dash sends it;
- the leaderboard: every row, sorted by another column, one page;
- a live refresh after 100 more trials were appended;
- the static report (``hpo report``);
- in chromium (when installed): the cold start, from starting a fresh
  ``hpo dashboard`` process until its first view (the leaderboard) is drawn,
  with the snapshots and without them; then the time from a click on each
  tab until its plot is drawn.

Prints a table of medians and, last, ``slowest_view_s=<seconds>``: the slowest
view, server-side or in the browser, or the cold start with snapshots
(store reading and report excluded).

    python bench/dashboard_scale.py                  # 100,000 trials
    python bench/dashboard_scale.py --trials 2000    # a quick smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import optuna

from hpo.dashboards import leaderboard
from hpo.dashboards.data import StoreReader
from hpo.dashboards.report import build_report
from hpo.dashboards.synthetic import write_study
from hpo.dashboards.views import VIEWS
from hpo.store import RunDir

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", "/usr/bin/chromium") if os.path.exists(p)),
                None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
HPO = [str(Path(sys.executable).parent / "hpo")]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


SNAPSHOTS = ("journal.log.views", "journal.log.snapshot")


@contextlib.contextmanager
def without_snapshots(run_dir: Path):
    """The run directory as if no snapshot had been written (they are put back after)."""
    aside = [(run_dir / n, run_dir / f".{n}.aside") for n in SNAPSHOTS if (run_dir / n).exists()]
    for path, hidden in aside:
        path.rename(hidden)
    try:
        yield
    finally:
        for path, hidden in aside:
            path.unlink(missing_ok=True)  # one a reader wrote meanwhile
            hidden.rename(path)


def write_snapshots(run_dir: Path) -> float:
    """Seconds to write both snapshots, as the master and the dashboard do."""
    start = time.perf_counter()
    RunDir(run_dir).save_snapshot()
    StoreReader(run_dir, write_views=False).write_views_snapshot()
    return time.perf_counter() - start


def server_round(run_dir: Path) -> dict[str, float]:
    """One round from a cold reader: every step's seconds."""
    times: dict[str, float] = {}
    with without_snapshots(run_dir):
        times["read store, no snapshot (journal replay)"], reader = timed(
            StoreReader, run_dir, write_views=False)
        times["build trial views, no snapshot"], _ = timed(reader.snapshot)
    del reader, _
    gc.collect()
    times["read store from the snapshots"], reader = timed(StoreReader, run_dir, write_views=False)
    times["build trial views from the snapshots"], snap = timed(reader.snapshot)
    gc.freeze()  # as hpo dashboard does once the store is read
    for view in VIEWS:
        times[f"view: {view.label}"], _ = timed(lambda: view.figure(snap).to_json())

    def board():
        rows = leaderboard.query(leaderboard.rows(snap), [{"column_id": "duration_s",
                                                           "direction": "desc"}], "{state} s= COMPLETE")
        return rows[:50]
    times["view: Leaderboard (all rows, sort, filter, page)"], _ = timed(board)
    times["report (all views, HTML)"], _ = timed(build_report, snap)
    del reader, snap
    gc.unfreeze()
    gc.collect()  # the next round starts from a clean heap
    return times


def refresh_round(run_dir: Path, name: str, new_trials: int = 100) -> float:
    """Seconds of a live refresh after ``new_trials`` trials were appended."""
    reader = StoreReader(run_dir, write_views=False)
    before = len(reader.snapshot().trials)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(run_dir / "journal.log")))
    study = optuna.load_study(study_name=name, storage=storage)
    template = study.trials[-new_trials - 20]  # a finished one, with its attributes
    study.add_trials([optuna.trial.create_trial(
        state=template.state, value=template.value, params=template.params,
        distributions=template.distributions, system_attrs=template.system_attrs,
        intermediate_values=template.intermediate_values) for _ in range(new_trials)])
    seconds, snap = timed(reader.snapshot)
    if len(snap.trials) != before + new_trials:
        raise RuntimeError("refresh missed the new trials")
    return seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_dashboard(run_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([*HPO, "dashboard", str(run_dir), "--port", str(port),
                             "--refresh-s", "60"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}/"


def _first_view(page, proc: subprocess.Popen, url: str) -> None:
    """Load the page as soon as the server answers; return once the leaderboard is drawn."""
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("hpo dashboard did not start")
            time.sleep(0.05)
    page.goto(url)
    page.wait_for_selector('td[data-dash-column="trial"]', timeout=120_000)


def _stop(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def browser_round(run_dir: Path) -> dict[str, float]:
    """Start ``hpo dashboard`` fresh, without snapshots and with them: the time
    from the process start to the first view drawn; then each view in chromium."""
    from playwright.sync_api import sync_playwright

    times: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        with without_snapshots(run_dir):
            page, proc, times["cold start to first view, no snapshot"] = _cold_start(browser, run_dir)
            _stop(proc)
            page.close()
        page, proc, times["cold start to first view (snapshots)"] = _cold_start(browser, run_dir)
        try:
            start = time.perf_counter()
            page.reload()
            page.wait_for_selector('td[data-dash-column="trial"]', timeout=120_000)
            times["view: Leaderboard (all rows, sort, filter, page)"] = time.perf_counter() - start
            for view in VIEWS:
                start = time.perf_counter()
                page.locator(".tab", has_text=view.label).first.click()
                page.wait_for_function(
                    f"(() => {{ const g = document.querySelector('#graph-{view.key} .js-plotly-plot');"
                    " return g && g.querySelector('.main-svg') && g._fullData &&"
                    " g._fullData.length > 0; })()", timeout=120_000)
                times[f"view: {view.label}"] = time.perf_counter() - start
            times["server peak memory MB"] = _peak_mb(proc.pid)
        finally:
            _stop(proc)
        browser.close()
    return times


def _cold_start(browser, run_dir: Path) -> tuple[Any, subprocess.Popen, float]:
    """A new page on a fresh ``hpo dashboard``: the page, the process, and the
    seconds from starting the process until its first view was drawn."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    start = time.perf_counter()
    proc, url = _start_dashboard(run_dir)
    try:
        _first_view(page, proc, url)
    except BaseException:
        _stop(proc)
        raise
    return page, proc, time.perf_counter() - start


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=64, help="worker processes (timeline rows)")
    parser.add_argument("--steps", type=int, default=10, help="reports per trial")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-browser", action="store_true", help="server-side timings only")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    browser = not args.no_browser and CHROMIUM is not None
    if not browser and not args.no_browser:
        print("chromium not found: server-side timings only", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="hpo-dash-bench-") as tmp:
        run_dir = Path(tmp) / "synthetic"
        seconds, _ = timed(write_study, run_dir, args.trials, workers=args.workers, steps=args.steps)
        size = (run_dir / "journal.log").stat().st_size / 1e6
        print(f"synthetic study: {args.trials} trials, {args.workers} workers, {args.steps} steps "
              f"each, journal {size:.0f} MB, written in {seconds:.1f} s", file=sys.stderr)
        from hpo.dashboards.app import warm_up
        seconds, _ = timed(warm_up)
        print(f"imports (optuna.importance, plotly's pandas): {seconds:.1f} s, once per process",
              file=sys.stderr)
        seconds = write_snapshots(run_dir)
        print(f"snapshots (journal.log.snapshot, journal.log.views) written in {seconds:.1f} s",
              file=sys.stderr)
        server = [server_round(run_dir) for _ in range(args.repeats)]
        pages = [browser_round(run_dir) for _ in range(args.repeats)] if browser else []
        refresh = statistics.median(refresh_round(run_dir, "synthetic")
                                    for _ in range(args.repeats))

    rows = list(server[0]) + [r for r in (pages[0] if pages else {}) if r not in server[0]
                              and r != "server peak memory MB"]
    width = max(map(len, rows)) + 2
    print(f"\n{'step':<{width}} {'server s':>9} {'browser s':>10}")
    print("-" * (width + 21))
    slowest = 0.0
    for row in rows:
        s = statistics.median(r[row] for r in server) if row in server[0] else None
        b = statistics.median(r[row] for r in pages) if pages and row in pages[0] else None
        print(f"{row:<{width}} {'' if s is None else f'{s:>9.3f}':>9} "
              f"{'' if b is None else f'{b:>10.3f}'}")
        if row.startswith(("view:", "cold start to first view (snapshots)")):
            slowest = max(slowest, s or 0.0, b or 0.0)
    print(f"{'live refresh after 100 new trials':<{width}} {refresh:>9.3f}")
    if pages:
        memory = statistics.median(r["server peak memory MB"] for r in pages)
        print(f"{'hpo dashboard peak memory (MB)':<{width}} {'':>9} {memory:>10.0f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nmedians of {args.repeats} rounds; {args.trials} trials; peak memory of this process "
          f"{peak:.0f} MB")
    print(f"slowest_view_s={slowest:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
