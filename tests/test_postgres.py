"""A study stored in a real PostgreSQL server, started by the test on 127.0.0.1."""

from __future__ import annotations

import pytest

import hpo
from conftest import toy_space

pytest.importorskip("psycopg2", reason="pip install 'hpo[postgres]'")


def test_study_in_postgresql_from_two_worker_processes(postgres_url, dask_address, worker_pids, tmp_path):
    result = hpo.run(toy_space("pg"), engine="dask", scheduler=dask_address, storage=postgres_url,
                     runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8 and result.best.params == {"x": 2, "y": -1}
    again = hpo.StudyResult.load(tmp_path / "pg")  # study.json points at the database
    assert again.counts == result.counts
    assert all(t.host for t in again.trials) and all(t.steps == 3 for t in again.trials)
