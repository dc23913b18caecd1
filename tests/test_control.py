"""The master loop's handling of tasks the engine itself could not run."""

from __future__ import annotations

import hpo
from conftest import toy_space


def test_task_lost_by_the_engine_is_recorded_failed_after_its_retries(tmp_path, monkeypatch):
    calls = []

    def lost(task):  # an infrastructure fault, not the objective's
        calls.append(task.number)
        raise OSError("node lost")

    monkeypatch.setattr("hpo.engines._inline.run_trial", lost)
    space = toy_space("lost", retries=2)
    result = hpo.run(space, engine="inline", max_trials=2, runs_dir=tmp_path, progress=False)
    assert calls == [0, 0, 0, 1, 1, 1]  # each task tried 1 + retries times
    assert result.counts["FAILED"] == 2
    assert all(t.error == "EngineError: OSError: node lost" for t in result.trials)
