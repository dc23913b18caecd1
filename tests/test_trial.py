"""The trial wrapper: every outcome becomes a durable record, never an engine
failure; the attempt writes through the study's relay and never reads the store."""

from __future__ import annotations

import calendar
import errno
import fcntl
import os
import socket
import tempfile
import threading
import time

import optuna
import pytest

import hpo.trial._run
from hpo.master import median_pruning
from hpo.store import Halted, StudyRelay, StudyStore, TrialLink, split_relay
from hpo.store.records import ENDED_BY_ATTR, EVENT_ATTR, HEARTBEAT_ATTR, REPORT_ATTR, RUN_ATTR
from hpo.trial import Trial, TrialStatus, TrialTask, run_trial
from hpo.trial._attempt import TaskInterrupted
from conftest import wait_for


@pytest.fixture
def relay(tmp_path, request):
    """The study "s" behind a relay, as a master serves it; a test may ask
    for a pruner with ``@pytest.mark.pruning(...)``."""
    marker = request.node.get_closest_marker("pruning")
    pruning = marker.args[0] if marker else None
    with StudyRelay(str(tmp_path / "journal.log"), "s", pruning=pruning,
                    control=tmp_path / "control.json") as served:
        optuna.create_study(study_name="s", storage=served.storage, direction="maximize")
        yield served


def make_task(relay, tmp_path, objective, config=None, **settings) -> TrialTask:
    """A trial created by the master and its task, as the master fills it."""
    store = StudyStore(relay.storage, "s")
    trial_id, number = store.create_trial({}, {})
    return TrialTask(storage=relay.writers_url, study_name="s", trial_id=trial_id, number=number,
                     config=config or {}, objective=objective, metric="value",
                     checkpoint_dir=str(tmp_path / "trials" / str(number)),
                     control=str(tmp_path / "control.json"), **settings)


def fresh(task: TrialTask) -> optuna.trial.FrozenTrial:
    """Read the trial back through a new storage object: what is on disk."""
    backend = optuna.storages.journal.JournalFileBackend(split_relay(task.storage)[0])
    return optuna.storages.JournalStorage(backend).get_trial(task.trial_id)


def test_complete_trial_is_recorded_durably(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:quadratic", {"x": 2, "y": -1, "steps": 4}, cpus=3)
    outcome = run_trial(task)
    stored = fresh(task)
    run = stored.system_attrs[RUN_ATTR]
    assert outcome.state is TrialStatus.COMPLETE and outcome.value == pytest.approx(0.0)
    assert stored.state == optuna.trial.TrialState.COMPLETE and stored.value == pytest.approx(0.0)
    assert stored.intermediate_values == {0: -0.75, 1: -0.5, 2: -0.25, 3: 0.0}
    assert stored.system_attrs[f"{REPORT_ATTR}000002"] == {"value": -0.25}
    assert stored.user_attrs == {}  # the user's: hpo keeps its records in system attributes
    assert run["host"] == socket.gethostname() and run["pid"] == os.getpid()
    assert run["attempt"] == 1 and run["ended_at"] >= run["started_at"] and run["token"]
    assert run["core_seconds"] == pytest.approx(3 * run["duration_s"]) and run["gpu_seconds"] == 0
    assert run["metrics"] == {"value": 0.0} and run["error"] is None
    assert not os.path.exists(task.checkpoint_dir)  # it printed and kept nothing: no folder made


def test_a_trial_folder_and_log_are_made_once_the_objective_prints_or_asks_for_its_folder(relay, tmp_path):
    (tmp_path / "talky.py").write_text(
        "import time\n"
        "def talk(config, trial):\n"
        "    time.sleep(0.05)\n"
        "    print('epoch 0: loss 1.5')\n"
        "    return 1.0\n"
        "def keep(config, trial):\n"
        "    (trial.checkpoint_dir / 'model.txt').write_text('weights')\n"
        "    return 1.0\n")
    code = str(tmp_path)
    talked = make_task(relay, tmp_path, "talky:talk", pythonpath=(code,))
    before = time.time()
    assert run_trial(talked).state is TrialStatus.COMPLETE
    header, line = (tmp_path / "trials" / str(talked.number) / "output.log").read_text().splitlines()
    assert header.startswith(f"--- trial {talked.number}, pid {os.getpid()}, ") and line == "epoch 0: loss 1.5"
    stamp = header.rsplit(", ", 1)[1].removesuffix(" ---")  # the attempt's start, not the print's
    assert abs(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S UTC")) - before) < 2

    kept = make_task(relay, tmp_path, "talky:keep", pythonpath=(code,))
    assert run_trial(kept).state is TrialStatus.COMPLETE
    folder = tmp_path / "trials" / str(kept.number)
    assert (folder / "model.txt").read_text() == "weights" and not (folder / "output.log").exists()

    failed = make_task(relay, tmp_path, "hpo.examples.toy:fail", {"fail": True})
    assert run_trial(failed).state is TrialStatus.FAILED
    log = (tmp_path / "trials" / str(failed.number) / "output.log").read_text()
    assert log.startswith(f"--- trial {failed.number}, ") and "RuntimeError: boom" in log


def test_on_the_masters_host_a_task_is_over_before_its_end_is_durable_and_settle_makes_it_so(relay, tmp_path):
    gate, holding = threading.Event(), threading.Event()

    def hold_the_relay():
        holding.set()
        gate.wait(60)

    def objective(config, trial):
        threading.Thread(target=relay._on_relay_thread, args=(hold_the_relay,), daemon=True).start()
        holding.wait(60)  # from now on the relay writes nothing until the gate opens
        return 1.0

    task = make_task(relay, tmp_path, objective, end_waits=False)
    try:
        outcome = run_trial(task)  # its slot is free: the end is in the relay's queue, not on disk
        assert outcome.state is TrialStatus.COMPLETE and outcome.value == 1.0
        assert fresh(task).state == optuna.trial.TrialState.RUNNING
    finally:
        gate.set()
    relay.settle()  # what the master does before it reads a returned task's trial
    assert relay.storage.get_trial(task.trial_id).state == optuna.trial.TrialState.COMPLETE
    assert fresh(task).state == optuna.trial.TrialState.COMPLETE and fresh(task).value == 1.0


def test_a_posted_end_is_written_without_a_settle_when_no_request_follows_it(relay, tmp_path):
    # The relay holds a posted end for the next round it can share; with
    # none coming, it writes it alone a moment later.
    task = make_task(relay, tmp_path, lambda config, trial: 2.0, end_waits=False)
    assert run_trial(task).state is TrialStatus.COMPLETE
    # (Its start too may still be on its way to disk: the relay answers a start before writing it.)
    ended = wait_for(lambda: (lambda t: t.state.is_finished() and t)(fresh(task)),
                     what="the posted end on disk")
    assert ended.state == optuna.trial.TrialState.COMPLETE and ended.value == 2.0


@pytest.mark.parametrize("objective, config, state, error_type, words", [
    ("hpo.examples.toy:fail", {"fail": True}, TrialStatus.FAILED, "RuntimeError", "boom"),
    ("hpo.examples.toy:nan", {}, TrialStatus.FAILED, "NonFiniteValue", "nan"),
    ("hpo.examples.toy:sleep", {"sleep_s": 0}, TrialStatus.COMPLETE, None, None),
    ("hpo.examples.sklearn_digits:no_such_function", {}, TrialStatus.FAILED, "SpaceError", "no callable"),
])
def test_user_errors_become_failed_records(relay, tmp_path, objective, config, state, error_type, words):
    task = make_task(relay, tmp_path, objective, config)
    outcome = run_trial(task)  # never raises because of user code
    run = fresh(task).system_attrs[RUN_ATTR]
    assert outcome.state is state
    if error_type:
        assert run["error"]["type"] == error_type and words in run["error"]["message"]
    if error_type == "RuntimeError":
        assert "Traceback" in run["error"]["traceback"] and "toy.py" in run["error"]["traceback"]


def test_wrong_return_values_fail_with_the_reason(relay, tmp_path):
    task = make_task(relay, tmp_path, lambda config, trial: {"accuracy": 0.9})
    assert run_trial(task).state is TrialStatus.FAILED
    error = fresh(task).system_attrs[RUN_ATTR]["error"]
    assert error["type"] == "BadReturnValue" and "'value'" in error["message"]
    task = make_task(relay, tmp_path, lambda config, trial: "good")
    assert run_trial(task).state is TrialStatus.FAILED


def test_time_limit_kills_the_trial_and_records_timeout(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 60},
                     time_limit_s=1.5, isolate=True)
    outcome = run_trial(task)
    run = fresh(task).system_attrs[RUN_ATTR]
    assert outcome.state is TrialStatus.TIMEOUT
    assert run["timed_out"] and run["error"]["type"] == "TimeLimit"


def test_isolated_trial_reports_from_its_own_process_in_its_parents_attempt(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:quadratic", {"x": 1, "y": -1}, isolate=True)
    outcome = run_trial(task)
    assert outcome.state is TrialStatus.COMPLETE and outcome.value == pytest.approx(-1.0)
    stored = fresh(task)
    assert len(stored.intermediate_values) == 3 and stored.system_attrs[RUN_ATTR]["attempt"] == 1


def test_a_finished_trial_run_again_is_counted_once_and_not_run(relay, tmp_path):
    ran = tmp_path / "ran"

    def counted(config, trial):
        with ran.open("a") as f:
            f.write("x")
        return 1.0

    task = make_task(relay, tmp_path, counted)
    first = run_trial(task)
    second = run_trial(task)  # e.g. an engine retry after the result was stored
    assert second == first and fresh(task).system_attrs[RUN_ATTR]["attempt"] == 1
    assert ran.read_text() == "x"  # the relay refused the second start


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a trial is pinned only where its process has more cores")
def test_a_start_refused_while_its_cores_were_claimed_gives_them_back_and_runs_nothing(relay, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a claims folder of its own
    ran = tmp_path / "ran"

    def counted(config, trial):
        with ran.open("a") as f:
            f.write("x")
        return 1.0

    task = make_task(relay, tmp_path, counted, cpus=1)
    assert run_trial(task).state is TrialStatus.COMPLETE
    before = os.sched_getaffinity(0)
    # Run again, its cores are claimed while the relay answers the start: it refuses it.
    assert run_trial(task).state is TrialStatus.COMPLETE and ran.read_text() == "x"
    assert os.sched_getaffinity(0) == before
    claims = list((tmp_path / f"hpo-cores-{os.getuid()}").iterdir())
    assert claims  # the cores were claimed, and each is free again
    for claim in claims:
        with claim.open("rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_an_attempt_after_a_lost_worker_keeps_the_history(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0})
    lost = {"host": "node7", "pid": 1, "attempt": 1, "started_at": 1.0, "previous": []}
    # Written where studies before kept it (a user attribute): read all the same.
    relay.storage.set_trial_user_attr(task.trial_id, RUN_ATTR, lost)
    run_trial(task)
    stored = fresh(task)
    run = stored.system_attrs[RUN_ATTR]
    assert run["attempt"] == 2 and run["previous"][0]["host"] == "node7"
    events = [v for k, v in stored.system_attrs.items() if k.startswith(EVENT_ATTR)]
    assert [e["kind"] for e in events] == ["retried"] and "node7" in events[0]["reason"]


def test_should_stop_sees_the_study_stop(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:quadratic", {"x": 0, "steps": 50})
    StudyStore(relay.storage, "s").set_stop({"reason": "target"})
    run_trial(task)
    stored = fresh(task)
    assert len(stored.intermediate_values) == 1  # stopped at its first report
    assert TrialStatus.of(stored) is TrialStatus.STOPPED  # not failed: it has its value
    assert stored.value == stored.intermediate_values[0]
    assert stored.system_attrs[RUN_ATTR]["stop_reason"] == "stopped: target"
    events = [v for k, v in stored.system_attrs.items() if k.startswith(EVENT_ATTR)]
    assert [(e["kind"], e["step"]) for e in events] == [("stopped", 0)]


@pytest.mark.pruning(median_pruning(min_steps=0, maximize=True, study_name="s", metric="value"))
def test_the_masters_median_pruner_prunes_a_clearly_worse_curve(relay, tmp_path):
    for x in (2, 2):
        run_trial(make_task(relay, tmp_path, "hpo.examples.toy:quadratic", {"x": x, "y": -1, "steps": 6}))
    bad = make_task(relay, tmp_path, "hpo.examples.toy:quadratic", {"x": -20, "y": -1, "steps": 6})
    assert run_trial(bad).state is TrialStatus.PRUNED
    stored = fresh(bad)
    assert len(stored.intermediate_values) == 1
    assert stored.system_attrs[RUN_ATTR]["stop_reason"] == "pruned"
    (event,) = [v for k, v in stored.system_attrs.items() if k.startswith(EVENT_ATTR)]
    assert event["kind"] == "pruned" and event["reason"].startswith("median pruner: value=")


def test_report_rejects_wrong_types_precisely():
    trial = Trial(0, {})
    with pytest.raises(TypeError, match="step must be an int"):
        trial.report(-1, value=1.0)
    with pytest.raises(TypeError, match="metric 'acc' must be a number"):
        trial.report(0, acc="high")
    trial.report(0, acc=0.5, loss=1)
    assert trial.reports == [(0, {"acc": 0.5, "loss": 1.0})] and not trial.should_stop()


def test_isolated_trial_returning_something_unpicklable_fails_clearly(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0}, isolate=True)
    task = TrialTask(**{**task.__dict__, "objective": lambda config, trial: (lambda: 1)})
    assert run_trial(task).state is TrialStatus.FAILED
    error = fresh(task).system_attrs[RUN_ATTR]["error"]
    assert error["type"] == "BadReturnValue" and "lambda" in error["message"]


def test_the_master_sees_the_trial_running_while_its_objective_runs(relay, tmp_path):
    # The relay answers a start at once and writes it with its round: the
    # objective does not wait for the fsync, and the master sees it started.
    store = StudyStore(relay.storage, "s")
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep")

    def objective(config, trial):
        wait_for(lambda: TrialStatus.of(store.trial(task.trial_id)) is TrialStatus.RUNNING,
                 timeout=30, what="the master's replica to see the trial running")
        return 1.0

    task = TrialTask(**{**task.__dict__, "objective": objective})
    assert run_trial(task).value == 1.0
    run = fresh(task).system_attrs[RUN_ATTR]
    assert run["attempt"] == 1 and run["started_at"] <= run["ended_at"]


def test_heartbeats_are_written_while_the_objective_runs_and_end_with_its_task(relay, tmp_path,
                                                                              monkeypatch):
    from hpo.trial._pulse import _Pulse

    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.05")

    def beaten(config, trial):  # returns once a beat of its own is in the store
        wait_for(lambda: isinstance(fresh(task).system_attrs.get(HEARTBEAT_ATTR), float),
                 timeout=30, what="a heartbeat")
        return 1.0

    task = make_task(relay, tmp_path, beaten)
    assert run_trial(task).state is TrialStatus.COMPLETE
    assert _Pulse.here()._beats == []  # nothing left to beat for: no beat after its end


def test_a_cancelled_task_is_given_up_and_no_beat_follows(relay, tmp_path, monkeypatch):
    from hpo.trial._pulse import _Pulse

    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.02")

    def cancelled(task, token, context):
        wait_for(lambda: isinstance(fresh(task).system_attrs.get(HEARTBEAT_ATTR), float),
                 timeout=30, what="a heartbeat")  # beats meanwhile
        raise TaskInterrupted("CancelError")

    monkeypatch.setattr(hpo.trial._run, "run_here", cancelled)
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep")
    assert run_trial(task).state is TrialStatus.RUNNING  # given up, to be resumed at once
    assert _Pulse.here()._beats == []
    stored = fresh(task)
    assert "abandoned_at" in stored.system_attrs[HEARTBEAT_ATTR]
    assert stored.system_attrs[RUN_ATTR]["error"]["type"] == "Cancelled"


def test_a_disk_full_before_the_objective_starts_gives_the_trial_up_without_raising(relay, tmp_path,
                                                                                    monkeypatch):
    """The trial's log cannot be opened (ENOSPC): the machine's fault, handed
    to the master as such, with no exception for the engine to log."""
    import hpo.trial._attempt

    def full(checkpoint_dir, header=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(checkpoint_dir))

    monkeypatch.setattr(hpo.trial._attempt, "trial_log", full)
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep", {"sleep_s": 0})
    assert run_trial(task).state is TrialStatus.RUNNING  # given up, to be resumed
    error = fresh(task).system_attrs[RUN_ATTR]["error"]
    assert error["errno"] == errno.ENOSPC and error["filename"] == task.checkpoint_dir
    assert fresh(task).state == optuna.trial.TrialState.RUNNING


def test_a_trial_ended_by_the_master_meanwhile_keeps_the_stored_end(relay, tmp_path):
    store = StudyStore(relay.storage, "s")

    def cancelled_meanwhile(config, trial):  # as end_without_result does when a study stops
        store.end_without_result(task.trial_id, "cancelled", "study stopped")
        trial.report(0, value=1.0)  # refused to this trial: it has ended
        return 1.0 if trial.should_stop() else 0.0

    task = make_task(relay, tmp_path, cancelled_meanwhile)
    assert run_trial(task).state is TrialStatus.CANCELLED
    stored = fresh(task)
    assert stored.system_attrs[ENDED_BY_ATTR]["reason"] == "cancelled"
    assert stored.intermediate_values == {}


def test_a_link_refused_by_the_relay_raises_halted(relay, tmp_path):
    task = make_task(relay, tmp_path, "hpo.examples.toy:sleep")
    link = TrialLink(task.storage, task.trial_id, task.control)
    with pytest.raises(Halted) as refused:
        link.report(0, {"value": 1.0}, 1.0)  # no attempt started under this token
    assert refused.value.why == "superseded"
