"""Many processes writing one study at once: nothing lost, duplicated or corrupt.

``PROCS`` separate OS processes (multiprocessing, spawn) each own one trial that
the master created beforehand, and report steps 0..N-1 with two metrics through
the path user code takes on a worker: the store-backed ``hpo.trial.Trial``
that ``hpo.trial.open_trial`` gives the objective (``Trial.report``: an
intermediate value plus a ``hpo:report:NNNNNN`` attribute per step). All
start writing at the same instant; meanwhile this process polls the study as
the master does. Then the store is checked from outside:

- a fresh process replays it and finds every (trial, step) once, in the
  intermediate values and in the report attributes, with the exact values
  written;
- the raw store holds each write exactly once (journal: every line is whole
  JSON, one line per write; SQLite: ``PRAGMA integrity_check`` is ok and no
  (trial, step) or (trial, key) row repeats);
- every snapshot the master read while the writers ran was a gap-free prefix
  with the right values (no torn or reordered records).

The journal is written both ways: through the study's relay, as trials under
``hpo.run`` write it (group commits), and directly under its file lock, as a
worker that cannot reach the relay does.

Sizes: the journal runs the full 8 x 2,000 (15 to 30 s on 2 cores). SQLite
commits and fsyncs every write (about 300 writes/s on a local disk, 100 to
150 s at full size), so it runs 8 x 500 here; ``HPO_CONCURRENCY_REPORTS=2000``
runs it at full size, as ``bench/store_ingest.py`` always does (and it checks
the counts too).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import sqlite3
import time
import traceback
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import optuna
import pytest

from hpo.store import StudyStore, open_storage
from hpo.store._relay import RELAY_MARK, serve_journal
from hpo.trial import TrialTask, open_trial
from hpo.store.records import REPORT_ATTR

PROCS = 8
FULL = 2000
_SIZE = {"relay": FULL, "journal": FULL, "sqlite": 500}
_ENV_SIZE = os.environ.get("HPO_CONCURRENCY_REPORTS")
STUDY = "concurrent"
METRIC = "value"
_START_TIMEOUT_S = 120  # spawning 8 interpreters on 2 busy cores
_RUN_TIMEOUT_S = 240


def expected_metrics(number: int, step: int) -> dict[str, float]:
    """What trial ``number`` reports at ``step``: distinct per (trial, step), and
    ``loss`` is no short binary fraction, so any rounding on the way shows."""
    return {METRIC: number * 100_000 + step + 0.375, "loss": 1.0 / (3 * step + number + 1)}


def _writer(url: str, trial_id: int, number: int, reports: int,
            ready, go, result_file: str) -> None:
    """One worker process: report steps 0..reports-1 of its trial, as a trial task would."""
    done, error = 0, None
    try:
        task = TrialTask(storage=url, study_name=STUDY, trial_id=trial_id, number=number,
                         config={"writer": number}, objective="none:none", metric=METRIC,
                         checkpoint_dir=str(Path(result_file).with_suffix(".ckpt")))
        trial = open_trial(task)
        ready.release()
        if not go.wait(_START_TIMEOUT_S):
            raise TimeoutError("never told to start")
        for step in range(reports):
            trial.report(step, **expected_metrics(number, step))
            done += 1
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        error = traceback.format_exc()
    Path(result_file).write_text(json.dumps({"pid": os.getpid(), "done": done, "error": error}))


def _dump(url: str, out_file: str) -> None:
    """In a fresh process: replay the store and dump every trial's reports."""
    storage = open_storage(url)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    dump = {
        t.number: {
            "state": t.state.name,
            "intermediate": dict(t.intermediate_values),
            "reports": {k: v for k, v in t.system_attrs.items() if k.startswith(REPORT_ATTR)},
        }
        for t in study.get_trials(deepcopy=False)
    }
    Path(out_file).write_bytes(pickle.dumps(dump))


def _check_prefix(trial: optuna.trial.FrozenTrial, reports: int, seen: dict[int, int]) -> None:
    """A snapshot read while writing: steps 0..k-1 and nothing else, values exact.
    ``seen`` holds how many steps of each trial earlier snapshots checked: a
    step once seen must stay, and only the new ones are compared."""
    values = trial.intermediate_values
    keys = [k for k in trial.system_attrs if k.startswith(REPORT_ATTR)]
    assert len(values) <= reports and len(keys) <= reports
    assert len(values) >= seen.get(trial.number, 0), "a report seen earlier disappeared"
    for step in range(seen.get(trial.number, 0), len(values)):
        value = values.get(step)
        assert value == expected_metrics(trial.number, step)[METRIC], (step, value)
        if step < len(keys):
            attr = trial.system_attrs.get(f"{REPORT_ATTR}{step:06d}")
            assert attr == expected_metrics(trial.number, step), (step, attr)
    seen[trial.number] = len(values)


def _run_writers(url: str, reports: int, tmp: Path) -> tuple[list[optuna.Trial], int]:
    """Start PROCS writers at once; poll the study like the master meanwhile.
    Returns the trials as created and how many snapshots were checked."""
    storage = open_storage(url)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    created = [study.ask() for _ in range(PROCS)]
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    writers = [
        ctx.Process(target=_writer, name=f"writer-{t.number}", args=(
            url, StudyStore.trial_id(t), t.number, reports, ready, go,
            str(tmp / f"writer-{t.number}.json")))
        for t in created
    ]
    for writer in writers:
        writer.start()
    snapshots, seen = 0, {}
    try:
        for _ in writers:
            assert ready.acquire(timeout=_START_TIMEOUT_S), "a writer did not start"
        go.set()
        deadline = time.monotonic() + _RUN_TIMEOUT_S
        while any(w.is_alive() for w in writers) and time.monotonic() < deadline:
            for trial in StudyStore.of(study).trials():
                _check_prefix(trial, reports, seen)
            snapshots += 1
            time.sleep(0.5)
        for writer in writers:
            writer.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        go.set()
        for writer in writers:
            if writer.is_alive():  # only our own children, by their handle
                writer.kill()
                writer.join()
    for writer in writers:
        result = json.loads((tmp / f"{writer.name}.json").read_text())
        assert result["error"] is None, f"{writer.name} failed:\n{result['error']}"
        assert writer.exitcode == 0 and result["done"] == reports, (writer.exitcode, result)
    return created, snapshots


def _fresh_dump(url: str, tmp: Path) -> dict:
    ctx = mp.get_context("spawn")
    out = tmp / "dump.pickle"
    reader = ctx.Process(target=_dump, args=(url, str(out)))
    reader.start()
    reader.join(timeout=_RUN_TIMEOUT_S)
    if reader.is_alive():
        reader.kill()
        reader.join()
    assert reader.exitcode == 0, "replaying the store in a fresh process failed"
    return pickle.loads(out.read_bytes())


def _check_journal_file(path: Path, trial_ids: dict[int, int], reports: int) -> None:
    """Every line whole JSON; each report written exactly once."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    writes: Counter = Counter()
    for line in raw.splitlines():
        log = json.loads(line)  # a torn or interleaved line fails here
        if "intermediate_value" in log:
            writes[("value", log["trial_id"], log["step"])] += 1
            assert log["intermediate_value"] == \
                expected_metrics(trial_ids[log["trial_id"]], log["step"])[METRIC]
        elif "system_attr" in log:
            (key, value), = log["system_attr"].items()
            step = int(key.removeprefix(REPORT_ATTR))
            writes[("report", log["trial_id"], step)] += 1
            assert value == expected_metrics(trial_ids[log["trial_id"]], step)
    wanted = {(kind, tid, s) for kind in ("value", "report") for tid in trial_ids
              for s in range(reports)}
    assert set(writes) == wanted
    repeated = {k: n for k, n in writes.items() if n != 1}
    assert not repeated, f"written more than once: {sorted(repeated)[:5]}"
    # Each writer's reports land in the order it made them.
    order = [(kind, tid, step) for kind, tid, step in writes]  # insertion order: file order
    for tid in trial_ids:
        steps = [step for kind, t, step in order if t == tid and kind == "value"]
        assert steps == sorted(steps), f"trial id {tid}: reports out of order"


def _check_sqlite_file(path: Path, trial_ids: dict[int, int], reports: int) -> None:
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        values = db.execute("SELECT trial_id, step, COUNT(*) FROM trial_intermediate_values "
                            "GROUP BY trial_id, step").fetchall()
        attrs = db.execute("SELECT trial_id, key, COUNT(*) FROM trial_system_attributes "
                           "WHERE key LIKE 'hpo:report:%' GROUP BY trial_id, key").fetchall()
    assert {(t, s) for t, s, _ in values} == {(t, s) for t in trial_ids for s in range(reports)}
    assert {(t, k) for t, k, _ in attrs} == \
        {(t, f"{REPORT_ATTR}{s:06d}") for t in trial_ids for s in range(reports)}
    assert all(n == 1 for *_, n in values + attrs), "a row written more than once"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("store", ["relay", "journal", "sqlite"])
def test_concurrent_writers_lose_nothing(tmp_path, store):
    reports = int(_ENV_SIZE) if _ENV_SIZE else _SIZE[store]
    path = tmp_path / ("study.db" if store == "sqlite" else "journal.log")
    url = f"sqlite:///{path}" if store == "sqlite" else str(path)

    with serve_journal(url) if store == "relay" else nullcontext(url) as writers_url:
        assert (RELAY_MARK in writers_url) == (store == "relay")
        created, snapshots = _run_writers(writers_url, reports, tmp_path)
    assert snapshots >= 1

    dump = _fresh_dump(url, tmp_path)
    assert sorted(dump) == [t.number for t in created]
    for number, trial in dump.items():
        assert trial["state"] == "RUNNING"
        assert trial["intermediate"] == {
            s: expected_metrics(number, s)[METRIC] for s in range(reports)}
        assert trial["reports"] == {
            f"{REPORT_ATTR}{s:06d}": expected_metrics(number, s) for s in range(reports)}

    trial_ids = {StudyStore.trial_id(t): t.number for t in created}
    if store != "sqlite":
        _check_journal_file(path, trial_ids, reports)
    else:
        _check_sqlite_file(path, trial_ids, reports)
