"""Every store through the conformance suite (tests/store_conformance.py): the
journal written directly (a worker that cannot reach the relay), the journal
behind the study's relay, SQLite and PostgreSQL behind it."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from hpo.store.records import REPORT_ATTR
from store_conformance import (
    ASSETS, METRIC, Served, StoreConformance, StoreKit, copy_asset, expected_metrics,
)


class JournalKit(StoreKit):
    def url(self, tmp_path: Path) -> str:
        return str(tmp_path / "journal.log")

    def check_raw(self, served: Served, trial_ids: dict[int, int], reports: int) -> None:
        """Every line whole JSON; each report written exactly once, in the
        order its writer made them."""
        raw = Path(served.url).read_bytes()
        assert raw.endswith(b"\n")
        writes: Counter = Counter()
        for line in raw.splitlines():
            log = json.loads(line)  # a torn or interleaved line fails here
            if "intermediate_value" in log:
                writes[("value", log["trial_id"], log["step"])] += 1
                assert log["intermediate_value"] == \
                    expected_metrics(trial_ids[log["trial_id"]], log["step"])[METRIC]
            elif any(k.startswith(REPORT_ATTR) for k in log.get("system_attr", {})):
                (key, value), = log["system_attr"].items()
                writes[("report", log["trial_id"], int(key.removeprefix(REPORT_ATTR)))] += 1
                assert value == expected_metrics(trial_ids[log["trial_id"]], int(key[len(REPORT_ATTR):]))
        wanted = {(kind, tid, s) for kind in ("value", "report") for tid in trial_ids for s in range(reports)}
        assert set(writes) == wanted
        assert not {k: n for k, n in writes.items() if n != 1}, "written more than once"
        for tid in trial_ids:
            steps = [step for kind, t, step in writes if t == tid and kind == "value"]
            assert steps == sorted(steps), f"trial id {tid}: reports out of order"

    def asset(self) -> tuple[Path, Path] | None:
        return ASSETS / "journal-0.1.0.log", ASSETS / "journal-0.1.0.expected.json"

    def restore(self, asset: Path, run_dir: Path) -> str:
        copy_asset(asset, run_dir / "journal.log")
        copy_asset(ASSETS / "journal-0.1.0.study.json", run_dir / "study.json")
        return str(run_dir / "journal.log")


class TestJournalDirect(StoreConformance):
    @pytest.fixture
    def kit(self):
        kit = JournalKit()
        kit.relayed = False
        return kit


class TestJournalRelay(StoreConformance):
    @pytest.fixture
    def kit(self):
        kit = JournalKit()
        kit.reports = 400  # group commits under load
        return kit


class SqliteKit(StoreKit):
    has_file = False
    reports = 60  # a commit and an fsync per write, 6 writers contending for the lock

    def url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/study.db"

    def check_raw(self, served: Served, trial_ids: dict[int, int], reports: int) -> None:
        with sqlite3.connect(served.url.removeprefix("sqlite:///")) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            values = db.execute("SELECT trial_id, step, COUNT(*) FROM trial_intermediate_values "
                                "GROUP BY trial_id, step").fetchall()
        assert {(t, s) for t, s, _ in values} == {(t, s) for t in trial_ids for s in range(reports)}
        assert all(n == 1 for *_, n in values), "a row written more than once"

    def asset(self) -> tuple[Path, Path] | None:
        return ASSETS / "study-0.1.0.db", ASSETS / "sqlite-0.1.0.expected.json"

    def restore(self, asset: Path, run_dir: Path) -> str:
        copy_asset(asset, run_dir / "old.db")
        url = f"sqlite:///{run_dir / 'old.db'}"
        record = json.loads((ASSETS / "sqlite-0.1.0.study.json").read_text())
        run_dir.joinpath("study.json").write_text(json.dumps({**record, "storage": url}))
        return url


class TestSqlite(StoreConformance):
    @pytest.fixture
    def kit(self):
        return SqliteKit()


class PostgresKit(StoreKit):
    has_file = False
    reports = 60

    def __init__(self, server: str) -> None:
        self.server = server
        self._count = 0

    def url(self, tmp_path: Path) -> str:
        """A database of its own per test, on the module's server."""
        import psycopg2

        name = f"conformance_{abs(hash(str(tmp_path))) % 10 ** 9}"
        dsn = self.server.replace("postgresql+psycopg2://", "postgresql://")
        db = psycopg2.connect(dsn)
        try:
            db.autocommit = True  # CREATE DATABASE runs outside a transaction
            with db.cursor() as cursor:
                cursor.execute(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")
                if not cursor.fetchone():
                    cursor.execute(f"CREATE DATABASE {name}")
        finally:
            db.close()
        return self.server.rsplit("/", 1)[0] + f"/{name}"

    def asset(self) -> None:
        return None  # a server's data is not a file kept in the repository


class TestPostgres(StoreConformance):
    @pytest.fixture
    def kit(self, postgres_url):
        return PostgresKit(postgres_url)
