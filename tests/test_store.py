"""The run directory: portable, resumable, and never mixing two studies."""

from __future__ import annotations

import json
import shutil

import pytest

import hpo
from hpo.errors import UsageError
from conftest import toy_space


def test_a_moved_run_directory_still_opens_and_resumes(tmp_path):
    hpo.run(toy_space("moved"), engine="inline", max_trials=3, runs_dir=tmp_path / "cluster",
            progress=False)
    shutil.move(tmp_path / "cluster", tmp_path / "laptop")
    assert json.loads((tmp_path / "laptop/moved/study.json").read_text())["storage"] == "journal.log"
    assert hpo.StudyResult.load(tmp_path / "laptop/moved").counts["COMPLETE"] == 3
    result = hpo.run(toy_space("moved"), engine="inline", runs_dir=tmp_path / "laptop", progress=False)
    assert result.counts["COMPLETE"] == 8 and len(result.trials) == 8


def test_a_different_space_is_refused_not_mixed(tmp_path):
    hpo.run(toy_space("same"), engine="inline", max_trials=1, runs_dir=tmp_path, progress=False)
    with pytest.raises(UsageError, match='different "space"'):
        hpo.run(toy_space("same", space={"x": [5, 6]}), engine="inline", runs_dir=tmp_path,
                progress=False)
    with pytest.raises(UsageError, match="uses storage"):
        hpo.run(toy_space("same"), engine="inline", storage=f"sqlite:///{tmp_path}/x.db",
                runs_dir=tmp_path, progress=False)
    assert hpo.StudyResult.load(tmp_path / "same").counts["COMPLETE"] == 1
