"""Data staged once per node: 8 trials of one node reading a dataset from a
slow shared path, with and without staging (the space's ``data`` section).

The dataset is generated (``--size-mb`` of random bytes in ``--files``
files). The slow shared file system is emulated, not mounted: every process
of the node reads files under the "shared" folder through one throttled link
of ``--rate-mb`` MiB/s that they all share, as a node shares its bandwidth
to a parallel file system (``bench/_slow_shared.py``: a ledger file under
``flock`` books each read's time on the link; the bytes come from the page
cache). Both the trials' own reads and hpo's copier go through it, and the
ledger counts every byte read from the shared path, by any process.

The node is a Dask cluster of 2 worker processes with 4 threads each (8
trials at once), started once and used by both runs; each run is a grid of
8 trials with ``hpo.run``. Per run: the bytes read from the shared path,
the time to first batch (from a trial's start to its first 1 MiB batch;
median and worst of the 8), and the whole study's time.

Run: ``python bench/staging.py [--size-mb 128] [--files 32] [--rate-mb 64]
[--stage-to DIR]``. The last line is ``shared_reads_ratio=<bytes the
unstaged run read from the shared path / bytes the staged run read>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _paths import share_paths

share_paths()

import hpo  # noqa: E402
from hpo.engines import DaskEngine  # noqa: E402

import _slow_shared  # noqa: E402

TRIALS = 8


def make_dataset(folder: Path, size_mb: int, files: int) -> int:
    """``files`` files of random bytes, ``size_mb`` MiB in all; the bytes."""
    folder.mkdir(parents=True)
    each = size_mb * 2**20 // files
    for i in range(files):
        (folder / f"part-{i:03d}.bin").write_bytes(os.urandom(each))
    return each * files


def run(staged: bool, scheduler: str, work: Path, args: argparse.Namespace) -> dict[str, float]:
    """One study of 8 trials; what it read from the shared path and how long it took."""
    mode = "staged" if staged else "unstaged"
    ledger, records = str(work / f"{mode}.ledger"), work / f"{mode}-records"
    records.mkdir()
    _slow_shared.reset(ledger)
    source = work / "shared" / "dataset"
    space = {
        "name": f"staging-{mode}", "objective": "_slow_shared:train", "metric": {"name": "value"},
        "fixed": {"staged": staged, "source": str(source), "shared": str(work / "shared"),
                  "ledger": ledger, "rate": args.rate_mb * 2**20, "records": str(records)},
        "space": {"trial": list(range(TRIALS))},
    }
    if staged:
        space["data"] = {"stage_to": args.stage_to or str(work / "node-local"),
                         "items": {"dataset": str(source)}}
    started = time.monotonic()
    result = hpo.run(space, engine=DaskEngine(scheduler=scheduler), runs_dir=work / "runs",
                     progress=False)
    study_s = time.monotonic() - started
    if result.counts["COMPLETE"] != TRIALS:
        raise SystemExit(f"{mode}: {result.counts}")
    seen = [json.loads(p.read_text()) for p in records.glob("*.json")]
    first = [r["first_batch"] - r["started"] for r in seen]
    return {"shared_bytes": _slow_shared.shared_bytes(ledger), "read_bytes": sum(r["bytes"] for r in seen),
            "first_median_s": statistics.median(first), "first_max_s": max(first), "study_s": study_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=128)
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--rate-mb", type=float, default=64.0, help="the node's share of the shared FS")
    parser.add_argument("--stage-to", help="the node-local folder (default: a temporary one)")
    args = parser.parse_args()

    from distributed import LocalCluster

    with tempfile.TemporaryDirectory(prefix="hpo-staging-bench-") as tmp:
        work = Path(tmp)
        size = make_dataset(work / "shared" / "dataset", args.size_mb, args.files)
        load_before = os.getloadavg()
        with LocalCluster(n_workers=2, threads_per_worker=4, processes=True, host="127.0.0.1",
                          dashboard_address=":0") as cluster:
            rows = {mode: run(mode == "staged", cluster.scheduler_address, work, args)
                    for mode in ("unstaged", "staged")}
        load_after = os.getloadavg()

    print(f"{TRIALS} trials on one node (2 Dask worker processes x 4 threads), each reading a "
          f"{size / 2**20:.0f} MiB dataset of {args.files} files once")
    print(f"slow shared path: emulated, a link of {args.rate_mb:g} MiB/s shared by the node's "
          "processes (throttled open(), bytes counted at the link)")
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after (1 min)")
    print()
    print(f"{'run':<9} {'shared MiB read':>15} {'trials read MiB':>15} {'first batch median s':>20} "
          f"{'first batch max s':>17} {'study s':>8}")
    for mode, row in rows.items():
        print(f"{mode:<9} {row['shared_bytes'] / 2**20:>15.1f} {row['read_bytes'] / 2**20:>15.1f} "
              f"{row['first_median_s']:>20.2f} {row['first_max_s']:>17.2f} {row['study_s']:>8.1f}")
    ratio = rows["unstaged"]["shared_bytes"] / max(rows["staged"]["shared_bytes"], 1)
    print(f"shared_reads_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
