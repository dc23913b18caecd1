"""What every store must do, as one suite (after Optuna's ``StorageTestCase``).

A test module joins a store by subclassing :class:`StoreConformance` and
supplying a ``kit`` fixture: a :class:`StoreKit` that serves a study as a
master does (through its relay, or with writers appending directly) and says
how its raw store is checked. The writers are separate OS processes (spawn)
that write through the path trial code takes on a worker: the store-backed
``Trial`` that ``hpo.trial.open_trial`` gives an objective.
"""

from __future__ import annotations

import abc
import json
import multiprocessing as mp
import os
import pickle
import signal
import shutil
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

import hpo
from hpo.store import Halted, StudyRelay, StudyStore, TrialLink, open_storage
from hpo.store.records import CONTENDER_ATTR, REPORT_ATTR, RESIZE_ATTR, RUN_ATTR, STOP_ATTR, status_of
from hpo.trial import TrialStatus, TrialTask, open_trial, run_trial
from conftest import ROOT, toy_space, wait_for

STUDY = "conformance"
METRIC = "value"
ASSETS = Path(__file__).with_name("assets")
_START_TIMEOUT_S = 120  # spawning interpreters on 2 busy cores
_RUN_TIMEOUT_S = 240


@dataclass
class Served:
    """A study served as its master serves it."""

    storage: optuna.storages.BaseStorage  # the master's
    writers_url: str  # what its tasks carry
    url: str  # the store itself, for readers
    control: str


class StoreKit(abc.ABC):
    """How the suite serves a study in one store."""

    relayed = True  # writers reach the study's relay (else they append directly)
    has_file = True  # a journal file (torn tails, newer records)
    reports = 200  # per writer in the concurrency behaviour (6 writers at once)

    @abc.abstractmethod
    def url(self, tmp_path: Path) -> str:
        """The store of a study in ``tmp_path``."""

    @contextmanager
    def serving(self, tmp_path: Path) -> Iterator[Served]:
        """The study, served while the block runs."""
        url, control = self.url(tmp_path), str(tmp_path / "control.json")
        if not self.relayed:  # made afresh: it reads the store as it is now
            yield Served(_reader_storage(url), url, url, control)
            return
        with StudyRelay(url, STUDY, control=control) as relay:
            yield Served(relay.storage, relay.writers_url, url, control)

    def check_raw(self, served: Served, trial_ids: dict[int, int], reports: int) -> None:
        """Check the raw store: each write held exactly once."""


def expected_metrics(number: int, step: int) -> dict[str, float]:
    """What trial ``number`` reports at ``step``: distinct per (trial, step), and
    ``loss`` is no short binary fraction, so any rounding on the way shows."""
    return {METRIC: number * 100_000 + step + 0.375, "loss": 1.0 / (3 * step + number + 1)}


def make_task(served: Served, tmp_path: Path, trial_id: int, number: int,
              objective: object = "none:none") -> TrialTask:
    return TrialTask(storage=served.writers_url, study_name=STUDY, trial_id=trial_id, number=number,
                     config={"writer": number}, objective=objective, metric=METRIC,
                     checkpoint_dir=str(tmp_path / "trials" / str(number)), control=served.control)


def _writer(task: TrialTask, reports: int, ready, go, result_file: str) -> None:
    """One worker process: report steps 0..reports-1 of its trial, as a trial task would."""
    done, error = 0, None
    try:
        trial = open_trial(task)
        ready.release()
        if not go.wait(_START_TIMEOUT_S):
            raise TimeoutError("never told to start")
        for step in range(reports):
            trial.report(step, **expected_metrics(task.number, step))
            done += 1
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        error = traceback.format_exc()
    Path(result_file).write_text(json.dumps({"pid": os.getpid(), "done": done, "error": error}))


def _dump(url: str, out_file: str) -> None:
    """In a fresh process: replay the store and dump every trial's reports."""
    study = optuna.load_study(study_name=STUDY, storage=open_storage(url))
    dump = {t.number: {"state": t.state.name, "intermediate": dict(t.intermediate_values),
                       "reports": {k: v for k, v in t.system_attrs.items() if k.startswith(REPORT_ATTR)}}
            for t in study.get_trials(deepcopy=False)}
    Path(out_file).write_bytes(pickle.dumps(dump))


def fresh_dump(url: str, tmp: Path) -> dict:
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


def check_prefix(trial: optuna.trial.FrozenTrial, reports: int, seen: dict[int, int]) -> None:
    """A snapshot read while writing: steps 0..k-1 and nothing else, values exact.
    ``seen`` holds how many steps of each trial earlier snapshots checked: a
    step once seen must stay, and only the new ones are compared."""
    values = trial.intermediate_values
    keys = [k for k in trial.system_attrs if k.startswith(REPORT_ATTR)]
    assert len(values) <= reports and len(keys) <= reports
    assert sorted(values) == list(range(len(values))), "a gap: a report landed out of order"
    assert len(values) >= seen.get(trial.number, 0), "a report seen earlier disappeared"
    for step in range(seen.get(trial.number, 0), len(values)):
        assert values[step] == expected_metrics(trial.number, step)[METRIC], (step, values[step])
        attr = trial.system_attrs.get(f"{REPORT_ATTR}{step:06d}")
        assert attr in (None, expected_metrics(trial.number, step)), (step, attr)
    seen[trial.number] = len(values)


def created_trials(served: Served, count: int) -> list[tuple[int, int]]:
    """``count`` trials created as the master creates them: (id, number)."""
    optuna.create_study(study_name=STUDY, storage=served.storage, direction="maximize",
                        load_if_exists=True)
    store = StudyStore(served.storage, STUDY)
    return [store.create_trial({}, {}) for _ in range(count)]


def start_writers(served: Served, tmp_path: Path, trials: list[tuple[int, int]], reports: int):
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    writers = [ctx.Process(target=_writer, name=f"writer-{number}", args=(
        make_task(served, tmp_path, trial_id, number), reports, ready, go,
        str(tmp_path / f"writer-{number}.json"))) for trial_id, number in trials]
    for writer in writers:
        writer.start()
    for _ in writers:
        assert ready.acquire(timeout=_START_TIMEOUT_S), "a writer did not start"
    go.set()
    return writers


def end_writers(writers) -> None:
    for writer in writers:
        writer.join(timeout=_RUN_TIMEOUT_S)
        if writer.is_alive():  # only our own children, by their handle
            writer.kill()
            writer.join()


class StoreConformance:
    """The behaviours; each runs with the subclass's ``kit``."""

    PROCS = 6

    def test_concurrent_writers_lose_nothing_and_readers_see_whole_prefixes(self, kit, tmp_path):
        reports = kit.reports
        with kit.serving(tmp_path) as served:
            trials = created_trials(served, self.PROCS)
            writers = start_writers(served, tmp_path, trials, reports)
            snapshots, seen, reader_seen = 0, {}, {}
            try:
                while any(w.is_alive() for w in writers):
                    for trial in StudyStore(served.storage, STUDY).trials():  # the master
                        check_prefix(trial, reports, seen)
                    reader = StudyStore(_reader_storage(served.url), STUDY)  # hpo status, meanwhile
                    for trial in reader.trials():
                        check_prefix(trial, reports, reader_seen)
                    snapshots += 1
                    time.sleep(0.3)
            finally:
                end_writers(writers)
            for writer in writers:
                result = json.loads((tmp_path / f"{writer.name}.json").read_text())
                assert result["error"] is None, f"{writer.name} failed:\n{result['error']}"
                assert writer.exitcode == 0 and result["done"] == reports, (writer.exitcode, result)
            assert snapshots >= 1
            kit.check_raw(served, dict(trials), reports)
        dump = fresh_dump(served.url, tmp_path)
        assert sorted(dump) == [number for _, number in trials]
        for number, trial in dump.items():
            assert trial["state"] == "RUNNING"
            assert trial["intermediate"] == {s: expected_metrics(number, s)[METRIC] for s in range(reports)}
            assert trial["reports"] == {f"{REPORT_ATTR}{s:06d}": expected_metrics(number, s)
                                        for s in range(reports)}

    def test_a_writer_killed_mid_write_loses_only_its_own_unacknowledged_write(self, kit, tmp_path):
        reports = 100_000  # it is killed long before
        with kit.serving(tmp_path) as served:
            trials = created_trials(served, 2)
            writers = start_writers(served, tmp_path, trials, reports)
            killed, survivor = writers
            store = StudyStore(served.storage, STUDY)
            wait_for(lambda: len(store.trial(trials[0][0]).intermediate_values) >= 50, timeout=120,
                     what="50 reports of the writer to kill")
            os.kill(killed.pid, signal.SIGKILL)  # mid-write, as often as not
            killed.join()
            seen = len(store.trial(trials[1][0]).intermediate_values)
            wait_for(lambda: len(store.trial(trials[1][0]).intermediate_values) >= seen + 50,
                     timeout=120, what="the other writer to go on")
            os.kill(survivor.pid, signal.SIGKILL)
            survivor.join()
            # A write after the kills: a torn tail is set aside, a half request dropped.
            StudyStore(served.storage, STUDY).record_event(trials[0][0], "interrupted", None, "killed")
        dump = fresh_dump(served.url, tmp_path)
        for _, number in trials:
            values = dump[number]["intermediate"]
            assert values and sorted(values) == list(range(len(values)))  # a whole prefix
            assert values == {s: expected_metrics(number, s)[METRIC] for s in values}

    def test_a_torn_tail_is_set_aside_and_the_store_goes_on(self, kit, tmp_path):
        if not kit.has_file:
            pytest.skip("a database has no tail to tear")
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            trial = open_trial(make_task(served, tmp_path, trial_id, number))
            trial.report(0, value=1.0)
            with hpo.store.JournalFile(served.url).locked() as journal:  # a write cut off
                journal.write(b'{"op_code":7,"worker_id":"dead","trial_id":0,"st')
                journal.flush()
            trial.report(1, value=2.0)
        assert fresh_dump(served.url, tmp_path)[number]["intermediate"] == {0: 1.0, 1: 2.0}
        assert list(tmp_path.glob("*.torn-*"))  # set aside, not deleted

    def test_a_record_of_a_newer_optuna_is_refused_with_the_fix_not_cut_off(self, kit, tmp_path):
        if not kit.has_file:
            pytest.skip("a database checks its own schema version")
        url = kit.url(tmp_path)
        with kit.serving(tmp_path) as served:
            created_trials(served, 1)
        newer = b'{"op_code":99,"worker_id":"next","trial_id":0,"future":1}\n'
        with open(url, "ab") as journal:
            journal.write(newer)
        before = Path(url).read_bytes()
        with pytest.raises(hpo.UsageError, match=r"op code 99.*newer Optuna[\s\S]*fix: .*pip install -U optuna"):
            with kit.serving(tmp_path):
                pass
        assert Path(url).read_bytes() == before  # nothing cut off or set aside
        with pytest.raises(hpo.UsageError, match="op code 99"):
            _reader_storage(url)

    def test_a_store_written_by_an_earlier_version_reads_and_resumes(self, kit, tmp_path):
        asset = kit.asset()
        if asset is None:
            pytest.skip("no file of an earlier version for this store")
        expected = json.loads(asset[1].read_text())
        runs = tmp_path / "runs"
        url = kit.restore(asset[0], runs / "old")
        result = hpo.StudyResult.load(runs / "old")
        assert [{"number": t.number, "state": t.state.value, "value": t.value, "steps": t.steps,
                 "attempt": t.attempt, "events": [e["kind"] for e in t.events]}
                for t in sorted(result.trials, key=lambda t: t.number)] == expected
        space = json.loads((runs / "old" / "study.json").read_text())["spec"]
        again = hpo.run(space, engine="inline", runs_dir=runs, progress=False,
                        storage=None if "://" not in url else url)  # resumes: it was complete
        assert again.table() == result.table()

    def test_what_a_worker_holds_pickles_and_works_in_another_process(self, kit, tmp_path):
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            task = make_task(served, tmp_path, trial_id, number)
            link = TrialLink(task.storage, trial_id, task.control)
            link.start({"host": "h", "pid": os.getpid()}, time.time(), 0, {"run": {}, "heartbeat": None,
                                                                             "reports": [], "segments": []})
            link.report(0, {METRIC: 1.0}, 1.0)  # connected: a socket and a reader thread
            ctx = mp.get_context("spawn")
            other = ctx.Process(target=_report_with, args=(pickle.dumps(link), 1))
            other.start()
            other.join(timeout=_RUN_TIMEOUT_S)
            assert other.exitcode == 0
            link.report(2, {METRIC: 3.0}, 3.0)  # this process's own connection still works
            if kit.relayed and kit.has_file:  # a copy of the master's storage reads the file
                copy = pickle.loads(pickle.dumps(served.storage))
                assert copy.get_trial(trial_id).intermediate_values == {0: 1.0, 1: 2.0, 2: 3.0}
        assert fresh_dump(served.url, tmp_path)[number]["intermediate"] == {0: 1.0, 1: 2.0, 2: 3.0}

    def test_a_process_forked_after_a_write_writes_on_its_own(self, kit, tmp_path):
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            trial = open_trial(make_task(served, tmp_path, trial_id, number))
            trial.report(0, value=1.0)
            child = os.fork()
            if child == 0:  # the child shares the parent's connection until it writes
                code = 1
                try:
                    trial.report(1, value=2.0)
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            trial.report(2, value=3.0)
        assert fresh_dump(served.url, tmp_path)[number]["intermediate"] == {0: 1.0, 1: 2.0, 2: 3.0}

    def test_a_report_on_an_ended_trial_is_refused_to_that_trial_alone(self, kit, tmp_path):
        with kit.serving(tmp_path) as served:
            (ended_id, ended_number), (alive_id, alive_number) = created_trials(served, 2)
            ended = open_trial(make_task(served, tmp_path, ended_id, ended_number))
            alive = open_trial(make_task(served, tmp_path, alive_id, alive_number))
            StudyStore(served.storage, STUDY).end_without_result(ended_id, "cancelled", "stopped")
            errors: list[BaseException] = []

            def report(trial, step):
                try:
                    trial.report(step, value=float(step))
                except BaseException as exc:  # noqa: BLE001 - what its thread would see
                    errors.append(exc)

            threads = [threading.Thread(target=report, args=(t, s)) for t in (ended, alive)
                       for s in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            # The ended trial's reports raise (never as if stored), each in its
            # own thread; the other trial's go on. A direct writer is not asked.
            assert [type(e) for e in errors] == [Halted] * (3 if kit.relayed else 0), errors
            assert {e.why for e in errors} <= {"ended"}
            assert [t.state for t in StudyStore(served.storage, STUDY).trials()] == [
                optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING]
            if kit.relayed:
                assert ended.should_stop() and not alive.should_stop()
        dump = fresh_dump(served.url, tmp_path)
        assert dump[ended_number]["intermediate"] == {}
        assert dump[alive_number]["intermediate"] == {0: 0.0, 1: 1.0, 2: 2.0}

    def test_a_zombie_attempt_cannot_overwrite_the_newer_result(self, kit, tmp_path):
        if not kit.relayed:
            pytest.skip("only the relay can fence an attempt: a direct writer is not asked")
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            task = make_task(served, tmp_path, trial_id, number)
            zombie = open_trial(task)
            zombie.report(0, value=0.1)
            newer = run_trial(TrialTask(**{**task.__dict__, "objective": "hpo.examples.toy:sleep",
                                           "config": {"sleep_s": 0}}))
            assert newer.state is TrialStatus.COMPLETE
            with pytest.raises(Halted):
                zombie.report(1, value=0.2)  # back after its trial ran again: refused
            assert zombie.should_stop()
            stored = StudyStore(served.storage, STUDY).trial(trial_id)
            assert stored.value == newer.value and 1 not in stored.intermediate_values
            assert stored.system_attrs[RUN_ATTR]["attempt"] == 2

    def test_a_decision_on_a_trial_its_attempt_ended_meanwhile_is_moot_not_an_error(self, kit, tmp_path):
        """The master gives up a trial it judged silent, or notes an event on
        it, just as its attempt ends it: the end stands, the master goes on."""
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            task = make_task(served, tmp_path, trial_id, number, objective="hpo.examples.toy:sleep")
            ended = run_trial(TrialTask(**{**task.__dict__, "config": {"sleep_s": 0}}))
            assert ended.state is TrialStatus.COMPLETE
            store = StudyStore(served.storage, STUDY)
            assert store.record_event(trial_id, "resumed", None, "picked") is False
            assert store.abandon(trial_id) is False
            stored = store.trial(trial_id)
            assert status_of(stored) is TrialStatus.COMPLETE and stored.value == ended.value
            assert hpo.store.records.last_sign_of_life(stored)  # not given up

    def test_the_study_decisions_are_not_the_users_attributes(self, kit, tmp_path):
        """optuna-dashboard lists a study's user attributes: the master's
        decisions are system attributes, and they still reach the trials."""
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            trial = open_trial(make_task(served, tmp_path, trial_id, number))
            store = StudyStore(served.storage, STUDY)
            store.set_contender(0.5)
            store.set_resize(trial_id, 2)
            store.set_stop({"reason": "target"})
            if kit.relayed:  # a direct writer reads the relay's control file instead
                trial.report(0, value=1.0)
                assert trial.should_stop()
        reader = _reader_storage(served.url)
        study_id = reader.get_study_id_from_name(STUDY)
        assert reader.get_study_user_attrs(study_id) == {}
        system_attrs = reader.get_study_system_attrs(study_id)
        assert {k: system_attrs[k] for k in (STOP_ATTR, CONTENDER_ATTR, RESIZE_ATTR)} == {
            STOP_ATTR: {"reason": "target"}, CONTENDER_ATTR: 0.5, RESIZE_ATTR: {str(trial_id): 2}}

    def test_the_study_decisions_of_an_earlier_store_still_count(self, kit, tmp_path):
        """Earlier stores kept the stop as a user attribute: a master opening
        one still stops its trials, and its own later word wins."""
        with kit.serving(tmp_path) as served:
            ((trial_id, number),) = created_trials(served, 1)
            study_id = served.storage.get_study_id_from_name(STUDY)
            served.storage.set_study_user_attr(study_id, STOP_ATTR, {"reason": "target"})
        with kit.serving(tmp_path) as served:  # the store opened again, as a resumed master does
            store = StudyStore(served.storage, STUDY)
            assert store.stop() == {"reason": "target"}
            if kit.relayed:
                stopped = open_trial(make_task(served, tmp_path, trial_id, number))
                stopped.report(0, value=1.0)
                assert stopped.should_stop()
            store.set_stop(None)
            assert store.stop() is None
            if kit.relayed:
                ((other_id, other_number),) = created_trials(served, 1)
                going_on = open_trial(make_task(served, tmp_path, other_id, other_number))
                going_on.report(0, value=1.0)
                assert not going_on.should_stop()

    def test_only_a_trial_an_attempt_runs_is_running_in_optuna(self, kit, tmp_path):
        """optuna-dashboard counts trials by Optuna's state: a queued or a
        suspended trial is WAITING, one an attempt runs is RUNNING."""
        waiting, running = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
        with kit.serving(tmp_path) as served:
            (_, _), (trial_id, number) = created_trials(served, 2)
            assert [t.state for t in _stored_trials(served.url)] == [waiting, waiting]
            task = make_task(served, tmp_path, trial_id, number)
            link = TrialLink(task.storage, trial_id, task.control)
            run = link.start({"host": "h", "pid": os.getpid()}, time.time(), 0,
                             {"run": {}, "heartbeat": None, "reports": [], "segments": []})["run"]
            link.report(0, {METRIC: 1.0}, 1.0)  # answered once durable, after the start (answered at once)
            queued, started = _stored_trials(served.url)
            assert (queued.state, started.state) == (waiting, running)
            assert queued.datetime_start is None and started.datetime_start is not None
            link.end(TrialStatus.SUSPENDED, None, {**run, "suspended": True})
            assert [t.state for t in _stored_trials(served.url)] == [waiting, waiting]
            assert status_of(_stored_trials(served.url)[1]) is TrialStatus.SUSPENDED


def _stored_trials(url: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials as a fresh reader (optuna-dashboard) sees them."""
    reader = _reader_storage(url)
    return reader.get_all_trials(reader.get_study_id_from_name(STUDY))


def _report_with(link_bytes: bytes, step: int) -> None:
    link = pickle.loads(link_bytes)
    link.report(step, {METRIC: float(step + 1)}, float(step + 1))


def _reader_storage(url: str) -> optuna.storages.BaseStorage:
    """A reader's storage, made afresh (``hpo status``, the dashboard)."""
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    return optuna.storages.JournalStorage(hpo.store.JournalFile(url))


def copy_asset(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)


__all__ = ["StoreKit", "StoreConformance", "Served", "copy_asset", "ASSETS", "ROOT", "toy_space"]
