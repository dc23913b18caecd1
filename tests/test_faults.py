"""The faults users meet on real clusters, with real signals, file systems and
sockets: a hung master and a second one, a full or read-only file system, a
journal deleted under a study, processes a trial leaves behind, an objective
that ends the master and a master killed from outside, a worker that hangs
yet stays connected (running a trial, or handed one), a hostile port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

import hpo
from hpo.trial import SILENT_HEARTBEATS, TrialStatus
from conftest import ROOT, stderr_of, tmpfs, toy_space, wait_for

pytestmark = pytest.mark.leaves_nothing_behind  # no process, thread, port or folder outlives a test

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HPO_HEARTBEAT_S": "1"}
QUALITIES = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]


def command(tmp_path: Path, space: dict, runs_dir: Path, *options: str) -> list[str]:
    path = tmp_path / "space.json"
    path.write_text(json.dumps(space))
    return [sys.executable, str(ROOT / "hpo_main.py"), str(path), "--runs-dir", str(runs_dir),
            "--quiet", *options]


def trials(run_dir: Path) -> list[hpo.TrialRecord]:
    try:
        return hpo.StudyResult.load(run_dir).trials
    except (hpo.UsageError, KeyError, ValueError, OSError):
        return []  # not created yet


def complete(run_dir: Path) -> list[hpo.TrialRecord]:
    return [t for t in trials(run_dir) if t.state is TrialStatus.COMPLETE]


def running_with_reports(run_dir: Path) -> bool:
    try:
        frozen = hpo.store.RunDir(run_dir).load_study().trials
    except (hpo.UsageError, KeyError, ValueError, OSError):
        return False
    return any(t.state.name == "RUNNING" and len(t.intermediate_values) >= 2 for t in frozen)


def assert_each_once(run_dir: Path, key: str, values: list) -> None:
    """Every configuration complete exactly once, nothing failed."""
    done = Counter(t.params[key] for t in complete(run_dir))
    assert sorted(done) == sorted(values) and set(done.values()) == {1}, \
        [(t.number, t.params, t.state.value, t.error) for t in trials(run_dir)]
    assert not [t for t in trials(run_dir) if t.state is TrialStatus.FAILED]


def end(proc: subprocess.Popen) -> None:
    """Stop a study this test started, and the processes it started, by PID."""
    if proc.poll() is None:
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        for child in family:
            try:
                child.kill()
            except psutil.Error:
                pass


# ------------------------------------------------------------ a hung master


# SIGSTOP then a second master, in every order: tests/test_fencing.py.


# ------------------------------------------------- the study's file system


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs of this test's own: a real file system to fill up or
    make read-only (needs root, as mounting does)."""
    with tmpfs(tmp_path / "fs", "16m") as mount:
        yield mount


def fill(mount: Path) -> Path:
    """Fill the file system to its last byte; the file that did it."""
    filler = mount / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


FS_SPACE = toy_space("fs", "hpo.examples.toy:curve", fixed={"steps": 8, "step_s": 0.2},
                     search={"parallel": 2}, space={"quality": QUALITIES[:6]})


@pytest.mark.parametrize("engine", ["inline", "dask"])
def test_a_full_file_system_stops_the_study_and_fails_no_trial(tmp_path, small_fs, engine):
    cmd = command(tmp_path, FS_SPACE, small_fs, "--engine", engine, *(["--workers", "2"] if engine == "dask" else []))
    run_dir = small_fs / "fs"
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: complete(run_dir) and running_with_reports(run_dir), what="a trial mid-way")
        filler = fill(small_fs)
        said = stderr_of(study, timeout=120)
    finally:
        end(study)
    # One message that names the file system and the fix; no trial blamed.
    assert study.returncode == 75, said
    assert "Traceback" not in said and "is full" in said and f"free space on {small_fs}" in said, said
    assert not [t for t in trials(run_dir) if t.state is TrialStatus.FAILED]
    # Space freed, the same command runs the configurations cut short again.
    filler.unlink()
    rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert_each_once(run_dir, "quality", QUALITIES[:6])


def test_a_journal_made_read_only_stops_the_study_with_a_message(tmp_path):
    """``chattr +i``: read-only even to root, as ``chmod a-w`` is to a user."""
    cmd = command(tmp_path, FS_SPACE, tmp_path / "runs", "--engine", "dask", "--workers", "2")
    run_dir = tmp_path / "runs" / "fs"
    journal = run_dir / "journal.log"
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: complete(run_dir) and running_with_reports(run_dir), what="a trial mid-way")
        made = subprocess.run(["chattr", "+i", str(journal)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make a file immutable here: {made.stderr.strip()}")
        said = stderr_of(study, timeout=120)
    finally:
        end(study)
        subprocess.run(["chattr", "-i", str(journal)], capture_output=True)
    assert study.returncode == 75, said
    assert "Traceback" not in said and "read-only" in said and "fix:" in said
    assert not [t for t in trials(run_dir) if t.state is TrialStatus.FAILED]
    rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert_each_once(run_dir, "quality", QUALITIES[:6])


def test_a_journal_deleted_under_the_study_is_never_begun_anew(tmp_path):
    cmd = command(tmp_path, FS_SPACE, tmp_path / "runs", "--engine", "dask", "--workers", "2")
    run_dir = tmp_path / "runs" / "fs"
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: complete(run_dir) and running_with_reports(run_dir), what="a trial mid-way")
        journal = run_dir / "journal.log"
        journal.unlink()
        said = stderr_of(study, timeout=120)
    finally:
        end(study)
    assert study.returncode == 75, said
    assert "Traceback" not in said and "journal was deleted" in said and "hpo repair" not in said
    # The same command refuses the run directory, with the fix, and starts nothing.
    rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 2, rerun.stderr
    assert "journal" in rerun.stderr and "missing" in rerun.stderr and "fix:" in rerun.stderr
    assert not journal.exists()


# ------------------------------------------- processes a trial leaves behind


SPACES = Path(__file__).with_name("fault_spaces")


@pytest.mark.parametrize("engine, resources, setsid, orphan", [
    ("inline", {}, False, False),  # the master's own process: what the trial's thread started
    ("dask", {}, False, True),  # a worker's process, a subreaper
    ("dask", {"time_limit_s": 120}, True, True),  # a process of the trial's own
], ids=["inline", "dask", "time-limit-setsid"])
def test_every_process_a_trial_started_ends_with_it(tmp_path, engine, resources, setsid, orphan):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    space = {"name": "leaky", "objective": "leaky:train", "metric": {"name": "value"},
             "search": {"algorithm": "grid", "parallel": 2}, "resources": resources,
             "fixed": {"pid_dir": str(pid_dir), "setsid": setsid, "orphan": orphan},
             "space": {"x": [1, 2, 3]}}
    options = ["--engine", engine] + (["--workers", "2"] if engine == "dask" else [])
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SPACES)])}
    ran = subprocess.run(command(tmp_path, space, tmp_path / "runs", *options), env=env,
                         capture_output=True, text=True, timeout=180)
    started = [int(p.read_text()) for p in pid_dir.iterdir()]
    left = [pid for pid in started if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)  # by PID: only what this test's objective started
    assert ran.returncode == 0, ran.stderr
    assert len(started) == 3 * (2 if orphan else 1)
    assert not left, f"processes left running after the study: {left}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------- an objective that ends the master


@pytest.mark.parametrize("objective, status, how", [
    ("exits:train", 3, "os._exit(3)"),
    ("crashes:train", -signal.SIGSEGV, "Segmentation fault"),
], ids=["os._exit", "native-crash"])
def test_a_trial_that_ended_the_master_twice_is_failed_and_the_study_goes_on(tmp_path, objective,
                                                                            status, how):
    space = {"name": "exits", "objective": objective, "metric": {"name": "value"},
             "search": {"algorithm": "grid", "parallel": 1}, "space": {"x": [1, 2, 3]}}
    cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "inline")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SPACES)])}
    first, second, third = (subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
                            for _ in range(3))
    assert first.returncode == second.returncode == status  # the objective's own end
    assert "running inside the master when it ended" in second.stderr and how in second.stderr
    assert third.returncode == 0, third.stderr
    by_x = {t.params["x"]: t for t in trials(tmp_path / "runs" / "exits")}
    assert by_x[1].state is by_x[3].state is TrialStatus.COMPLETE
    assert by_x[2].state is TrialStatus.FAILED and "ended while this trial ran inside it, 2 times" in by_x[2].error
    assert "--engine dask" in by_x[2].error


def test_a_master_killed_from_outside_twice_in_one_trial_does_not_fail_it(tmp_path):
    """SIGKILL (an out-of-memory kill, a preemption) is not the objective's
    doing: a healthy trial the inline master was killed in twice completes
    when the same command runs a third time."""
    space = toy_space("killed", "hpo.examples.toy:curve", fixed={"steps": 40, "step_s": 0.25},
                      search={"parallel": 1}, space={"quality": [1.0]})
    run_dir = tmp_path / "runs" / "killed"
    cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "inline")
    for attempt in (1, 2):
        study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: _reported_in_attempt(run_dir, attempt), what=f"attempt {attempt} to report")
            study.kill()
            study.wait()
        finally:
            end(study)
    third = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
    assert third.returncode == 0, third.stderr
    assert "not by the trial's doing" in third.stderr
    (trial,) = trials(run_dir)
    assert trial.state is TrialStatus.COMPLETE and trial.attempt == 3, (trial.state, trial.error)


def _reported_in_attempt(run_dir: Path, attempt: int) -> bool:
    """Whether the study's one trial runs its ``attempt`` and reported ``2 * attempt`` steps."""
    try:
        (trial,) = hpo.store.RunDir(run_dir).load_study().trials
    except (hpo.UsageError, ValueError, KeyError, OSError):
        return False
    run = trial.system_attrs.get("hpo:run") or {}
    return run.get("attempt") == attempt and len(trial.intermediate_values) >= 2 * attempt


# ------------------------------------------ a worker hung, still connected


@contextmanager
def _hung_worker_study(tmp_path: Path, name: str, workers: int) -> Iterator[subprocess.Popen]:
    """A one-trial study (the master's heartbeat 1 s) on a LocalCluster of
    ``workers``; the worker running its trial is stopped once it reported 3
    steps (SIGSTOP: alive, connected, silent). Yields the master's process."""
    from distributed import LocalCluster

    space = toy_space(name, "hpo.examples.toy:curve", fixed={"steps": 12, "step_s": 0.25},
                      search={"parallel": 1}, space={"quality": [1.0]})
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask",
                      "--scheduler", cluster.scheduler_address)
        study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        pid = None
        try:
            pid = wait_for(lambda: _reporting_pid(tmp_path / "runs" / name), what="the trial to report 3 steps")
            os.kill(pid, signal.SIGSTOP)
            yield study
        finally:
            end(study)
            if pid is not None:
                os.kill(pid, signal.SIGCONT)


def test_a_trial_on_a_hung_worker_runs_again_elsewhere(tmp_path):
    """A hung worker keeps its connection open, so Dask would wait minutes
    for it (worker-ttl); the trial's silent heartbeat is enough: the study
    ends well before, only if hpo ran the trial elsewhere."""
    with _hung_worker_study(tmp_path, "hungworker", workers=2) as study:
        said = stderr_of(study, timeout=120)
    assert study.returncode == 0, said
    assert "stopped answering for its trial" in said
    (trial,) = trials(tmp_path / "runs" / "hungworker")
    assert trial.state is TrialStatus.COMPLETE and trial.attempt == 2


def test_a_study_whose_last_worker_hung_says_it_waits_for_workers(tmp_path):
    """The only worker hangs: it is taken out, and the study, left without a
    worker, says it waits for one instead of waiting in silence."""
    said: list[str] = []
    with _hung_worker_study(tmp_path, "lastworker", workers=1) as study:
        threading.Thread(target=lambda: said.extend(study.stderr), daemon=True).start()
        wait_for(lambda: "fix: start workers" in "".join(said), timeout=120,
                 what="the study to say it has no worker left, and the fix")
    text = "".join(said)
    assert "no Dask worker is left in the cluster" in text and "Traceback" not in text


def test_a_task_handed_to_a_hung_worker_runs_on_another(tmp_path):
    """One of two workers is stopped before the study starts: Dask still
    counts on it and hands it tasks, which never start. hpo takes it out,
    and the study completes on the other worker while it is still stopped."""
    from distributed import Client, LocalCluster

    space = toy_space("handed", "hpo.examples.toy:curve", fixed={"steps": 3, "step_s": 0.1},
                      space={"quality": QUALITIES[:4]})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        with Client(cluster) as client:
            address, pid = sorted(client.run(os.getpid).items())[0]
        cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask",
                      "--scheduler", cluster.scheduler_address)
        os.kill(pid, signal.SIGSTOP)  # a worker of this test's own cluster
        try:
            study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
            try:
                said = stderr_of(study, timeout=120)
            finally:
                end(study)
        finally:
            os.kill(pid, signal.SIGCONT)
    assert study.returncode == 0, said
    assert f"Dask worker {address} stopped answering" in said and "Traceback" not in said, said
    assert_each_once(tmp_path / "runs" / "handed", "quality", QUALITIES[:4])


def _runs_one_and_holds_the_next(dask_scheduler) -> bool:
    return any(len(w.executing) == 1 and len(w.processing) >= 2 for w in dask_scheduler.workers.values())


def test_a_worker_held_up_past_a_silence_window_that_then_answers_keeps_its_tasks(tmp_path):
    """The worker's event loop is held up for longer than a silence window
    (as an import or a loaded machine holds it) while it holds a trial it
    has not started: Dask hears nothing from it, yet asked, it answers. It
    stays in the cluster, and the study completes on it."""
    from distributed import Client, LocalCluster

    space = toy_space("heldup", "hpo.examples.toy:curve", fixed={"steps": 6, "step_s": 1.0},
                      space={"quality": QUALITIES[:3]})
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster:
        cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask",
                      "--scheduler", cluster.scheduler_address)
        study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        try:
            with Client(cluster) as client:
                wait_for(lambda: client.run_on_scheduler(_runs_one_and_holds_the_next), timeout=120,
                         what="the worker to run a trial and hold the next")
                # On the worker's event loop: 1.5 windows without a heartbeat or an answer.
                client.run(time.sleep, 1.5 * SILENT_HEARTBEATS * float(ENV["HPO_HEARTBEAT_S"]))
            said = stderr_of(study, timeout=120)
        finally:
            end(study)
    assert study.returncode == 0, said
    assert "stopped answering" not in said and "Traceback" not in said, said
    assert_each_once(tmp_path / "runs" / "heldup", "quality", QUALITIES[:3])


def _reporting_pid(run_dir: Path) -> int | None:
    try:
        (trial,) = hpo.store.RunDir(run_dir).load_study().trials
    except (hpo.UsageError, ValueError, KeyError, OSError):
        return None
    run = trial.system_attrs.get("hpo:run")
    return run["pid"] if run and len(trial.intermediate_values) >= 3 else None


# ------------------------------------------------------- the relay's port


class AloneRelay:
    """A relay in a process of its own (tests/fault_spaces/relay_alone.py)."""

    def __init__(self, journal: Path, max_files: int | None = None) -> None:
        import resource

        def limit() -> None:
            if max_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

        self.proc = subprocess.Popen([sys.executable, str(SPACES / "relay_alone.py"), str(journal)],
                                     env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=limit)
        url = self.proc.stdout.readline().strip()
        host, port, self.token = hpo.store.split_relay(url)[1].rsplit(":", 2)
        self.address = (host, int(port))

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def rss(self) -> int:
        return int(self.ask("rss"))

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _hello(token: str) -> bytes:
    data = json.dumps({"hello": token, "v": 1}).encode()
    return len(data).to_bytes(4, "big") + data


def _send_until_closed(sock, data: bytes, total: int) -> int:
    """Bytes sent before the relay closed the connection (``total`` at most)."""
    sent = 0
    try:
        while sent < total:
            sent += sock.send(data)
    except OSError:
        pass
    return sent


def test_strangers_on_the_port_cannot_grow_the_master(tmp_path):
    """No bytes are kept from a client that has not said hello with the token:
    a 1 GB length prefix then 300 MB, and 40 strangers announcing 4 MB frames,
    grow the relay's process by next to nothing; the study goes on."""
    import socket

    relay = AloneRelay(tmp_path / "journal.log")
    try:
        before = relay.rss()
        chunk = b"x" * (1 << 20)
        with socket.create_connection(relay.address) as sock:
            sock.settimeout(30)
            sock.sendall((1 << 30).to_bytes(4, "big"))
            assert _send_until_closed(sock, chunk, 300 << 20) < 300 << 20  # dropped, not read
        strangers = [socket.create_connection(relay.address) for _ in range(40)]
        for sock in strangers:
            sock.settimeout(30)
            sock.sendall((4 << 20).to_bytes(4, "big") + b"{" * (1 << 16))
        for sock in strangers:
            assert _send_until_closed(sock, chunk, 4 << 20) < 4 << 20
            sock.close()
        assert relay.rss() - before < 32 << 20
        assert relay.ask("trial").startswith("ok")
    finally:
        relay.close()


def test_more_connections_than_files_leave_the_relay_serving(tmp_path):
    """With 1,024 files (a common HPC default), 1,100 idle connections: the
    relay keeps serving the client it had and its master, and takes new
    clients again once the idle ones are gone."""
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"this process may open {hard} files, 1,100 connections need more")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300) if hard == resource.RLIM_INFINITY
                                                else min(hard, max(soft, 1300)), hard))
    relay = AloneRelay(tmp_path / "journal.log", max_files=1024)
    idle: list[socket.socket] = []
    try:
        client = socket.create_connection(relay.address)
        client.settimeout(30)
        client.sendall(_hello(relay.token))
        assert client.recv(1 << 16)  # the hello's answer
        for _ in range(1100):
            try:
                idle.append(socket.create_connection(relay.address, timeout=5))
            except OSError:
                break  # the relay's backlog is full: it is at its cap
        assert len(idle) >= 1024
        assert relay.ask("trial").startswith("ok")  # the master's own writes go on
        poll = json.dumps({"id": 1, "op": "poll"}).encode()
        client.sendall(len(poll).to_bytes(4, "big") + poll)
        assert client.recv(1 << 16)  # and the client it had is answered
        for sock in idle:
            sock.close()
        idle.clear()

        def served() -> bool:
            try:
                with socket.create_connection(relay.address, timeout=5) as new:
                    new.settimeout(5)
                    new.sendall(_hello(relay.token))
                    return bool(new.recv(1 << 16))
            except OSError:
                return False

        wait_for(served, what="a new client to be served")
        assert relay.proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        relay.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --------------------------------------- a clean stop leaves no clutter


def test_a_clean_stop_hands_back_the_trials_it_never_started(tmp_path):
    """SIGTERM (scancel, the walltime): the trials queued but never started
    are not counted as cancelled work, and the next run starts them as they
    are: one trial per configuration over the whole chain of runs."""
    space = toy_space("chain", "hpo.examples.toy:curve", fixed={"steps": 6, "step_s": 0.3},
                      space={"quality": QUALITIES[:6]})
    run_dir = tmp_path / "runs" / "chain"
    cmd = command(tmp_path, space, tmp_path / "runs", "--engine", "dask", "--workers", "2")
    study = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: running_with_reports(run_dir), what="a trial mid-way")
        study.send_signal(signal.SIGTERM)
        said = stderr_of(study, timeout=120)
    finally:
        end(study)
    assert study.returncode == 143, said
    states = Counter(t.state for t in trials(run_dir))
    assert TrialStatus.CANCELLED not in states and states[TrialStatus.PENDING] >= 1, states
    rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert len(trials(run_dir)) == 6
    assert_each_once(run_dir, "quality", QUALITIES[:6])
