"""A study stored in a real PostgreSQL server, started by the test on 127.0.0.1."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import hpo
from conftest import toy_space

pytest.importorskip("psycopg2", reason="pip install 'hpo[postgres]'")


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    initdb, server = _bin("initdb"), _bin("postgres")
    if not (initdb and server):
        pytest.skip("no PostgreSQL server here: apt-get install postgresql")
    # PostgreSQL refuses to run as root: run it as the postgres user when we are root
    # (directly, so that the PID we hold, and signal, is the server's).
    user = "postgres" if os.getuid() == 0 else None
    data = tempfile.mkdtemp(prefix="hpo-pg-")  # pytest's tmp tree is closed to other users
    if user:
        shutil.chown(data, user)
    subprocess.run([initdb, "-D", data, "-U", "hpo", "--auth=trust"], user=user,
                   check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen([server, "-D", data, "-h", "127.0.0.1", "-p", str(port), "-k", data],
                            user=user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"postgresql+psycopg2://hpo@127.0.0.1:{port}/postgres"
    try:
        _wait_ready(port)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # fast shutdown, by PID
        proc.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def _wait_ready(port: int, timeout: float = 30.0) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user="hpo", dbname="postgres").close()
            return
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_study_in_postgresql_from_two_worker_processes(postgres_url, dask_address, worker_pids, tmp_path):
    result = hpo.run(toy_space("pg"), engine="dask", scheduler=dask_address, storage=postgres_url,
                     runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8 and result.best.params == {"x": 2, "y": -1}
    again = hpo.StudyResult.load(tmp_path / "pg")  # study.json points at the database
    assert again.counts == result.counts
    assert all(t.host for t in again.trials) and all(t.steps == 3 for t in again.trials)
