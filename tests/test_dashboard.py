"""The dashboard's data, views, leaderboard, report and commands, without a browser.

Studies are real runs of the toy objectives on the inline engine (a fraction of
a second each); the synthetic study of ``hpo.dashboards.synthetic`` adds what
small real runs do not produce: retried attempts, suspended segments, many
workers, running trials.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np
import optuna
import plotly.graph_objects as go
import pytest

import hpo
from hpo.dashboards import (
    analysis, commands, compare, edf, figures, importance, leaderboard, parallel, rank, studies, timeline,
    trial_page, views,
)
from hpo.dashboards.data import StoreReader, load_snapshot
from hpo.dashboards.report import build_report
from hpo.dashboards.synthetic import write_study
from hpo.dashboards.style import STATE_COLOURS
from hpo.dashboards.views import VIEWS, summary
from hpo.store import RunDir, StudyStore
from hpo.store.records import RUN_ATTR
from hpo.units import format_resource_time
from conftest import ROOT, toy_space

XSS = "<script>window.__xss=1</script><img src=x onerror=window.__xss=2>"
_SCRIPT = Path(sys.executable).parent / "hpo"
HPO = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "hpo"]


def real_study(runs_dir: Path, name: str, pruned: bool = False, **search) -> Path:
    """A real study of the toy quadratic (6 reported steps per trial), with a
    categorical parameter whose second choice is HTML with script in it."""
    extra = {"early_stopping": {"pruner": "median", "min_steps": 3}} if pruned else {}
    space = toy_space(name, space={"x": [0, 1, 2, 3, 4, 5], "y": [-1, 0, 1], "tag": ["plain", XSS]},
                      fixed={"steps": 6}, search=search, **extra)
    hpo.run(space, engine="inline", runs_dir=runs_dir, progress=False)
    return Path(runs_dir) / name


def rich(config: dict, trial) -> dict:
    """A training-like objective for the views: a log learning rate, a numeric
    categorical batch size, two metrics per step, curves that diverge when the
    rate is too high, a failure with a traceback, and output for the trial's log."""
    lr, batch, opt = float(config["lr"]), int(config["batch"]), str(config["opt"])
    quality = 1.0 - abs(np.log10(lr) + 2.0) / 4 - batch / 1000
    loss = 1.0
    for step in range(8):
        loss = 1e3 * 3.0 ** step if lr > 0.3 else (1.0 - quality) + 1.0 / (step + 1)
        accuracy = max(0.0, 1.0 - loss / 2)
        print(f"step {step}: loss {loss:.4f} accuracy {accuracy:.4f}")
        if opt == "sgd" and batch == 128 and step == 1:
            raise FloatingPointError(f"loss is nan at step {step} (sgd with batch {batch})")
        trial.report(step, accuracy=accuracy, loss=loss)
        if trial.should_stop():
            break
    return {"accuracy": accuracy, "loss": loss}


def rich_space(name: str, trials: int = 30) -> dict:
    return {"name": name, "objective": "test_dashboard:rich",
            "metric": {"name": "accuracy", "direction": "maximize"},
            "search": {"algorithm": "random", "max_trials": trials, "seed": 7, "parallel": 2},
            "early_stopping": {"pruner": "median", "min_steps": 3},
            "space": {"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
                      "batch": [16, 32, 64, 128], "opt": ["adam", "sgd", XSS]}}


@pytest.fixture(scope="module")
def rich_study(tmp_path_factory) -> Path:
    """30 trials: completed, pruned, failed (with tracebacks), two diverged."""
    runs = tmp_path_factory.mktemp("runs")
    hpo.run(rich_space("rich"), engine="inline", runs_dir=runs, progress=False)
    return runs / "rich"


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """36 completed trials (the whole grid)."""
    return real_study(tmp_path_factory.mktemp("runs"), "grid")


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> Path:
    """Random search with the median pruner: most trials pruned, with events."""
    return real_study(tmp_path_factory.mktemp("runs"), "pruned", pruned=True,
                      algorithm="random", max_trials=20, seed=3)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("runs") / "syn", 400, workers=6, seed=1,
                       extra_choice=XSS)


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def figure_text(fig: go.Figure) -> str:
    return fig.to_json()


# ------------------------------------------------------------------ snapshot

def test_snapshot_holds_every_trial_as_hpo_status_ranks_them(grid):
    snap = load_snapshot(grid)
    result = hpo.results.StudyResult.load(grid)
    assert len(snap.trials) == 36 and snap.metric == "value" and snap.direction == "maximize"
    assert [t.number for t in snap.ranked] == [t.number for t in result.ranked()]
    best = snap.ranked[0]
    assert best.params["x"] == 2 and best.params["y"] == -1 and best.value == 0.0
    assert [step for step, _ in best.reports] == list(range(6))
    assert best.reports[-1][1]["value"] == best.value
    assert best.pid == os.getpid() and best.cpus == 1 and best.worker.endswith(f":{os.getpid()}")
    assert snap.param_names == ["tag", "x", "y"]  # the normalised space's order


def test_reading_never_writes_to_the_store(grid, tmp_path):
    before = files_of(grid)
    reader = StoreReader(grid)
    reader.snapshot()
    build_report(reader.snapshot())
    assert files_of(grid) == before  # no lock file, no new line, nothing created


def test_a_refresh_rereads_only_when_the_store_changed_and_reuses_finished_trials(tmp_path):
    run_dir = real_study(tmp_path, "live", algorithm="random", max_trials=6, seed=1)
    reader = StoreReader(run_dir)
    first = reader.snapshot()
    assert reader.snapshot() is first  # unchanged store: the same snapshot, nothing re-read
    hpo.run(toy_space("live", space={"x": [0, 1, 2, 3, 4, 5], "y": [-1, 0, 1],
                                     "tag": ["plain", XSS]}, fixed={"steps": 6},
                      search={"algorithm": "random", "max_trials": 9, "seed": 1}),
            engine="inline", runs_dir=tmp_path, progress=False)
    second = reader.snapshot()
    assert second is not first and len(second.trials) == 9 and second.version != first.version
    assert all(a is b for a, b in zip(first.trials, second.trials))  # finished: built once


def test_a_running_trial_is_shown_finished_once_it_finishes(grid, tmp_path):
    run_dir = tmp_path / "grid"
    shutil.copytree(grid, run_dir)
    reader = StoreReader(run_dir)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(run_dir / "journal.log")))
    study = optuna.load_study(study_name="grid", storage=storage)
    trial = study.ask()
    storage.set_trial_system_attr(StudyStore.trial_id(trial), RUN_ATTR,
                                {"host": "h", "pid": 1, "started_at": 1.0})
    assert reader.snapshot().trials[-1].state is hpo.TrialStatus.RUNNING
    study.tell(trial, -3.0)
    last = reader.snapshot().trials[-1]
    assert last.state is hpo.TrialStatus.COMPLETE and last.value == -3.0


def test_missing_or_wrong_run_directories_are_usage_errors(tmp_path):
    with pytest.raises(hpo.errors.UsageError, match="no such directory"):
        StoreReader(tmp_path / "nope")
    with pytest.raises(hpo.errors.UsageError, match="not a run directory"):
        StoreReader(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps(
        {"spec": {"name": "s", "metric": {"name": "loss"}, "space": {"x": [1]}}, "storage": "journal.log"}))
    with pytest.raises(hpo.errors.UsageError, match="journal .* is missing"):
        StoreReader(tmp_path)
    assert not (tmp_path / "journal.log").exists()  # refused, not created


# ------------------------------------------------------------------ views

def test_every_view_draws_the_real_study(grid):
    snap = load_snapshot(grid)
    for view in VIEWS:
        fig = view.figure(snap)
        assert isinstance(fig, go.Figure) and fig.data, view.key
    history = figures.history(snap)
    best_line = next(t for t in history.data if t.name == "best so far")
    assert list(best_line.y) == sorted(best_line.y) and best_line.y[-1] == 0.0  # never worse
    assert len(history.data[0].x) == 36
    parallel = figures.parallel(snap).data[0]
    assert [d.label for d in parallel.dimensions] == ["tag", "x", "y", "value"]
    importance = analysis.importance(snap).data[0]
    assert isinstance(importance, go.Bar) and set(importance.y) == {"x", "y", "tag"}
    # x and y decide the value, tag does nothing.
    scores = dict(zip(importance.y, importance.x))
    assert scores["tag"] < min(scores["x"], scores["y"])
    assert len(timeline.timeline(snap).data[0].y) == 36  # one bar per trial


def test_user_text_is_shown_as_text_in_every_figure(grid, synthetic):
    for snap in (load_snapshot(grid), load_snapshot(synthetic)):
        for view in VIEWS:
            text = figure_text(view.figure(snap))
            # Only the parallel coordinates' tick text (drawn literally by Plotly) keeps it raw.
            if view.key != "parallel":
                assert "<script" not in text and "<img" not in text, view.key
        tick = [d for d in figures.parallel(snap).data[0].dimensions if d.label in ("tag", "optimizer")]
        assert any(t.startswith("<script>") for t in tick[0].ticktext)


def test_importance_is_drawn_from_a_handful_of_trials_with_its_uncertainty(tmp_path):
    few = load_snapshot(real_study(tmp_path, "few", algorithm="random", max_trials=3, seed=0))
    fig = analysis.importance(few)
    assert not fig.data and "at least 4 completed trials; 3 so far" in fig.layout.annotations[0].text
    handful = load_snapshot(real_study(tmp_path, "handful", algorithm="random", max_trials=8, seed=0))
    bar = analysis.importance(handful).data[0]
    # x decides the quadratic most; each bar carries its spread over the resamples.
    assert bar.y[-1] == "x" and len(bar.error_x.array) == 3 and max(bar.error_x.array) > 0
    assert "rough hint" in analysis.importance(handful).layout.title.text


def test_an_empty_study_draws_messages_not_errors(tmp_path):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(run_dir / "journal.log")))
    optuna.create_study(study_name="empty", storage=storage, direction="minimize")
    (run_dir / "study.json").write_text(json.dumps(
        {"spec": {"name": "empty", "metric": {"name": "loss"}, "space": {"x": [1]}},
         "storage": "journal.log"}))
    snap = load_snapshot(run_dir)
    for view in VIEWS:
        fig = view.figure(snap)
        assert not fig.data and fig.layout.annotations, view.key
    assert "0 trials" in summary(snap) and "<table" in build_report(snap)


def test_learning_curves_mark_pruned_trials_where_they_were_pruned(pruned):
    snap = load_snapshot(pruned)
    were_pruned = [t for t in snap.trials if t.state is hpo.TrialStatus.PRUNED]
    assert were_pruned and all(e["kind"] == "pruned" for t in were_pruned for e in t.events)
    fig = figures.curves(snap)
    marks = next(t for t in fig.data if t.name == "pruned here")
    expected = {(t.number, t.events[0]["step"]) for t in were_pruned}
    assert set(zip(marks.customdata, marks.x)) == expected


def test_timeline_draws_segments_retries_and_running_trials(synthetic):
    snap = load_snapshot(synthetic)
    fig = timeline.timeline(snap)
    names = {trace.name for trace in fig.data}
    assert {"complete", "suspended", "retried attempt", "running", "pruned"} <= names
    iv = timeline.intervals(snap)
    segmented = [t for t in snap.trials if t.segments]
    retried = [t for t in snap.trials if t.previous]
    assert segmented and retried
    assert len(iv.start) == len(snap.trials) + len(segmented) + len(retried)  # 2 segments each
    running = [i for i, k in enumerate(iv.kind) if k == "RUNNING"]
    assert running and all(iv.end[i] == snap.taken_at for i in running)


def test_timeline_is_binned_beyond_its_bar_limit(synthetic, monkeypatch):
    monkeypatch.setattr(timeline, "MAX_BARS", 50)
    snap = load_snapshot(synthetic)  # a new snapshot: nothing memoised
    fig = timeline.timeline(snap)
    assert len(fig.data) == 1 and isinstance(fig.data[0], go.Heatmap)
    assert fig.data[0].z.shape == (len(set(timeline.intervals(snap).row)), timeline.TIME_BINS)


def test_busy_time_per_bin_is_exact():
    busy = timeline._busy_per_bin(np.array([0.0, 5.0]), np.array([10.0, 15.0]),
                                  np.array([0.0, 5.0, 10.0, 15.0, 20.0]))
    assert busy.tolist() == [5.0, 10.0, 5.0, 0.0]


def test_cost_adds_up_recorded_running_and_retried_hours(synthetic):
    snap = load_snapshot(synthetic)
    spent = timeline.cost(snap)
    # core_seconds holds every attempt; earlier attempts are counted once, as retried.
    recorded = sum(t.core_seconds for t in snap.trials)
    running = sum((snap.taken_at - t.started_at) * t.cpus for t in snap.trials if t.ended_at is None)
    retried = sum((p["ended_at"] - p["started_at"]) * t.cpus for t in snap.trials for p in t.previous)
    assert spent["core_hours"] == pytest.approx((recorded + running) / 3600)
    assert spent["retried_core_hours"] == pytest.approx(retried / 3600) and retried > 0
    assert spent["pruned_core_hours"] == pytest.approx(sum(
        t.core_seconds - t.cost.retried_core_seconds for t in snap.trials
        if t.state is hpo.TrialStatus.PRUNED) / 3600)
    assert spent["gpu_hours"] > 0
    fig = timeline.utilisation(snap)
    # One precision and unit everywhere: the same text as `hpo status` prints.
    text = format_resource_time(spent["core_hours"])
    assert text.endswith("core-hours")
    assert text in fig.layout.title.text and text in summary(snap)
    slots = next(t for t in fig.data if str(t.name).startswith("available slots"))
    assert list(slots.y) == [6, 6]  # search.parallel


def test_cost_of_a_small_study_is_shown_in_a_unit_that_fits(grid):
    snap = load_snapshot(grid)
    spent = timeline.cost(snap)
    assert spent["core_hours"] < 1 / 60 and "core-seconds" in summary(snap)
    fig = timeline.utilisation(snap)
    assert format_resource_time(spent["core_hours"]) in fig.layout.title.text
    bars = next(t for t in fig.data if t.name == "core-seconds")  # not 0.00 core-hours
    assert max(bars.y) == pytest.approx(max(spent["core_hours_by"].values()) * 3600)


# ------------------------------------------------------------------ leaderboard

def test_leaderboard_rows_sort_and_filter_on_the_server(grid):
    snap = load_snapshot(grid)
    table = leaderboard.rows(snap)
    cols = {c["id"]: c["name"] for c in leaderboard.columns(snap)}
    tag = next(i for i, n in cols.items() if n == "tag")
    assert [r["rank"] for r in table] == list(range(1, 37)) and table[0]["value"] == 0.0
    by_trial = leaderboard.query(table, [{"column_id": "trial", "direction": "desc"}])
    assert [r["trial"] for r in by_trial] == list(range(35, -1, -1))
    two_keys = leaderboard.query(table, [{"column_id": "param_1", "direction": "asc"},
                                         {"column_id": "value", "direction": "desc"}])
    assert [(r["param_1"], -r["value"]) for r in two_keys] == sorted(
        (r["param_1"], -r["value"]) for r in table)
    assert len(leaderboard.query(table, filter_query=f"{{{tag}}} contains script")) == 18
    assert len(leaderboard.query(table, filter_query="{value} >= -1 && {state} scontains COMPLETE")) == 8
    assert len(leaderboard.query(table, filter_query='{param_1} = 2')) == 6
    # What the table's filter row sends for "<= -4" typed under a numeric column.
    assert len(leaderboard.query(table, filter_query="{value} s<= -4")) == 24
    with pytest.raises(ValueError, match="not understood"):
        leaderboard.query(table, filter_query="value > 1")


def test_html_table_escapes_every_cell(grid):
    text = leaderboard.html_table(load_snapshot(grid), limit=10)
    assert "<script" not in text and "&lt;script&gt;window.__xss=1&lt;/script&gt;" in text
    assert text.count("<tr>") == 11 and "The best 10 of 36 trials" in text


# ------------------------------------------------------------------ report and commands

def test_report_is_self_contained_with_plotly_once(grid):
    text = build_report(load_snapshot(grid))
    assert text.count("plotly.js v") == 1  # the library's banner: embedded once
    # Nothing to fetch: no script, style sheet or image loaded from anywhere.
    assert not re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=", text)
    assert text.count('class="plotly-graph-div"') == len(VIEWS)
    assert "<script>window.__xss" not in text and "<img src=x" not in text


def hpo_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*HPO, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_report_command_writes_the_file(grid, tmp_path):
    out = tmp_path / "sub" / "report.html"
    proc = hpo_cli("report", grid, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1_000_000 and "Study grid" in out.read_text()


@pytest.mark.parametrize("command", ["dashboard", "report"])
def test_commands_refuse_a_missing_run_directory_with_status_2(command, tmp_path):
    proc = hpo_cli(command, tmp_path / "missing")
    assert proc.returncode == 2
    assert "hpo: error:" in proc.stderr and "no such directory" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_dashboard_refuses_a_bad_port(grid):
    proc = hpo_cli("dashboard", grid, "--port", "70000")
    assert proc.returncode == 2 and "not a port" in proc.stderr


def test_the_run_record_carries_what_the_views_read(grid):
    # The fields the timeline and cost views rely on, as the trial wrapper writes them.
    frozen = RunDir(grid).open_store(read_only=True).trials()[0]
    run = frozen.system_attrs[RUN_ATTR]
    assert {"host", "pid", "cpus", "gpus", "started_at", "ended_at", "core_seconds",
            "previous"} <= set(run)


# ------------------------------------------------------------------ issue 16: the new views

def test_report_goes_to_the_run_directory_and_is_never_overwritten_without_force(grid, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(grid, run_dir)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    first = subprocess.run([*HPO, "report", str(run_dir)], cwd=elsewhere, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    written = run_dir / "report.html"
    assert written.exists() and not (elsewhere / "report.html").exists()
    written.write_text("mine")
    again = subprocess.run([*HPO, "report", str(run_dir)], cwd=elsewhere, capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr and "--force" in again.stderr
    assert written.read_text() == "mine"
    forced = subprocess.run([*HPO, "report", str(run_dir), "--force"], cwd=elsewhere,
                            capture_output=True, text=True)
    assert forced.returncode == 0 and "Study grid" in written.read_text()


def test_dashboard_refuses_a_port_in_use_before_printing_a_url(grid):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = hpo_cli("dashboard", grid, "--port", str(port))
    assert proc.returncode == 2 and f"--port {port}: already in use" in proc.stderr
    assert "open http" not in proc.stderr and "fix:" in proc.stderr


def test_the_dashboard_says_its_url_once_and_stops_quietly(grid):
    """No Dash or Flask banner repeating the URL, no "resume" advice on SIGTERM."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*HPO, "dashboard", str(grid), "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert out == "", out
    assert err.count(f"http://127.0.0.1:{port}/") == 1, err
    assert "Serving Flask" not in err + out and "interrupted" not in err and "Traceback" not in err


def test_the_page_frame_is_built_before_the_store_is_read(grid):
    """hpo dashboard serves the page while it reads the store: title, tabs and
    columns come from the study's settings alone."""
    from hpo.dashboards.app import make_app

    reader = StoreReader(grid, read_now=False)
    app = make_app(reader)
    assert reader._store is None  # nothing read yet
    frame = {c["name"]: c["type"] for c in leaderboard.columns(reader.outline())}
    read = {c["name"]: c["type"] for c in leaderboard.columns(reader.snapshot())}
    assert frame == read  # the columns the first page brings are those of the frame
    assert app.title == "hpo: grid"


def test_a_damaged_store_ends_the_dashboard_with_the_fix_after_its_url(grid, tmp_path):
    run_dir = tmp_path / "grid"
    shutil.copytree(grid, run_dir)
    journal = run_dir / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:5]) + b"garbage\n" + b"".join(lines[5:]))
    proc = hpo_cli("dashboard", run_dir, "--port", str(_free_port()))
    assert proc.returncode == 2, proc.stderr
    assert "damaged at byte" in proc.stderr and "fix: hpo repair" in proc.stderr
    assert "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_port_the_dashboard_takes_the_next_free_one():
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", commands.DEFAULT_PORT))
            held.listen()
        except OSError:
            pass  # already taken by someone else: the same situation
        port = commands._port("127.0.0.1", None)
        assert port != commands.DEFAULT_PORT
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # it is free


def test_trial_page_shows_the_traceback_events_attempts_checkpoint_and_log(rich_study):
    snap = load_snapshot(rich_study)
    failed = next(t for t in snap.trials if t.state is hpo.TrialStatus.FAILED)
    found = trial_page.details(snap, failed.number)
    assert found.rank is None and found.checkpoint_dir == RunDir(rich_study).checkpoint_dir(failed.number)
    assert "Traceback (most recent call last)" in found.attempts[-1]["traceback"]
    assert 'raise FloatingPointError' in found.attempts[-1]["traceback"]
    # The trial's log (what the objective printed) from its checkpoint directory.
    assert [name for name, _ in found.logs] == ["output.log"] and "step 0: loss" in found.logs[0][1]
    text = str(trial_page.page(snap, failed.number))
    assert "FloatingPointError: loss is nan at step 1" in text and "step 0: loss" in text
    pruned = next(t for t in snap.trials if t.state is hpo.TrialStatus.PRUNED)
    page = str(trial_page.page(snap, pruned.number))
    reason = next(e["reason"] for e in pruned.events if e["kind"] == "pruned")
    assert reason and reason in page and "trial-events" in page
    fig = trial_page.metrics_figure(pruned)
    assert [a.text for a in fig.layout.annotations][:2] == ["accuracy", "loss"]
    assert "not in this study" in str(trial_page.page(snap, 999))


def test_leaderboard_ranks_only_completed_trials_and_shows_whole_errors(rich_study):
    snap = load_snapshot(rich_study)
    table = leaderboard.rows(snap)
    for row in table:
        assert (row["rank"] is not None) == (row["state"] == "COMPLETE")
    failed = [r for r in table if r["state"] == "FAILED"]
    tips = leaderboard.tooltips(snap, failed)
    assert all("FloatingPointError: loss is nan" in tip["error"]["value"] for tip in tips)


def test_history_shows_pruned_and_failed_trials_with_a_log_option(rich_study):
    fig = figures.history(load_snapshot(rich_study))
    names = {t.name: t for t in fig.data}
    assert names["pruned (value when ended)"].visible in (None, True)
    assert len(names["failed (no value)"].x) == 4
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["linear y", "log y"]


def test_parallel_coordinates_use_log_ticks_and_categories(rich_study):
    fig = figures.parallel(load_snapshot(rich_study))
    dims = {d.label: d for d in fig.data[0].dimensions}
    lr, batch = dims["lr"], dims["batch"]
    assert list(lr.ticktext)[:1] and set(lr.ticktext) <= {f"{m * 10.0 ** e:g}" for e in range(-4, 1)
                                                          for m in (1, 2, 5)}
    assert np.allclose([10 ** v for v in lr.tickvals], [float(x) for x in lr.ticktext])
    assert list(batch.ticktext) == ["16", "32", "64", "128"]
    # The pruned trials can be added, at the value they ended with.
    assert len(fig.data) == 2 and fig.data[1].visible is False
    assert len(fig.data[1].dimensions[-1]["values"]) > len(fig.data[0].dimensions[-1]["values"])


def test_learning_curves_offer_every_metric_and_a_range_divergence_cannot_flatten(rich_study):
    fig = figures.curves(load_snapshot(rich_study))
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels == ["accuracy", "accuracy, log y", "loss", "loss, log y"]
    loss = fig.layout.updatemenus[0].buttons[2].args[1]
    # Two trials diverge to 1e6: the loss range still fits the others.
    diverged = max(y for t in fig.data if t.y for y in t.y if y is not None)
    assert diverged > 1e5 and loss["yaxis.range"][1] < 10
    highlights = {t.line.color for t in fig.data if str(t.name).startswith("best #")}
    assert highlights and not highlights & set(STATE_COLOURS.values())


def test_slices_and_contour_draw_each_parameter_in_its_kind(rich_study):
    snap = load_snapshot(rich_study)
    slices = analysis.slices(snap)
    assert len(slices.data) == 3
    axes = {slices.layout[f"xaxis{'' if i == 1 else i}"].type for i in (1, 2, 3)}
    assert "log" in axes
    contour = analysis.contour(snap)
    buttons = contour.layout.updatemenus[0].buttons
    assert len(buttons) == 3 and any(isinstance(t, go.Contour) for t in contour.data)


def test_timeline_shows_instant_failures_and_what_each_trial_was(rich_study):
    snap = load_snapshot(rich_study)
    fig = timeline.timeline(snap)
    failed = next(t for t in fig.data if t.name == "failed")
    span = max(t.ended_at for t in snap.trials) - min(t.started_at for t in snap.trials)
    assert min(failed.x) >= span * timeline.MIN_BAR_FRACTION * 1000 * 0.999
    assert "lr=" in failed.customdata[0][2] and "batch=128" in failed.customdata[0][2]


def test_a_filter_comparing_a_number_column_with_text_is_refused_with_a_reason(grid):
    snap = load_snapshot(grid)
    cols = leaderboard.columns(snap)
    # What the table sends for "abc >" typed under the value column.
    with pytest.raises(ValueError, match="value: 'abc >' is not a number"):
        leaderboard.query(leaderboard.rows(snap), None, '{value} s= "abc >"', cols)
    assert len(leaderboard.query(leaderboard.rows(snap), None, "{value} s> -2", cols)) > 0


def test_report_holds_each_failure_with_its_whole_traceback(rich_study):
    text = build_report(load_snapshot(rich_study))
    section = text[text.index('<section id="failures">'):]
    assert section.count("<details>") == 4 and "FloatingPointError: loss is nan at step 1" in section
    assert "Traceback (most recent call last)" in section and "<script>window" not in section
    for view in VIEWS:
        assert f'id="plot-{view.key}"' in text


# ------------------------------------------------------------------ sampling

def _best_numbers(snap, count: int) -> set[int]:
    return {t.number for t in figures.completed(snap)[:count]}


def test_big_studies_send_a_sample_with_the_best_trials_and_say_so(synthetic, monkeypatch):
    monkeypatch.setattr(figures, "MAX_HISTORY_POINTS", 50)
    monkeypatch.setattr(parallel, "MAX_PARALLEL_LINES", 40)
    monkeypatch.setattr(analysis, "MAX_SLICE_POINTS", 30)
    monkeypatch.setattr(analysis, "MAX_CONTOUR_POINTS", 20)
    snap = load_snapshot(synthetic)  # a new snapshot: nothing memoised
    total = len(figures.completed(snap))
    assert total > 100

    history = figures.history(snap)
    points = history.data[0]
    assert len(points.x) == 50
    assert _best_numbers(snap, 5) <= set(int(x) for x in points.x)
    assert f"showing 50 of {total} completed trials" in history.layout.title.text
    best_line = next(t for t in history.data if t.name == "best so far")
    best = figures.completed(snap)[0]
    assert best.value in list(best_line.y)  # the best-so-far line stays exact

    lines = figures.parallel(snap)
    metric = lines.data[0].dimensions[-1].values
    assert len(metric) == 40
    assert max(metric) == best.value if snap.maximize else min(metric) == best.value
    assert f"showing 40 of {total} completed trials" in lines.layout.title.text

    slices = analysis.slices(snap)
    assert {len(t.x) for t in slices.data} == {30}
    assert set(_best_numbers(snap, 3)) <= set(int(n) for n in slices.data[0].customdata)
    assert f"showing 30 of" in slices.layout.title.text

    contour = analysis.contour(snap)
    dots = [t for t in contour.data if t.type == "scatter" and t.visible][0]
    assert len(dots.x) == 20 and best.value in list(dots.customdata)
    assert f"mean of the {total} completed trials" in contour.layout.title.text


def test_small_studies_send_every_trial(rich_study):
    snap = load_snapshot(rich_study)
    total = len(figures.completed(snap))
    history = figures.history(snap)
    assert len(history.data[0].x) == total
    assert "showing" not in history.layout.title.text
    parallel = figures.parallel(snap)
    assert len(parallel.data[0].dimensions[-1].values) == total
    assert "showing" not in parallel.layout.title.text
    assert "showing" not in analysis.slices(snap).layout.title.text


def test_sample_keeps_the_best_and_spreads_the_rest():
    class T:
        def __init__(self, number: int) -> None:
            self.number = number

    ranked = [T(n) for n in range(1000)][::-1]  # best first: the highest numbers
    chosen = figures.sample(ranked, 100)
    assert len(chosen) == 100
    assert {t.number for t in ranked[:10]} <= {t.number for t in chosen}
    assert min(t.number for t in chosen) < 50  # the rest spans the study, not just its end
    assert figures.sample(ranked[:30], 100) == ranked[:30]


def test_the_dashboard_writes_its_views_snapshot_after_serving(tmp_path, monkeypatch):
    import hpo.dashboards.data as data

    monkeypatch.setattr(data, "VIEWS_EVERY", 50)
    run_dir = write_study(tmp_path / "syn", 120, workers=3, seed=2)
    reader = StoreReader(run_dir, views_later_s=0.2)
    reader.snapshot()
    assert not (run_dir / "journal.log.views").exists()  # not before the first view
    deadline = time.monotonic() + 30
    while not (run_dir / "journal.log.views").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run_dir / "journal.log.views").is_file()


# ------------------------------------------------------------------ issue 28, part 3

@pytest.fixture(scope="module")
def conditional(tmp_path_factory) -> Path:
    """A synthetic study with ``l1_ratio`` set only in the sgd trials, where it decides much."""
    return write_study(tmp_path_factory.mktemp("runs") / "cond", 300, workers=4, seed=5,
                       conditional=True, name="cond")


@pytest.fixture(scope="module")
def three_objectives(tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("runs") / "tri", 120, workers=4, seed=6,
                       objectives=3, name="tri")


def test_run_dirs_stand_for_each_study_named_or_inside_a_runs_directory(tmp_path):
    runs = tmp_path / "runs"
    for name in ("beta", "alpha"):
        write_study(runs / name, 10, workers=2, name=name)
    (runs / "notes").mkdir()  # not a study: left out
    assert studies.run_dirs([runs]) == [runs / "alpha", runs / "beta"]
    assert studies.run_dirs([runs / "beta", runs / "alpha", runs / "beta"]) == [runs / "beta", runs / "alpha"]
    assert studies.run_dirs([runs / "notes"]) == [runs / "notes"]  # the reader says what is wrong
    assert studies.labels(["a", "b", "a"], [Path("x/a"), Path("x/b"), Path("y/a")]) == \
        ["a (x/a)", "b", "a (y/a)"]


def test_compare_draws_each_studys_exact_best_so_far_and_distribution(grid, synthetic):
    snaps = (load_snapshot(grid), load_snapshot(synthetic))
    fig = compare.compare(snaps, ("grid", "syn"))
    best = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name for t in best] == ["grid", "syn"]
    for trace, snap in zip(best, snaps):
        assert trace.y[-1] == snap.result.best.value  # the best so far ends at the best
        assert list(trace.y) == sorted(trace.y)  # both maximise: never worse
    shares = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.y[-1] for t in shares] == [1.0, 1.0] and shares[0].y[0] == 1 / 36


def test_edf_is_exact_then_evenly_thinned_and_per_objective(grid, three_objectives):
    x, y = edf.edf_points(np.array([3.0, 1.0, np.nan, 2.0, 2.0]))
    assert list(x) == [1.0, 2.0, 2.0, 3.0] and list(y) == [0.25, 0.5, 0.75, 1.0]
    x, y = edf.edf_points(np.arange(10_000.0), limit=100)
    assert len(x) == 100 and x[0] == 0 and x[-1] == 9999 and y[-1] == 1.0
    line = edf.edf(load_snapshot(grid)).data[0]
    assert len(line.x) == 36 and line.line.shape == "hv"
    fig = edf.edf(load_snapshot(three_objectives))
    assert [t.name for t in fig.data] == ["val_accuracy", "latency_ms", "memory_mb"]
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["val_accuracy", "latency_ms", "memory_mb"]


def test_rank_colours_by_rank_with_the_best_on_top(conditional):
    snap = load_snapshot(conditional)
    dots = rank.rank(snap).data[0]
    best = analysis.usable(snap)[0]
    assert int(dots.customdata[-1][0]) == best.number  # drawn last: on top
    assert min(dots.marker.color) == 0 and max(dots.marker.color) == 1
    fig = rank.rank(snap, "dropout", "l1_ratio")
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("dropout", "l1_ratio")


def test_contour_rank_and_pareto_draw_any_pair_of_axes(conditional, three_objectives):
    snap = load_snapshot(conditional)
    assert snap.param_names[-1] == "l1_ratio"  # the fifth: beyond the old contour menu's first pair
    fig = analysis.contour(snap, "l1_ratio", "learning_rate")
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("l1_ratio", "learning_rate")
    assert fig.layout.yaxis.type == "log" and not fig.layout.updatemenus  # the pickers choose
    contour = views.view_of("contour")
    assert views.picked(contour, snap, "nope", "units") == ("learning_rate", "units")
    tri = load_snapshot(three_objectives)
    pareto_view = views.view_of("pareto")
    assert pareto_view.axes(tri) == ["val_accuracy", "latency_ms", "memory_mb"]
    fig = views.draw(pareto_view, tri, "latency_ms", "memory_mb")
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("latency_ms", "memory_mb")
    front = {t.number for t in tri.result.pareto_front}
    red = fig.data[1]
    assert len(red.x) == len(front) and red.mode == "markers"  # the front over all three objectives
    by_number = tri.by_number
    assert sorted(zip(red.x, red.y)) == sorted((by_number[n].values[1], by_number[n].values[2]) for n in front)


def test_the_brush_follows_plotlys_events_and_selects_over_the_whole_study(conditional):
    snap = load_snapshot(conditional)
    keys = parallel.axis_keys(snap)
    assert keys[0] == "param:learning_rate" and keys[-1] == "metric:val_accuracy"
    brush = parallel.brushed({}, [{"dimensions[5].constraintrange": [[0.95, 1.0]]}, [0]], snap)
    brush = parallel.brushed(brush, [{"dimensions[0].constraintrange": [-2.5, -3.5]}, [0]], snap)
    assert brush == {"metric:val_accuracy": [[0.95, 1.0]], "param:learning_rate": [[-3.5, -2.5]]}
    assert parallel.brushed(brush, [{"visible": [True, False]}, [0, 1]], snap) == brush
    chosen = parallel.selected(snap, parallel.frozen(brush))
    valued = [t for t in snap.trials if t.state.value in ("COMPLETE", "PRUNED", "STOPPED")]
    # The learning rate's axis is drawn in log10: -3.5..-2.5 is 0.000316..0.00316.
    assert chosen == {t.number for t in valued if 0.95 <= t.value <= 1.0
                      and 10 ** -3.5 <= t.params["learning_rate"] <= 10 ** -2.5}
    assert chosen and len(chosen) < len(valued)
    # A categorical axis in category indices; the trials without l1_ratio on its blank tick.
    optimizer = next(c for c in parallel.coordinates(snap) if c.name == "optimizer")
    sgd = optimizer.labels.index("sgd")
    only_sgd = parallel.selected(snap, (("param:optimizer", ((sgd - 0.2, sgd + 0.2),)),))
    assert only_sgd == {t.number for t in valued if t.params["optimizer"] == "sgd"}
    l1 = next(c for c in parallel.coordinates(snap) if c.name == "l1_ratio")
    unset = parallel.selected(snap, (("param:l1_ratio", ((l1.inactive_at, l1.inactive_at),)),))
    assert unset == {t.number for t in valued if "l1_ratio" not in t.params}
    cleared = parallel.brushed(brush, [{"dimensions[5].constraintrange": None}, [0]], snap)
    assert cleared == {"param:learning_rate": [[-3.5, -2.5]]}
    # The figure draws the brush back, so a refresh keeps it.
    dims = figures.parallel(snap, parallel.frozen(brush)).data[0].dimensions
    assert list(dims[0].constraintrange) == [-3.5, -2.5] and list(dims[-1].constraintrange) == [0.95, 1.0]


def test_the_history_and_the_leaderboard_show_only_the_brushed_trials(conditional):
    snap = load_snapshot(conditional)
    brush = parallel.frozen({"metric:val_accuracy": [[0.95, 1.0]]})
    chosen = parallel.selected(snap, brush)
    history = views.draw(views.view_of("history"), snap, brush=brush)
    drawn = {int(x) for t in history.data if t.name != "best so far" for x in t.x}
    assert drawn == chosen and f"the {len(chosen)} trials selected" in history.layout.title.text
    assert not any(t.name.startswith("failed") for t in history.data)
    rows = leaderboard.restrict(leaderboard.rows(snap), set(), chosen)
    assert {r["trial"] for r in rows} == chosen


def test_state_counts_filter_and_the_csv_of_the_rows_shown(rich_study):
    snap = load_snapshot(rich_study)
    counts = dict(leaderboard.state_counts(snap))
    assert counts == {s: n for s, n in snap.result.counts.items() if n} and counts["FAILED"] > 0
    shown = leaderboard.restrict(leaderboard.rows(snap), {"FAILED"}, None)
    assert len(shown) == len(snap.trials) - counts["FAILED"]
    assert all(r["state"] != "FAILED" for r in shown)
    cols = leaderboard.columns(snap)
    parsed = list(csv.reader(io.StringIO(leaderboard.to_csv(shown[:3], cols))))
    assert parsed[0] == [c["name"] for c in cols] and len(parsed) == 4
    assert float(parsed[1][3]) == shown[0]["value"]  # in full, not as the table rounds it


def test_importance_scores_a_conditional_parameter_on_the_trials_that_set_it(conditional):
    snap = load_snapshot(conditional)
    found = {s.name: s for s in importance.scores(snap)}
    sgd = [t for t in analysis.usable(snap) if "l1_ratio" in t.params]
    l1 = found["l1_ratio"]  # Optuna alone drops it: not every trial has it
    assert l1.conditional and l1.trials == min(len(sgd), importance.MAX_IMPORTANCE_TRIALS)
    assert l1.mean > 0.3  # it decides much of the metric where it is set
    assert not any(s.conditional for n, s in found.items() if n != "l1_ratio")
    fig = importance.importance(snap)
    assert f"l1_ratio (where set: {l1.trials} trials)" in fig.data[0].y
    assert "set in only some trials, scored on those trials alone" in fig.layout.title.text


def test_importance_is_drawn_for_each_objective(tmp_path):
    snap = load_snapshot(write_study(tmp_path / "two", 80, workers=3, seed=4, objectives=2))
    fig = importance.importance(snap)
    assert [t.name for t in fig.data] == ["val_accuracy", "latency_ms"]
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["val_accuracy", "latency_ms"]
    latency = importance.scores(snap, 1)
    assert latency[-1].name == "units"  # latency is the network's width, mostly
    assert importance.scores(snap, 0)[-1].name != "units"


def test_the_tabs_are_grouped_in_rows_with_every_view_once(rich_study, synthetic):
    for run_dir, count in ((rich_study, 1), (synthetic, 3)):
        snap = load_snapshot(run_dir)
        rows = views.tab_rows(snap, count)
        assert [group for group, _ in rows] == ["Results", "Analysis", "Resources"]
        keys = [key for _, tabs in rows for key, _ in tabs]
        assert sorted(keys) == sorted(["leaderboard", "trial", *(["compare"] if count > 1 else []),
                                       *(v.key for v in views.views_of(snap))])
        assert max(len(tabs) for _, tabs in rows) <= 7


def test_the_report_draws_the_pareto_front_on_every_pair_of_objectives(three_objectives):
    """A report has no axis menus: with three objectives, each pair is drawn."""
    text = build_report(load_snapshot(three_objectives))
    pairs = re.findall(r"Pareto front: (\w+) \(\w+\) against (\w+) \(\w+\)", text)
    assert sorted(set(pairs)) == [("latency_ms", "memory_mb"), ("val_accuracy", "latency_ms"),
                                  ("val_accuracy", "memory_mb")]
    assert text.count('id="plot-pareto') == 3


def test_optuna_dashboard_counts_only_running_trials_and_lists_no_hpo_attributes(tmp_path):
    """Users open hpo's store in optuna-dashboard too: a queued or suspended
    trial must not show as running there, nor the master's decisions as the
    study's user attributes."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import optuna_dashboard
    from hpo.store import StudyRelay, TrialLink
    from hpo.trial import TrialStatus

    path = str(tmp_path / "journal.log")
    with StudyRelay(path, "s") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, direction="maximize")
        store = StudyStore(relay.storage, "s")
        created = [store.create_trial({}, {}) for _ in range(4)]
        runs = []
        for trial_id, _ in created[:2]:  # two start; one of them suspends; two stay queued
            link = TrialLink(relay.writers_url, trial_id)
            run = link.start({"host": "h", "pid": os.getpid()}, time.time(), 0,
                             {"run": {}, "heartbeat": None, "reports": [], "segments": []})["run"]
            link.report(0, {"value": 0.5}, 0.5)
            runs.append((link, run))
        suspended, run = runs[1]
        suspended.end(TrialStatus.SUSPENDED, None, {**run, "suspended": True})
        store.set_stop({"reason": "budget"})
        store.set_contender(0.9)

    app = optuna_dashboard.wsgi(optuna.storages.JournalStorage(hpo.store.JournalFile(path)))
    handler = type("Quiet", (WSGIRequestHandler,), {"log_message": lambda *args: None})
    server = make_server("127.0.0.1", 0, app, handler_class=handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/api/studies/0?after=0",
                                    timeout=60) as answer:
            shown = json.load(answer)
    finally:
        server.shutdown()
        server.server_close()
    assert [t["state"] for t in shown["trials"]] == ["Running", "Waiting", "Waiting", "Waiting"]
    assert shown["user_attrs"] == []


# ------------------------------------------------------------------ what a user still trips over

def peaked(config: dict, trial) -> dict:
    """Accuracy that peaks at step 1, then falls: returns its best step's, and that step."""
    curve = [0.5, 0.9, 0.8, 0.7]
    for step, accuracy in enumerate(curve):
        trial.report(step, accuracy=accuracy + config["x"] / 100)
    return {"accuracy": max(curve) + config["x"] / 100, "best_step": 1}


def looked_up(config: dict, trial) -> float:
    """The value ``config["values"]`` holds at ``config["x"]``: studies with chosen values."""
    return config["values"][config["x"]]


def by_id(component, id_: str):
    """The Dash component with ``id_`` under ``component`` (a list of them, or one)."""
    for child in component if isinstance(component, list) else [component]:
        if getattr(child, "id", None) == id_:
            return child
        inner = getattr(child, "children", None)
        if isinstance(inner, (list, tuple)) or hasattr(inner, "children"):
            found = by_id(list(inner) if isinstance(inner, (list, tuple)) else inner, id_)
            if found is not None:
                return found
    return None


def cells(table) -> list[list[str]]:
    """A table's body as text, row by row."""
    body = table.children[1]
    return [[td.children for td in tr.children] for tr in body.children]


def test_a_trial_shows_what_it_returned_apart_from_its_last_report(tmp_path):
    """A trial that returns its best epoch's value: "last metrics" showed that
    returned value as if it were the last report. Each is named for what it is."""
    from hpo.trial_details import trial_details

    space = toy_space("peak", "test_dashboard:peaked", metric={"name": "accuracy", "direction": "maximize"},
                      space={"x": [0, 1]})
    hpo.run(space, engine="inline", runs_dir=tmp_path, progress=False)
    text = trial_details(tmp_path / "peak", 1)  # hpo status RUN_DIR --trial 1
    assert "returned:\n  accuracy = 0.91\n  best_step = 1\n" in text
    assert "last report (step 3):\n  accuracy = 0.71\n" in text
    assert "last metrics" not in text
    page = trial_page.page(load_snapshot(tmp_path / "peak"), 1)
    assert "Returned" in str(page) and "Last report (step 3)" in str(page) and "Last metrics" not in str(page)
    assert cells(by_id(page, "trial-returned")) == [["accuracy", "0.91"], ["best_step", "1"]]
    assert cells(by_id(page, "trial-last-report")) == [["accuracy", "0.71"]]


def test_user_attributes_of_the_study_and_its_trials_are_shown(tmp_path):
    """What a user's own code (objective, sampler, Optuna directly) set as user
    attributes; hpo's own keys (kept there by older stores) stay out."""
    from hpo.dashboards import app as dash_app
    from hpo.store import JournalFile

    run_dir = write_study(tmp_path / "attrs", 12, workers=2, seed=3, running=2, name="attrs")
    reader = StoreReader(run_dir, write_views=False)
    assert reader.snapshot().user_attrs == {}
    storage = optuna.storages.JournalStorage(JournalFile(str(run_dir / "journal.log")))
    study_id = storage.get_study_id_from_name("attrs")
    storage.set_study_user_attr(study_id, "dataset", "digits v2")
    storage.set_study_user_attr(study_id, "hpo:stop", None)  # an older store's decision
    running = next(t for t in storage.get_all_trials(study_id) if not t.state.is_finished())
    storage.set_trial_user_attr(running._trial_id, "sampler", {"kind": "mine", "round": 3})
    snap = reader.snapshot()  # the new attributes are news: read again
    assert snap.user_attrs == {"dataset": "digits v2"}
    assert snap.by_number[running.number].user_attrs == {"sampler": {"kind": "mine", "round": 3}}
    page = trial_page.page(snap, running.number)
    assert cells(by_id(page, "trial-user-attrs")) == [["sampler", '{"kind": "mine", "round": 3}']]
    style, (summary_line, table) = dash_app._study_attrs(snap)
    assert style != {"display": "none"} and summary_line.children == "Study attributes (1)"
    assert cells(table) == [["dataset", "digits v2"]]


def test_history_can_be_drawn_on_wall_clock_time(rich_study):
    snap = load_snapshot(rich_study)
    fig = figures.history(snap)
    by_trial, by_time = fig.layout.updatemenus[1].buttons
    assert (by_trial.label, by_time.label) == ("by trial", "by time")
    assert by_time.args[1]["xaxis.type"] == "date" and by_trial.args[1]["xaxis.type"] == "linear"
    points = fig.data[0]  # the completed trials: the same markers, moved to when each ended
    ended = {t.number: t.ended_at for t in snap.trials}
    assert [datetime.fromisoformat(x).timestamp() for x in by_time.args[0]["x"][0]] == \
        pytest.approx([ended[int(n)] for n in points.customdata], abs=1e-3)
    assert list(by_trial.args[0]["x"][0]) == list(points.x)
    # The best so far in the order trials ended: a line of its own, shown with its axis.
    line = fig.data[-1]
    assert line.name == "best so far" and line.visible is False and by_time.args[0]["visible"][-2:] == [False, True]
    times = [datetime.fromisoformat(x).timestamp() for x in line.x]
    assert times == sorted(times) and list(line.y) == sorted(line.y)
    assert line.y[-1] == max(t.value for t in figures.completed(snap))


def test_log_parameters_are_labelled_with_whole_numbers(rich_study):
    """Plotly's own log labels read "2 3 4 ... 100 2 3": 2 cannot be told from 20."""
    snap = load_snapshot(rich_study)
    wanted = {f"{m * 10.0 ** e:g}" for e in range(-5, 1) for m in (1, 2, 5)}
    panel = snap.param_names.index("lr") + 1
    slices = analysis.slices(snap).layout[f"xaxis{panel if panel > 1 else ''}"]
    contour = analysis.contour(snap, "lr", "batch").layout.xaxis
    ranked = rank.rank(snap, "batch", "lr").layout.yaxis
    for axis in (slices, contour, ranked):  # lr, each time
        assert axis.type == "log" and axis.tickmode == "array"
        assert len(axis.ticktext) >= 2 and set(axis.ticktext) <= wanted
        assert [f"{v:g}" for v in axis.tickvals] == list(axis.ticktext)
    # The static report's contour menu sets the same labels for each pair.
    layouts = [b.args[1] for b in analysis.contour(snap).layout.updatemenus[0].buttons]
    assert any(lay.get("xaxis.ticktext") and set(lay["xaxis.ticktext"]) <= wanted for lay in layouts)


def test_contour_counts_the_trials_it_draws(conditional):
    """A conditional parameter is set in only some trials: the subtitle counts those."""
    snap = load_snapshot(conditional)
    done = analysis.usable(snap)
    setting = [t for t in done if "l1_ratio" in t.params]
    assert 3 <= len(setting) < len(done)
    fig = analysis.contour(snap, "l1_ratio", "learning_rate")
    assert (f"mean of the {len(setting)} of the {len(done)} completed trials that set both parameters"
            in fig.layout.title.text)
    full = analysis.contour(snap, "units", "learning_rate")
    assert f"mean of the {len(done)} completed trials in each cell" in full.layout.title.text
    # In the report's menu, each pair says its own count.
    titles = [b.args[1]["title.text"] for b in analysis.contour(snap).layout.updatemenus[0].buttons]
    assert any(f"{len(setting)} of the {len(done)}" in t for t in titles)
    assert any(f"mean of the {len(done)} completed trials in each cell" in t for t in titles)


def _looked_up_study(runs: Path, name: str, values: list[float]) -> Path:
    space = toy_space(name, "test_dashboard:looked_up", space={"x": list(range(len(values)))},
                      fixed={"values": values})
    hpo.run(space, engine="inline", runs_dir=runs, progress=False)
    return runs / name


def test_importance_of_four_trials_with_equal_values_says_why_there_is_none_yet(tmp_path):
    """The tutorial's study at 4 completed trials showed fANOVA's "Encountered
    zero total variance in all trees": a bootstrap resample of trials with
    equal values. Resamples whose values differ are drawn; when every trial
    gave the same value, the view says so and what makes importance appear."""
    ties = load_snapshot(_looked_up_study(tmp_path, "ties", [0.95, 0.95, 0.9, 0.9]))
    fig = importance.importance(ties)
    assert isinstance(fig.data[0], go.Bar) and list(fig.data[0].y) == ["x"]
    flat = load_snapshot(_looked_up_study(tmp_path, "flat", [0.95] * 4))
    message = importance.importance(flat).layout.annotations[0].text
    assert "all 4 completed trials gave the same value (0.95)" in message
    assert "appears once completed trials give different values" in message
    assert "variance" not in message


def test_the_csv_of_every_trial_is_the_export_and_shows_it_is_at_work(rich_study):
    from hpo.dashboards import app as dash_app
    from hpo.results import StudyResult

    snap = load_snapshot(rich_study)
    assert leaderboard.export_csv(snap) == StudyResult.load(rich_study).to_csv()
    assert leaderboard.export_csv(snap) is leaderboard.export_csv(snap)  # a second click: at once
    app = dash_app.make_app(StoreReader(rich_study))
    spec = next(c for c in app._callback_list if c["inputs"] == [{"id": "csv-all", "property": "n_clicks"}])
    assert spec["running"]["running"] == {"csv-all.disabled": True, "csv-all-label.children": dash_app.CSV_ALL_BUSY}
    assert spec["running"]["runningOff"]["csv-all-label.children"] == dash_app.CSV_ALL
