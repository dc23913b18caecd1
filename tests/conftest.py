"""Shared fixtures: a real multi-process Dask cluster and the PyCOMPSs double."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
COMPSS_DOUBLE = Path(__file__).parent / "compss_double"
STORAGE_SPY = Path(__file__).parent / "storage_spy"
# Not test modules: the double must only be importable inside the ``compss``
# fixture (collecting its docstrings would leave it on sys.path for good).
collect_ignore = ["compss_double", "engine_driver.py", "storage_spy"]


# -- what a session leaves, and what a test leaves ------------------------------------


def pytest_sessionstart(session) -> None:
    """The session's temporary files in a folder of its own, removed at its
    end: doctests make folders as a user would (``tempfile.mkdtemp()``), and
    the processes the tests start inherit the folder. pytest's own
    ``tmp_path`` tree stays where it was."""
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    # Dask's scratch space too: its workers clean theirs up as the interpreter exits.
    os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", tempfile.gettempdir())
    if "dask" in sys.modules:
        import dask

        dask.config.refresh()
    folder = tempfile.mkdtemp(prefix="hpo-tests-")
    os.chmod(folder, 0o1777)  # as /tmp: the PostgreSQL server's user makes its folder here
    session.config.stash[_SESSION_TMP] = folder
    os.environ["TMPDIR"] = tempfile.tempdir = folder


def pytest_sessionfinish(session) -> None:
    folder = session.config.stash.get(_SESSION_TMP, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


_SESSION_TMP = pytest.StashKey[str]()

#: The slowest modules, slowest first (seconds in one of three processes: 173
#: to 32). Test processes take modules in collection order (make test turns
#: off xdist's own order, by number of tests): started first, these no
#: longer leave one process running alone at the end.
SLOWEST_FIRST = ("test_exactly_once", "test_slurm", "test_engines", "test_store_conformance",
                 "test_dashboard_browser", "test_torch", "test_faults", "test_fencing",
                 "test_slurm_faults", "test_cli", "test_chaos", "test_bad_input", "test_allocation",
                 "test_first_week", "test_docs", "test_e2e", "test_dashboard", "test_poisoned_store",
                 "test_fault_tolerance", "test_engine_dask")


def pytest_collection_modifyitems(session, config, items) -> None:
    """The slowest modules first, each module's tests in their own order."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def module_rank(item) -> int:
        return rank.get(Path(str(item.fspath)).stem, len(rank))

    items.sort(key=module_rank)  # stable: the order within a module, and of the others, is kept


@pytest.fixture(autouse=True)
def leaves_nothing_behind(request):
    """After each test marked ``leaves_nothing_behind`` (engines, faults): no
    process, thread, listening port or temporary folder it started is left
    (``tests/leaks.py``)."""
    if request.node.get_closest_marker("leaves_nothing_behind") is None:
        yield
        return
    from leaks import Footprint, check_left

    before = Footprint.now()
    yield
    left = check_left(before)
    if left:
        pytest.fail("the test left behind:\n  " + "\n  ".join(left), pytrace=False)


@pytest.fixture(scope="module")
def dask_address():
    """A LocalCluster of 2 worker processes (1 thread, CPU=1 each) on
    127.0.0.1, one per test module: a module's kills and stopped workers
    end with it."""
    from distributed import LocalCluster

    from leaks import owned_by_fixture

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"CPU": 1}) as cluster, \
            owned_by_fixture(lambda: [n.pid for n in list(cluster.workers.values()) if n.pid]):
        yield cluster.scheduler_address


@pytest.fixture
def worker_pids(dask_address):
    """The PIDs of the cluster's worker processes."""
    from distributed import Client

    with Client(dask_address) as client:
        return set(client.run(os.getpid).values())


@pytest.fixture
def compss(monkeypatch):
    """The pycompss test double on sys.path; yields its runtime control module."""
    monkeypatch.syspath_prepend(str(COMPSS_DOUBLE))
    _forget_compss()
    from pycompss import runtime

    yield runtime
    runtime.stop()
    _forget_compss()


def _forget_compss() -> None:
    for name in list(sys.modules):
        if name.startswith("pycompss") or name == "hpo.engines._compss_tasks":
            del sys.modules[name]
    import hpo.engines

    vars(hpo.engines).pop("_compss_tasks", None)  # the package keeps its submodule too


def toy_space(name: str, objective: str = "hpo.examples.toy:quadratic", **extra) -> dict:
    """A small full-form space over the toy objectives."""
    space = {
        "name": name, "objective": objective, "metric": {"name": "value"},
        "search": {"algorithm": "grid", "parallel": 2},
        "space": {"x": [0, 1, 2, 3], "y": [-1, 0]},
    }
    for key, value in extra.items():
        if key in ("search", "metric") and isinstance(value, dict):
            space[key] = {**space[key], **value}
        else:
            space[key] = value
    return space


class ServedStudy:
    """A study behind its relay, as a master serves it: tasks filled as the
    master fills them (:func:`served_study`)."""

    def __init__(self, relay, name: str, control: Path) -> None:
        from hpo.store import StudyStore

        self.relay, self.name, self.control = relay, name, control
        self.store = StudyStore(relay.storage, name)

    def new_trial(self) -> tuple[int, int]:
        return self.store.create_trial({}, {})

    def task(self, trial_id: int, number: int, **fields):
        """The task of a trial, with the replica's view of it (its context)."""
        from hpo.store import context_of
        from hpo.trial import TrialTask

        return TrialTask(storage=self.relay.writers_url, study_name=self.name, trial_id=trial_id,
                         number=number, control=str(self.control),
                         context=context_of(self.store.trial(trial_id)), **fields)


@contextmanager
def served_study(journal: Path, name: str, direction: str = "maximize", pruning=None):
    """Study ``name`` in ``journal`` behind a relay while the block runs."""
    from hpo.store import StudyRelay

    control = journal.with_name(f"{journal.stem}.control.json")
    with StudyRelay(str(journal), name, pruning=pruning, control=control) as relay:
        optuna.create_study(study_name=name, storage=relay.storage, direction=direction,
                            load_if_exists=True)
        yield ServedStudy(relay, name, control)


def run_in_segments(tmp_path, objective: str, config: dict, segment: int | None, name: str,
                    metric: str = "val_loss", direction: str = "minimize") -> optuna.trial.FrozenTrial:
    """Run a trial's segments one after another, each task filled by the
    master from its replica, as a scheduler would."""
    import math

    from hpo.master import QuantumRule
    from hpo.trial import TrialStatus, run_trial

    with served_study(tmp_path / f"{name}.log", name, direction) as study:
        study.store.set_contender(math.inf)  # a new trial always waits: each quantum yields
        trial_id, number = study.new_trial()
        for _ in range(50):
            task = study.task(trial_id, number, config=config, objective=objective, metric=metric,
                              direction=direction, checkpoint_dir=str(tmp_path / name / "ckpt"),
                              quantum=QuantumRule(steps=segment) if segment else None)
            if run_trial(task).state is not TrialStatus.SUSPENDED:
                return study.store.trial(trial_id)
    raise AssertionError("the trial never finished")


def curve(trial: optuna.trial.FrozenTrial) -> dict[int, float]:
    """A stored trial's reports of its metric, by step."""
    return dict(sorted(trial.intermediate_values.items()))


def stop_processes(procs) -> None:
    """End the processes a test started, last started first (workers before
    their scheduler), by PID: SIGTERM, then SIGKILL after 30 s."""
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def stderr_of(proc: subprocess.Popen, timeout: float) -> str:
    """What ``proc`` (started with ``stderr=PIPE, text=True``) wrote to stderr
    by its end; a process still running after ``timeout`` s is killed and
    the test fails with the end of what it said, which tells why it hung."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        said = proc.communicate()[1] or ""
        raise AssertionError(f"still running after {timeout:g} s; the end of its stderr:\n"
                             f"{said[-6000:]}") from None


def wait_for(condition, timeout: float = 90, what: str = "condition"):
    """``condition()``'s first true value, polled every 0.1 s for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# -- hpo submit and the launchers, called in this process -------------------------


@pytest.fixture
def no_user_site(monkeypatch, tmp_path):
    """No site profile of the machine's user leaks into the batch scripts."""
    monkeypatch.delenv("HPO_SITE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def hpo(monkeypatch, capsys, tmp_path):
    """Run ``hpo ARGS`` in this process from tmp_path; returns (status, stdout, stderr)."""
    import signal

    from hpo.cli import main

    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    monkeypatch.chdir(tmp_path)

    def call(*args):
        status = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err
    return call


@pytest.fixture
def space(tmp_path) -> Path:
    """A toy space file."""
    import json

    path = tmp_path / "toy.json"
    path.write_text(json.dumps(toy_space("toy")))
    return path


# -- a PostgreSQL server ---------------------------------------------------------


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server this test session starts on 127.0.0.1 (skipped without one)."""
    pytest.importorskip("psycopg2", reason="pip install 'hpo[postgres]'")
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


@contextmanager
def tmpfs(mount: Path, size: str):
    """A real tmpfs of ``size`` ("16m") at ``mount``, a file system of the
    test's own to fill up or make read-only; skips where it cannot be
    mounted (mounting needs root)."""
    mount.mkdir(exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def hpo_run_on(scheduler: str, space: dict, tmp_path: Path) -> subprocess.Popen:
    """``hpo run`` of ``space`` on the Dask cluster at ``scheduler``, as a
    user starts it, its run directories under ``tmp_path``."""
    import json

    path = tmp_path / "space.json"
    path.write_text(json.dumps(space))
    return subprocess.Popen(
        [sys.executable, "-m", "hpo", "run", str(path), "--engine", "dask", "--quiet",
         "--scheduler", scheduler, "--runs-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def trial_processes(root: int, warm: bool = False) -> list:
    """The trials' own processes below process ``root`` (``hpo.trial._child``),
    or with ``warm`` the workers' warm processes they are forked from (a fork
    keeps its parent's command line: a warm process is one whose parent is not
    one of them)."""
    import psutil

    try:
        family = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = {}
    for process in family:
        try:
            command = process.cmdline()
            parent = process.ppid()
        except psutil.Error:
            continue
        if "hpo.trial._child" in " ".join(command):
            found[process.pid] = (process, "--warm" in command, parent)
    return [process for process, forked_or_warm, parent in found.values()
            if (forked_or_warm and parent not in found) == warm]


def running_pid(run_dir: Path, reports: int) -> int | None:
    """The process of the study's only trial once it reported ``reports``
    steps; None before."""
    import hpo

    try:
        (trial,) = hpo.store.RunDir(run_dir).load_study().trials
    except (hpo.UsageError, ValueError, KeyError):
        return None
    run = trial.system_attrs.get("hpo:run")
    return run["pid"] if run and len(trial.intermediate_values) >= reports else None

