"""hpo's reading of Optuna's journal format against Optuna's own.

For seeded random histories of writes (attempts writing around the relay,
through a relay, a torn tail, writers in threads), what the relay's ledger
(:class:`JournalLedger`) makes of each trial of the file must be what
Optuna's replay of the same file says.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import optuna
import pytest

from hpo.store import JournalFile, StudyRelay, StudyStore, TrialLink
from hpo.store._format import Op
from hpo.store._ledger import JournalLedger
from hpo.store.records import (
    HEARTBEAT_ATTR, TrialStatus, attr_of, end_run, event_key, event_record, grouped_attrs, run_of,
    status_of,
)

EMPTY = {"run": {}, "heartbeat": None, "reports": [], "segments": []}
ENDS = [TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.FAILED, TrialStatus.SUSPENDED,
        "give_up", None]


def test_op_codes_are_optunas():
    from optuna.storages.journal._storage import JournalOperation  # the test may look inside

    ours = {op.name: op.value for op in Op}
    assert all(ours.get(op.name) == op.value for op in JournalOperation)  # an older one knows fewer


def _history(rng: random.Random, url: str, trial_id: int) -> None:
    """A random life of one trial: attempts that report, beat and note, and
    end (or suspend and come back, give up, or stay running)."""
    for attempt in range(rng.randint(1, 3)):
        begun = 10.0 * attempt + 1  # each attempt after the one before
        link = TrialLink(url, trial_id)
        run = link.start({"host": "h", "pid": os.getpid()}, begun, 0, EMPTY)["run"]
        for step in range(rng.randint(0, 6)):
            value = rng.choice([None, rng.random()])
            link.report(step, {"value": rng.random()}, value)
            if rng.random() < 0.3:
                link.beat(begun + step)
            if rng.random() < 0.2:
                link.event(event_key(step, 1), event_record("resumed", step, "a test", "h", 1.0))
        end = rng.choice(ENDS)
        if end is None:
            return  # left running
        if end == "give_up":
            link.give_up(None, (event_key(99, 1), event_record("resumed", None, "gone", "h", begun)), begun + 8)
            return
        value = rng.random()
        record = end_run(run, begun + 8, 0, metrics={"value": value}, error=None, stop_reason=None,
                         timed_out=False, suspended=end == TrialStatus.SUSPENDED)
        link.end(end, [value] if end == TrialStatus.COMPLETE else None, record)
        if end != TrialStatus.SUSPENDED:
            return


def _assert_ledger_is_optunas(path: Path, name: str = "s") -> None:
    ledger = JournalLedger(name)
    for record in JournalFile(str(path)).read_logs(0):
        ledger.apply(record)
    storage = optuna.storages.JournalStorage(JournalFile(str(path)))
    trials = storage.get_all_trials(storage.get_study_id_from_name(name))
    assert trials
    for trial in trials:
        trial_id = StudyStore.trial_id(trial)
        live, ended = ledger.live(trial_id), ledger.ended(trial_id)
        if trial.state.is_finished():
            assert live is None
            assert ended == (status_of(trial).value, trial.values[0] if trial.values else None)
            continue
        assert ended is None and live is not None
        assert (live.number, live.run, live.heartbeat) == (trial.number, run_of(trial),
                                                           attr_of(trial, HEARTBEAT_ATTR))
        assert live.values == trial.intermediate_values
        assert sorted(live.reports.items()) == sorted(grouped_attrs(trial).reports)
    after = max(StudyStore.trial_id(t) for t in trials) + 1
    assert ledger.live(after) is None and ledger.ended(after) is None


def _direct_study(path: Path, trials: int) -> list[int]:
    storage = optuna.storages.JournalStorage(JournalFile(str(path)))
    optuna.create_study(study_name="s", storage=storage, direction="maximize")
    return [i for i, _ in StudyStore(storage, "s").create_trials([({}, {})] * trials)]


@pytest.mark.parametrize("seed", range(4))
def test_direct_appends_read_as_optuna_reads_them(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "journal.log"
    for trial_id in _direct_study(path, 6):
        _history(rng, str(path), trial_id)
    _assert_ledger_is_optunas(path)


@pytest.mark.parametrize("seed", range(3))
def test_relayed_and_direct_appends_read_as_optuna_reads_them(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "journal.log"
    with StudyRelay(str(path), "s") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, direction="maximize")
        store = StudyStore(relay.storage, "s")
        for _ in range(6):
            trial_id, _ = store.create_trial({}, {})
            _history(rng, rng.choice([relay.writers_url, relay.url]), trial_id)
    _assert_ledger_is_optunas(path)


@pytest.mark.parametrize("then_append", [False, True])
def test_a_torn_tail_reads_as_optuna_reads_it(tmp_path, then_append):
    rng = random.Random(7)
    path = tmp_path / "journal.log"
    ids = _direct_study(path, 3)
    _history(rng, str(path), ids[0])
    with open(path, "ab") as f:
        f.write(b'{"op_code":7,"worker_id":"cut","trial_id":%d,"st' % ids[0])
    if then_append:  # the next writer sets the tail aside first
        _history(rng, str(path), ids[1])
    _assert_ledger_is_optunas(path)


def test_writers_in_threads_read_as_optuna_reads_them(tmp_path):
    path = tmp_path / "journal.log"
    with StudyRelay(str(path), "s") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, direction="maximize")
        ids = [i for i, _ in StudyStore(relay.storage, "s").create_trials([({}, {})] * 6)]
        urls = [relay.writers_url, relay.url] * 3  # half through the relay, half around it
        failures: list[BaseException] = []

        def writer(n: int, url: str, trial_id: int) -> None:
            try:
                _history(random.Random(n), url, trial_id)
            except BaseException as exc:  # the test fails with it below
                failures.append(exc)

        threads = [threading.Thread(target=writer, args=(n, url, trial_id))
                   for n, (url, trial_id) in enumerate(zip(urls, ids))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
    _assert_ledger_is_optunas(path)


def test_a_trials_last_system_attributes_are_read_in_either_spelling_and_a_torn_line_is_skipped():
    """What an attempt starting around the relay reads of its trial: the last
    value of each attribute, from hpo's compact lines or Optuna's spaced
    ones, another trial's and a torn tail left out."""
    from hpo.store._format import last_trial_system_attrs

    data = (b'{"op_code":9,"worker_id":"w","trial_id":3,"system_attr":{"hpo:run":{"attempt":1}}}\n'
            b'{"op_code": 9, "worker_id": "o", "trial_id": 3, "system_attr": {"hpo:heartbeat": 5.0}}\n'
            b'{"op_code":9,"worker_id":"w","trial_id":13,"system_attr":{"hpo:run":{"attempt":7}}}\n'
            b'{"op_code":9,"worker_id":"w","trial_id":3,"system_attr":{"hpo:run":{"attempt":2}}}\n'
            b'{"op_code":9,"worker_id":"w","trial_id":3,"system_attr":{"hpo:run":{"att')
    assert last_trial_system_attrs(data, 3, ("hpo:run", "hpo:heartbeat", "hpo:none")) == {
        "hpo:run": {"attempt": 2}, "hpo:heartbeat": 5.0}
