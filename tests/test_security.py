"""Nobody else on the machine can stop, read or poison a study: the embedded
Dask cluster refuses a client without its identity (mutual TLS), and the run
directory and the files the store writes are their owner's alone. The last
test plays another local user against a real running study."""

from __future__ import annotations

import http.client
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

import hpo
from hpo.engines import DaskEngine
from hpo.store import RunDir
from hpo.store import ControlFile, write_epoch_file
from conftest import ROOT, toy_space, wait_for
from test_faults import end

STRANGER = "hpo-stranger"

# What another local user tries: run a function through each Dask port (plain
# TCP, then TLS with a certificate of its own), read the scheduler's web
# pages, then read each file. It prints what happened; the test judges.
ATTACK = """
import json, os, sys, threading, urllib.error, urllib.request
from distributed import Client
from distributed.security import Security

ports, web, paths = (json.loads(arg) for arg in sys.argv[1:4])
runs, pages, reads = {}, {}, {}

def run_on(port, scheme):
    security = Security.temporary() if scheme == "tls" else None
    try:
        with Client(f"{scheme}://127.0.0.1:{port}", security=security, timeout=15) as client:
            runs[f"{scheme}:{port}"] = f"ran as uid {client.run_on_scheduler(os.getuid)}"
    except Exception as exc:
        runs[f"{scheme}:{port}"] = f"refused: {type(exc).__name__}"

threads = [threading.Thread(target=run_on, args=(p, s), daemon=True)
           for p in ports for s in ("tcp", "tls")]
for thread in threads:
    thread.start()
for thread in threads:  # a bound, not a proof: a TLS hello sent to a plain-TCP Dask waits forever
    thread.join(timeout=90)
for port in web:
    for page in ("info/main/workers.html", "json/identity.json"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{page}", timeout=30) as answer:
                pages[f"{port}/{page}"] = answer.status
        except urllib.error.HTTPError as exc:
            pages[f"{port}/{page}"] = exc.code
for path in paths:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        reads[path] = "read"
    except OSError as exc:
        reads[path] = type(exc).__name__
print(json.dumps({"uid": os.getuid(), "runs": runs, "pages": pages, "reads": reads}), flush=True)
os._exit(0)  # attempts still waiting are left behind
"""


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


# ------------------------------------------------------------ the embedded cluster


def test_the_embedded_cluster_refuses_a_client_without_its_identity():
    """The embedded scheduler speaks TLS only, with an identity of its own:
    a plain TCP client and a TLS client with another certificate are both
    refused, while the study's own client runs on every worker."""
    from distributed import Client
    from distributed.security import Security

    with DaskEngine(workers=1) as engine:
        address = engine.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:"), address
        assert engine.local and len(engine.run_on_every_worker(os.getpid)) == 1
        for target, security in ((address.replace("tls://", "tcp://"), None),
                                 (address, Security.temporary())):
            with pytest.raises(Exception):  # refused in the handshake: never a client
                with Client(target, security=security, timeout=15) as intruder:
                    intruder.run_on_scheduler(os.getuid)


# ------------------------------------------------------------ the run directory


@pytest.fixture
def open_umask():
    """A umask that takes nothing away: the modes checked are hpo's own."""
    before = os.umask(0)
    yield
    os.umask(before)


def test_a_run_directory_and_the_store_files_are_the_owners_alone(tmp_path, open_umask):
    """Whatever the umask: the run directory 0700, and study.json, the
    journal, master.lease, control.json and journal.log.epoch 0600; a run
    directory others may enter (made by hpo submit, or an earlier hpo) is
    made private by the next master."""
    spec = hpo.parse_spec(toy_space("private")).to_dict()
    run_dir = RunDir(tmp_path / "runs" / "private")
    with run_dir.lease():
        url = run_dir.create(spec, None)
        ControlFile(run_dir.control_file).write(1, {"stop": None})
        write_epoch_file(url, {"epoch": 1})
        files = [run_dir.study_file, Path(url), run_dir.path / "master.lease", run_dir.control_file,
                 Path(f"{url}.epoch")]
        assert _mode(run_dir.path) == "0o700"
        assert {f.name: _mode(f) for f in files} == {f.name: "0o600" for f in files}

    opened = RunDir(tmp_path / "runs" / "opened")
    opened.path.mkdir(mode=0o755, parents=True)
    with opened.lease():
        assert _mode(opened.path) == "0o700"


def test_a_journal_outside_the_run_directory_is_created_the_owners_alone(tmp_path, open_umask):
    """``--storage PATH`` elsewhere: the journal is created 0600 there too."""
    spec = hpo.parse_spec(toy_space("elsewhere")).to_dict()
    journal = tmp_path / "shared" / "elsewhere.log"
    journal.parent.mkdir()
    run_dir = RunDir(tmp_path / "runs" / "elsewhere")
    with run_dir.lease():
        assert run_dir.create(spec, str(journal)) == str(journal.resolve())
    assert _mode(journal) == "0o600"


# ------------------------------------------------------------ another local user


def _python_for(user: str) -> list[str] | None:
    """A command running a Python with this environment's packages as
    ``user``: this interpreter, or the system's of the same version over
    this environment's site-packages; None when ``user`` can reach neither
    (nothing outside a temp folder has its permissions changed)."""
    import distributed

    site = str(Path(distributed.__file__).resolve().parents[1])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = (f"import sys, distributed, cryptography; "
             f"sys.exit(sys.version[:{len(version)}] != {version!r})")
    candidates = [sys.executable, os.path.realpath(sys.executable),
                  shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin:/bin")]
    for python in dict.fromkeys(c for c in candidates if c):
        command = ["runuser", "-u", user, "--", "env", "-i", f"PYTHONPATH={site}",
                   "PYTHONDONTWRITEBYTECODE=1", "HOME=/", python]
        if subprocess.run([*command, "-c", probe], capture_output=True, cwd="/").returncode == 0:
            return command
    return None


@pytest.fixture
def stranger() -> list[str]:
    """The command that runs this environment's Python as another local
    user, with no rights on anything of the study's owner."""
    if os.geteuid() != 0:
        pytest.skip("creating and becoming another local user needs root (useradd, runuser)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser (util-linux) is not installed")
    try:
        pwd.getpwnam(STRANGER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", STRANGER],
                              capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot create the local user {STRANGER}: {made.stderr.strip()}")
    command = _python_for(STRANGER)
    if command is None:
        pytest.skip(f"no Python with this environment's packages can be run by {STRANGER} (the "
                    "environment is in a folder other users cannot enter, e.g. under /root)")
    return command


@pytest.fixture
def shared_tmp():
    """A temp folder any local user may enter (a pytest tmp_path may sit in
    one only its owner can), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="hpo-security-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _listening_ports(pid: int) -> tuple[list[int], list[int]]:
    """The TCP ports the process listens on: its Dask and relay ports (the
    scheduler, the nannies, the relay), and its web ports (the scheduler's;
    a Dask client sent there would wait forever for an HTTP answer)."""
    ports = sorted({c.laddr.port for c in psutil.Process(pid).net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN})
    web = [port for port in ports if _answers_http(port)]
    return [port for port in ports if port not in web], web


def _answers_http(port: int) -> bool:
    """Whether an HTTP server answers on ``port`` (the others close the
    connection at the request's first bytes: TLS, or the relay's framing)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/health")
        connection.getresponse()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _secrets_at_rest(run_dir: Path, pid: int) -> list[str]:
    """The run directory, every file in it, and the task files a trial's
    process was started with (they hold the relay's token)."""
    paths = [str(run_dir), *(str(p) for p in sorted(run_dir.rglob("*")) if p.is_file())]
    for child in psutil.Process(pid).children(recursive=True):
        try:
            paths += [arg for arg in child.cmdline() if arg.endswith(".pkl")]
        except psutil.Error:
            pass
    return paths


def _running_with_reports(run_dir: Path) -> bool:
    try:
        trials = RunDir(run_dir).load_study().trials
    except (hpo.UsageError, KeyError, ValueError, OSError):
        return False
    return any(t.state.name == "RUNNING" and t.intermediate_values for t in trials)


def _attack(stranger: list[str], folder: Path, ports: list[int], web: list[int],
            paths: list[str]) -> dict:
    """Run ATTACK as the stranger; what it says. Its own session: should it
    outlive its bounds, runuser and the Python it started end together."""
    arguments = [str(folder / "attack.py"), *map(json.dumps, (ports, web, paths))]
    attack = subprocess.Popen([*stranger, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=folder, start_new_session=True)
    try:
        out, err = attack.communicate(timeout=240)
    finally:
        if attack.poll() is None:
            os.killpg(attack.pid, signal.SIGKILL)
            attack.wait()
    assert attack.returncode == 0, err
    return json.loads(out)


def test_another_local_user_cannot_run_code_as_the_study_nor_read_it(stranger, shared_tmp):
    """A study runs on the embedded Dask engine; meanwhile another local user
    tries to run a function through every port the master listens on
    (plain TCP, and TLS with a certificate of its own), to read the Dask
    scheduler's web pages, and to read the run directory, each file in it
    (journal, control file, lease, epoch...) and the task files of trial
    processes. Everything is refused, and the study was running all along."""
    space = toy_space("private-study", "hpo.examples.toy:curve", fixed={"steps": 600, "step_s": 0.5},
                      search={"parallel": 2}, space={"quality": [1.0, 0.9, 0.8]})
    (shared_tmp / "space.json").write_text(json.dumps(space))
    (shared_tmp / "attack.py").write_text(ATTACK)
    runs = shared_tmp / "runs"
    runs.mkdir()
    runs.chmod(0o755)  # the parent of run directories, open as a shared project folder is
    for name in ("space.json", "attack.py"):
        (shared_tmp / name).chmod(0o644)
    run_dir = runs / "private-study"
    study = subprocess.Popen(
        [sys.executable, str(ROOT / "hpo_main.py"), str(shared_tmp / "space.json"), "--runs-dir",
         str(runs), "--quiet", "--engine", "dask", "--workers", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "HPO_HEARTBEAT_S": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: study.poll() is not None or _running_with_reports(run_dir), 180,
                 "a trial of the study to report")
        assert study.poll() is None, study.communicate()[1]
        (ports, web), paths = _listening_ports(study.pid), _secrets_at_rest(run_dir, study.pid)
        said, running = _attack(stranger, shared_tmp, ports, web, paths), study.poll() is None
    finally:
        end(study)
    assert said["uid"] == pwd.getpwnam(STRANGER).pw_uid
    assert running, "the study ended before the attack did: nothing was there to refuse it"
    assert len(ports) >= 2, ports
    ran = {port: what for port, what in said["runs"].items() if what.startswith("ran")}
    assert not ran, f"the stranger ran code through the study's cluster: {ran}"
    assert set(said["pages"].values()) <= {404}, said["pages"]
    assert {"journal.log", "control.json", "master.lease", "study.json"} <= {Path(p).name for p in paths}
    assert said["reads"] == {path: "PermissionError" for path in paths}, said["reads"]
