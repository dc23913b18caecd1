"""One trial in full, as ``hpo status RUN_DIR --trial N`` prints it.

Everything a person debugging a trial asks for, on one page: the
configuration, what it reported step by step, the decisions taken about it
and why, every attempt and segment with where it ran, the whole traceback,
its checkpoint directory and the end of its log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from hpo.errors import UsageError
from hpo.master import NO_CHECKPOINT, saved_no_checkpoint
from hpo.results import TrialRecord, record_fields
from hpo.store import RunDir
from hpo.store.records import ENDED_BY_ATTR, allocations_of, attr_of, grouped_attrs, profiles_of, run_of
from hpo.trial import log_path
from hpo.units import format_number, format_resource_time, format_seconds

__all__ = ["trial_details", "returned", "last_report"]

LOG_LINES = 40  # the end of the log shown; the path says where the rest is


def trial_details(run_dir: Path, number: int) -> str:
    """The text page of trial ``number`` of the study in ``run_dir``."""
    run = RunDir(run_dir)
    store = run.open_store(read_only=True)
    frozen = {t.number: t for t in store.trials()}
    if number not in frozen:
        raise UsageError(f"{run_dir}: no trial {number} (the study has trials 0 to "
                         f"{len(frozen) - 1}).\n  fix: pick a number from `hpo status {run_dir}`")
    trial = frozen[number]
    reports, events, segments = grouped_attrs(trial)
    record = TrialRecord(**record_fields(trial, len(reports), events, segments))
    checkpoint = run.checkpoint_dir(number)
    step, last = last_report(reports)
    sections = [
        _heading(record, trial),
        _section("parameters", [f"{k} = {json.dumps(v)}" for k, v in sorted(record.params.items())]),
        _section("returned", _metric_lines(returned(record, reports, _metric_names(run)))),
        _section(f"last report (step {step})", _metric_lines(last)),
        _section(f"reports ({len(reports)} steps)", _report_table(reports)),
        _section("events", [_event_line(e) for e in events]
                 + ([f"note: it saved no checkpoint while it ran: {NO_CHECKPOINT}"]
                    if saved_no_checkpoint(trial) else [])),
        _section("attempts", _attempt_lines(run_of(trial))),
        _section("allocations", [_allocation_line(a) for a in allocations_of(trial)]
                 + [_profile_line(g, p) for g, p in sorted(profiles_of(trial).items())]),
        _section("segments", [_segment_line(s) for s in segments]),
        _section("error", _error_lines(record, trial)),
        _section("checkpoint directory", [str(checkpoint) + ("" if checkpoint.is_dir() else
                                                             " (not made: the trial kept nothing)")]),
        _section(f"log ({log_path(checkpoint)})", _log_tail(log_path(checkpoint))),
    ]
    return "\n\n".join(s for s in sections if s)


def returned(record: TrialRecord, reports: Sequence[tuple[int, dict[str, float]]],
             names: Sequence[str]) -> dict[str, float]:
    """What the objective returned: the trial's value under each objective's
    name, and any other number it returned. The run record keeps the last
    report updated with the returned numbers, so a number missing from the
    last report, or different there, was returned."""
    values = record.values or ([] if record.value is None else [record.value])
    found = dict(zip(names, values))
    _, last = last_report(reports)
    found.update({k: v for k, v in record.metrics.items()
                  if k not in found and (k not in last or last[k] != v)})
    return found


def last_report(reports: Sequence[tuple[int, dict[str, float]]]) -> tuple[int | None, dict[str, float]]:
    """The step of the last report and its metrics (None and {} without one)."""
    return reports[-1] if reports else (None, {})


def _metric_names(run: RunDir) -> list[str]:
    """The study's objectives' names, in order."""
    metric = (run.read().get("spec") or {}).get("metric") or {}
    return [m.get("name", "value") for m in (metric if isinstance(metric, list) else [metric])]


def _metric_lines(metrics: dict[str, float]) -> list[str]:
    return [f"{k} = {format_number(v, 6)}" for k, v in sorted(metrics.items())]


def _heading(record: TrialRecord, trial: optuna.trial.FrozenTrial) -> str:
    value = "-" if record.value is None else format_number(record.value, 6)
    spent = format_resource_time(record.core_seconds / 3600)
    if record.gpu_seconds:
        spent += ", " + format_resource_time(record.gpu_seconds / 3600, "GPU")
    return (f"trial {record.number}: {record.state.value}, value {value}, "
            f"{format_seconds(record.duration_s)} s busy, {spent}, attempt {record.attempt or '-'}")


def _section(title: str, lines: list[str]) -> str:
    if not lines:
        return ""
    return f"{title}:\n" + "\n".join(f"  {line}" for line in lines)


def _report_table(reports: list[tuple[int, dict[str, float]]]) -> list[str]:
    names = sorted({k for _, metrics in reports for k in metrics})
    if not names:
        return []
    rows = [["step", *names]] + [[str(step), *(format_number(m[n], 6) if n in m else "-" for n in names)]
                                 for step, m in reports]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _event_line(event: Mapping[str, Any]) -> str:
    step = "" if event.get("step") is None else f" at step {event['step']}"
    return f"{_when(event.get('time'))}  {event.get('kind')}{step}: {event.get('reason', '')}"


def _attempt_lines(run: Mapping[str, Any]) -> list[str]:
    earlier = [a for a in run.get("previous") or () if isinstance(a, dict)]
    lines = [_attempt_line(a.get("attempt"), a.get("host"), a.get("pid"), a.get("started_at"),
                           a.get("ended_at"), a.get("error")) for a in earlier]
    if run:
        lines.append(_attempt_line(run.get("attempt"), run.get("host"), run.get("pid"),
                                   run.get("attempt_started_at", run.get("started_at")),
                                   run.get("ended_at"), run.get("error")))
    return lines


def _allocation_line(a: dict[str, Any]) -> str:
    """One allocation: shape, place, prediction, reason."""
    nodes = f" x {a['nodes']} nodes" if a.get("nodes", 1) > 1 else ""
    place = ", ".join(a.get("hosts") or []) or "where the engine put it"
    gpus = f" gpu {','.join(a['devices'])}" if a.get("devices") else ""
    predicted = (f"; predicted {a['predicted_s']:.1f} s, {a['predicted_step_s'] * 1e3:.2f} ms a step"
                 if a.get("predicted_s") else "")
    return (f"{_when(a.get('at'))}  {a.get('gpus', 0):g} GPU(s){nodes} on {place}{gpus} "
            f"(speed {a.get('speed', 1.0):.2g}){predicted}: {a.get('reason', '')}")


def _profile_line(gpus: float, profile: dict[str, Any]) -> str:
    return (f"profile on {gpus:g} GPU(s): {profile['rate']:.4g} {profile.get('unit', '')} "
            f"({profile['batch_s'] * 1e3:.2f} ms a batch, last {profile.get('averaged')} of "
            f"{profile.get('batches')} batches)")


def _attempt_line(attempt, host, pid, started, ended, error) -> str:
    outcome = f": {error.get('type')}: {error.get('message')}" if isinstance(error, dict) else ""
    return f"attempt {attempt}: {host}:{pid}, {_when(started)} to {_when(ended)}{outcome}"


def _segment_line(segment: Mapping[str, Any]) -> str:
    line = (f"segment {segment.get('index')}: steps {segment.get('first_step')}-"
            f"{segment.get('last_step')} on {segment.get('worker')}, "
            f"{_when(segment.get('started_at'))} to {_when(segment.get('ended_at'))}, "
            f"{segment.get('outcome')}")
    if segment.get("quanta") is not None:  # time-shared: how it used its slot
        judged = segment.get("convergence")
        line += (f"; {segment['quanta']} quanta"
                 + (f", last C={judged:.4g}" if judged is not None else "")
                 + f"; checkpoint {segment.get('checkpoint_bytes', 0):,} B, saved in "
                 f"{segment.get('save_s', 0.0):.3f} s, restored in {segment.get('restore_s', 0.0):.3f} s")
    return line


def _error_lines(record: TrialRecord, trial: optuna.trial.FrozenTrial) -> list[str]:
    if record.traceback:
        return record.traceback.rstrip().splitlines()
    if record.error:
        return [record.error]
    ended_by = attr_of(trial, ENDED_BY_ATTR)
    return [f"{ended_by['reason']}: {ended_by['message']}"] if ended_by else []


def _log_tail(path: Path) -> list[str]:
    if not path.is_file():
        return ["(none: the trial printed nothing, or has not started)"]
    lines = path.read_text(errors="replace").splitlines()
    cut = [f"... {len(lines) - LOG_LINES} earlier lines in the file"] if len(lines) > LOG_LINES else []
    return cut + lines[-LOG_LINES:]
