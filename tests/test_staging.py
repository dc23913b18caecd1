"""Data staged once per node (hpo.data): the space file's ``data`` section,
the copy under the node's lock, a torn copy, a full disk, a node joining
late, the removal at the end, on the inline engine, a real multi-process
Dask cluster (two "nodes": workers with their own staging folder) and the
PyCOMPSs double."""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpo
from conftest import ROOT, stop_processes, tmpfs, toy_space, wait_for
from hpo.data import (
    STAGED_LOG, DataSection, StagedData, StagingError, UnknownDataItem, node_folder, remove_copies,
    stage,
)
from hpo.errors import SpaceError
from hpo.space import parse_spec
from hpo.store import RunDir
from hpo.store.records import TrialStatus, run_of, status_of
from hpo.trial import Trial

TESTS = Path(__file__).resolve().parent
OBJECTIVE = "test_staging:read_data"
# Each Dask worker started here stands for a node: its own staging folder.
NODE_SCRATCH = "${HPO_NODE_SCRATCH:-%s}"


# -- the objective the studies run ---------------------------------------------------


def read_data(config: dict, trial: hpo.Trial) -> dict[str, float]:
    """Read every byte of the item "ds" where the trial is told it is, write
    what it saw to ``records/<number>.json``, then wait for ``gate`` (if any)."""
    path = trial.data_path("ds")
    size = sum(len(f.read_bytes()) for f in sorted(path.rglob("*")) if f.is_file())
    folder = path.parents[1]  # <stage_to>/hpo-<study>
    marker = json.loads((folder / ".ds.staged").read_text())
    record = {"number": trial.number, "path": str(path), "node": os.environ.get("HPO_NODE_SCRATCH"),
              "pid": os.getpid(), "bytes": size,
              "marker": [marker["host"], marker["pid"], marker["staged_at"]],
              "copies": len((folder / STAGED_LOG).read_text().splitlines())}
    records = Path(config["records"])
    partial = records / f".{trial.number}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(record))
    partial.rename(records / f"{trial.number}.json")
    gate = config.get("gate")
    deadline = time.monotonic() + 300
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"value": float(size)}


def records(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A "shared" dataset: a folder of a few files, one in a subfolder."""
    source = tmp_path / "shared" / "fashion"
    (source / "test").mkdir(parents=True)
    for i in range(3):
        (source / f"train-{i}.bin").write_bytes(os.urandom(300_000 + i))
    (source / "test" / "labels.txt").write_text("0 1 2\n")
    return source


def tree_bytes(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def staging_space(name: str, source: Path, scratch: str, records_dir: Path, **extra) -> dict:
    records_dir.mkdir(parents=True, exist_ok=True)
    data = {"stage_to": scratch, "items": {"ds": str(source)}, **extra.pop("data", {})}
    fixed = {"records": str(records_dir), **extra.pop("fixed", {})}
    return toy_space(name, OBJECTIVE, data=data, fixed=fixed,
                     space={"x": list(range(extra.pop("trials", 4)))}, **extra)


def trials_of(run_dir: Path):
    return RunDir(run_dir).load_study().trials


# -- the space file ------------------------------------------------------------------


def test_a_space_without_data_is_unchanged(tmp_path):
    spec = parse_spec(toy_space("plain"))
    assert spec.data is None and "data" not in spec.to_dict()
    assert "data " not in spec.describe()
    result = hpo.run(toy_space("plain"), engine="inline", runs_dir=tmp_path, progress=False)
    assert result.counts["COMPLETE"] == 8
    assert "data" not in json.loads((tmp_path / "plain" / "study.json").read_text())["spec"]
    with pytest.raises(UnknownDataItem, match="this trial has no data items") as caught:
        Trial(0, {}).data_path("ds")
    assert isinstance(caught.value, KeyError)


def test_the_data_section_is_parsed_and_round_trips(dataset, monkeypatch):
    monkeypatch.chdir(dataset.parent)
    spec = parse_spec(toy_space("d", data={"items": {"ds": "fashion"}, "keep": True}))
    assert spec.data == DataSection({"ds": str(dataset)}, "${TMPDIR:-/tmp}", True)
    assert parse_spec(spec.to_dict()) == spec  # a relative source is stored absolute
    assert f"ds <- {dataset}; staged to ${{TMPDIR:-/tmp}} on each node, kept" in spec.describe()


@pytest.mark.parametrize("data, path, problem, fix", [
    ({"stage_to": "scratch", "items": {"ds": "SRC"}}, "$.data.stage_to", "a relative path",
     '"$TMPDIR", "/dev/shm"'),
    ({"stage_to": "/local/$", "items": {"ds": "SRC"}}, "$.data.stage_to", "a '$' that starts no variable",
     '"$TMPDIR"'),
    ({"stage_to": 3, "items": {"ds": "SRC"}}, "$.data.stage_to", "expected a node-local folder", "/dev/shm"),
    ({"items": {"ds": "SRC/missing"}}, "$.data.items.ds", "no such file or directory: SRC/missing",
     "every node can read (on the shared file system)"),
    ({"items": {"ds": "$HPO_SURELY_UNSET/x"}}, "$.data.items.ds", "$HPO_SURELY_UNSET is not set", "set it"),
    ({"items": {}}, "$.data.items", "expected a non-empty object", '"items": {"fmnist"'),
    ({"stage_to": "/tmp"}, "$.data.items", "missing required key 'items'", '"items": {"fmnist"'),
    ({"items": {".hidden": "SRC"}}, '$.data.items[".hidden"]', "cannot name a folder", 'e.g. "hidden"'),
    ({"items": {"ds": "SRC"}, "keep": "yes"}, "$.data.keep", "expected true or false", "true or false"),
    ({"items": {"ds": "SRC"}, "stage": "/tmp"}, "$.data.stage", "unknown key 'stage'",
     'did you mean "stage_to"'),
])
def test_bad_data_sections_name_the_path_and_the_fix(dataset, data, path, problem, fix):
    as_text = json.loads(json.dumps(data).replace("SRC", str(dataset)))
    with pytest.raises(SpaceError) as caught:
        parse_spec(toy_space("bad", data=as_text))
    assert caught.value.path == path
    assert problem.replace("SRC", str(dataset)) in caught.value.problem
    assert fix in caught.value.fix


def test_hpo_validate_refuses_a_missing_source_with_status_2(hpo, tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps(toy_space("v", data={"items": {"ds": "/shared/nowhere/fmnist"}})))
    status, _, err = hpo("validate", space)
    assert status == 2
    assert "$.data.items.ds: no such file or directory: /shared/nowhere/fmnist" in err
    assert "fix: give a file or folder that every node can read" in err and "Traceback" not in err


# -- trial.data_path -----------------------------------------------------------------


def test_a_trial_built_by_hand_reads_the_sources_unchanged(dataset):
    trial = Trial(0, {}, data={"ds": dataset, "labels": str(dataset / "test" / "labels.txt")})
    assert trial.data_path("ds") == dataset
    with pytest.raises(UnknownDataItem) as caught:
        trial.data_path("dss")
    assert "the study's items are 'ds', 'labels'" in str(caught.value)
    assert "did you mean 'ds'?" in str(caught.value)


# -- staging on a node -----------------------------------------------------------------


def _copies(folder: Path) -> list[dict]:
    log = folder / STAGED_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_concurrent_trials_of_a_node_wait_for_one_copy(dataset, tmp_path):
    """Four processes ask at once while the node's lock is held: all wait,
    one copies, the others use that copy."""
    folder = node_folder(str(tmp_path / "node"), "contention")
    folder.mkdir(parents=True)
    script = ("import sys; from pathlib import Path; from hpo.data import stage; "
              "print(stage('ds', sys.argv[1], Path(sys.argv[2])))")
    holder = os.open(folder / ".ds.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    procs, logs = [], []
    try:
        for i in range(4):
            logs.append(tmp_path / f"stager-{i}.err")
            with open(logs[-1], "w") as err:
                procs.append(subprocess.Popen([sys.executable, "-c", script, str(dataset), str(folder)],
                                              stdout=subprocess.PIPE, stderr=err, text=True,
                                              env={**os.environ, "PYTHONPATH": str(ROOT)}))
        wait_for(lambda: all("waiting for the copy" in log.read_text() for log in logs), 120,
                 "every stager waiting on the node's lock")
    finally:
        os.close(holder)  # releases the lock
    paths = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert [proc.returncode for proc in procs] == [0] * 4
    assert paths == {str(folder / ".ds.copy-1" / "fashion")}
    assert (folder / "ds").resolve() == folder / ".ds.copy-1"  # the link people look at
    assert len(_copies(folder)) == 1
    assert tree_bytes(Path(paths.pop())) == tree_bytes(dataset)


def test_a_copy_is_in_the_log_before_its_marker_makes_it_current(dataset, tmp_path, monkeypatch):
    """A trial that finds the marker (without the lock) while the copier is
    still at work reads the log and finds the copy there."""
    import hpo.data._stage as stage_module

    folder = node_folder(str(tmp_path / "node"), "order")
    logged_when_marked = []
    real_write_marker = stage_module.write_marker

    def write_marker(*args, **kwargs):
        logged_when_marked.append([entry["copy"] for entry in _copies(folder)])
        return real_write_marker(*args, **kwargs)

    monkeypatch.setattr(stage_module, "write_marker", write_marker)
    stage("ds", dataset, folder)
    assert logged_when_marked == [[".ds.copy-1"]]


_STALLING_COPIER = """
import builtins, sys, time
from pathlib import Path
from hpo.data import stage

source, folder, flag, release = sys.argv[1:5]
real_open = builtins.open

class Stalling:
    # The source read through this stalls after its first chunk, until the
    # file ``release`` exists (or the copier is killed there).
    def __init__(self, file):
        self.file, self.reads = file, 0
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()
    def read(self, size=-1):
        self.reads += 1
        if self.reads == 2:
            Path(flag).touch()
            deadline = time.monotonic() + 3600
            while not Path(release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.file.read(size)

def stalling_open(file, mode="r", *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    return Stalling(opened) if str(file).startswith(source) and mode == "rb" else opened

builtins.open = stalling_open
print(stage("ds", source, Path(folder)), flush=True)
"""


def test_a_torn_copy_is_never_used_and_is_replaced(dataset, tmp_path):
    folder = node_folder(str(tmp_path / "node"), "torn")
    flag = tmp_path / "mid-copy"
    copier = subprocess.Popen([sys.executable, "-c", _STALLING_COPIER, str(dataset), str(folder), str(flag),
                               str(tmp_path / "never")],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    try:
        wait_for(flag.exists, 120, "the copier half-way through its copy")
    finally:
        copier.send_signal(signal.SIGKILL)
        copier.wait()
    torn = list(folder.glob(".ds.tmp-*"))
    assert torn and not (folder / ".ds.staged").exists() and not list(folder.glob(".ds.copy-*"))
    # Killed after its rename and before its marker: a copy no marker names;
    # and a copy in place where the link goes, as hpo made them before.
    for torn_copy in (folder / ".ds.copy-1" / "fashion", folder / "ds" / "fashion"):
        torn_copy.mkdir(parents=True)
        (torn_copy / "train-0.bin").write_bytes(b"torn")
    copy = StagedData(DataSection({"ds": str(dataset)}, str(tmp_path / "node")), "torn").path("ds")
    assert tree_bytes(copy) == tree_bytes(dataset)
    assert (folder / "ds").resolve() == copy.parent  # a link now
    assert not list(folder.glob(".ds.tmp-*"))  # the dead copier's leftovers are gone
    assert list(folder.glob(".ds.copy-*")) == [copy.parent]  # and so are the torn copies
    assert len(_copies(folder)) == 1


def test_a_changed_source_is_staged_again(dataset, tmp_path):
    folder = tmp_path / "node" / "hpo-changed"
    first = stage("ds", dataset, folder)
    assert stage("ds", dataset, folder) == first and len(_copies(folder)) == 1
    with open(dataset / "test" / "labels.txt", "a") as labels:
        labels.write("3\n")
    assert tree_bytes(stage("ds", dataset, folder)) == tree_bytes(dataset)
    assert len(_copies(folder)) == 2


_READER = """
import hashlib, json, sys
from pathlib import Path
from hpo.data import DataSection, StagedData

source, stage_to, study, out = sys.argv[1:5]
out = Path(out)
data = StagedData(DataSection({"ds": source}, stage_to), study)  # a trial holds it to its end
path = data.path("ds")  # once, as a trial does
files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
(out / "path").write_text(str(path))
loops, seen = 0, set()
try:
    while not (out / "stop").exists():  # read lazily: each file opened by its path, again and again
        digest = hashlib.sha256()
        for name in files:
            digest.update(name.encode() + b"\\0" + (path / name).read_bytes())
        loops += 1
        seen.add(digest.hexdigest())
        (out / "loops.tmp").write_text(json.dumps({"loops": loops, "seen": sorted(seen)}))
        (out / "loops.tmp").replace(out / "loops")
except OSError as exc:
    (out / "error").write_text(f"{type(exc).__name__}: {exc}")
    sys.exit(1)
"""


def _tree_digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, data in sorted((Path(n).as_posix(), d) for n, d in tree_bytes(path).items()):
        digest.update(name.encode() + b"\0" + data)
    return digest.hexdigest()


def test_restaging_keeps_the_copy_a_running_trial_reads(dataset, tmp_path):
    """A trial reads its copy file by file while the source changes and the
    node's next trial stages it again: the reader never loses a file, and
    reads its own copy to the end; the old copy goes once it is done."""
    stage_to, out = tmp_path / "node", tmp_path / "reader"
    folder = node_folder(str(stage_to), "restage")
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = _tree_digest(dataset)
    flag, release = tmp_path / "mid-copy", tmp_path / "release"

    def read() -> dict:
        return json.loads((out / "loops").read_text()) if (out / "loops").exists() else {"loops": 0}

    def reads_past(count: int) -> bool:
        return read()["loops"] >= count or (out / "error").exists() or reader.poll() is not None

    reader = subprocess.Popen([sys.executable, "-c", _READER, str(dataset), str(stage_to), "restage",
                               str(out)], env=env)
    procs = [reader]
    try:
        wait_for(lambda: reads_past(1), 120, "the reader reading the node's copy")
        with open(dataset / "test" / "labels.txt", "a") as labels:
            labels.write("3\n")
        stager = subprocess.Popen([sys.executable, "-c", _STALLING_COPIER, str(dataset), str(folder),
                                   str(flag), str(release)], env=env, stdout=subprocess.PIPE, text=True)
        procs.append(stager)
        wait_for(lambda: flag.exists() or stager.poll() is not None, 120, "the new copy half made")
        during = read()["loops"] + 2
        wait_for(lambda: reads_past(during), 120, "two reads while the new copy is made")
        release.touch()
        new_copy = Path(stager.communicate(timeout=120)[0].strip())
        assert stager.returncode == 0
        after = read()["loops"] + 2
        wait_for(lambda: reads_past(after), 120, "two reads after the new copy is in")
    finally:
        (out / "stop").touch()
        release.touch()
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    error = (out / "error").read_text() if (out / "error").exists() else None
    assert error is None and reader.returncode == 0, error
    assert read()["seen"] == [first]  # its own copy, the old one, to the end
    assert _tree_digest(new_copy) == _tree_digest(dataset) != first
    old_copy = Path((out / "path").read_text())
    assert new_copy != old_copy  # a copy of its own, beside the reader's
    # The reader gone, the node's next trial uses the new copy and removes the old one.
    assert stage("ds", dataset, folder) == new_copy
    assert not old_copy.exists()
    assert len(_copies(folder)) == 2


def test_a_node_without_its_variable_says_so():
    with pytest.raises(StagingError) as caught:
        node_folder("$HPO_SURELY_UNSET/stage", "s")
    assert "$HPO_SURELY_UNSET is not set on this node" in caught.value.problem
    assert '"${HPO_SURELY_UNSET:-/tmp}"' in caught.value.fix


# -- the inline engine -------------------------------------------------------------------


def test_copies_go_at_the_end_unless_kept(dataset, tmp_path):
    scratch = tmp_path / "node"
    gone = staging_space("gone", dataset, str(scratch), tmp_path / "gone")
    result = hpo.run(gone, engine="inline", runs_dir=tmp_path / "runs", progress=False)
    assert result.counts["COMPLETE"] == 4
    seen = records(tmp_path / "gone")
    assert {r["path"] for r in seen.values()} == {str(scratch / "hpo-gone" / ".ds.copy-1" / "fashion")}
    assert {r["bytes"] for r in seen.values()} == {sum(map(len, tree_bytes(dataset).values()))}
    assert len({tuple(r["marker"]) for r in seen.values()}) == 1  # one copy, for every trial
    assert not (scratch / "hpo-gone").exists()

    kept = staging_space("kept", dataset, str(scratch), tmp_path / "kept", data={"keep": True},
                         search={"max_trials": 2})
    hpo.run(kept, engine="inline", runs_dir=tmp_path / "runs", progress=False)
    assert (scratch / "hpo-kept" / ".ds.staged").exists() and len(_copies(scratch / "hpo-kept")) == 1
    # The next run of the study uses the copy it kept.
    kept["search"]["max_trials"] = 4
    assert hpo.run(kept, engine="inline", runs_dir=tmp_path / "runs", progress=False).counts["COMPLETE"] == 4
    assert len(_copies(scratch / "hpo-kept")) == 1


def test_nodes_the_master_cannot_reach_are_named_with_their_copies(dataset, tmp_path, capsys):
    section = DataSection({"ds": str(dataset)}, str(tmp_path / "node"))
    StagedData(section, "far").path("ds")
    removals = remove_copies(section, "far", {"far-node-7", socket.gethostname()}, None)
    assert [r.removed for r in removals] == [True] and not (tmp_path / "node" / "hpo-far").exists()
    said = capsys.readouterr().err
    assert f"may remain under {tmp_path / 'node'}/hpo-far on 1 node(s): far-node-7: not reachable" in said
    assert '"data.keep": true' in said


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs: a real file system too small for the dataset (mounting needs root)."""
    with tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


def test_a_full_node_disk_stops_the_study_and_fails_no_trial(hpo, dataset, tmp_path, small_fs):
    (dataset / "train-big.bin").write_bytes(os.urandom(2 * 2**20))  # more than the 1 MiB there
    space = tmp_path / "full.json"
    space.write_text(json.dumps(staging_space("full", dataset, str(small_fs), tmp_path / "full")))
    status, _, err = hpo("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs")
    assert status == 75, err
    said = re.search(rf"could not stage its data on \S+: cannot stage 'ds' in {small_fs}/hpo-full: the "
                     rf"file system {small_fs} \(tmpfs\) has [\d.]+ MiB free \(([\d,]+) bytes\), the "
                     rf"copy needs [\d.]+ MiB \(([\d,]+) bytes\)", err)
    assert said, err
    free, needed = (int(group.replace(",", "")) for group in said.groups())
    assert free <= 2**20 < 2 * 2**20 < needed
    assert "Nothing was recorded as a trial's failure" in err and "Traceback" not in err
    assert f"fix: free space on {small_fs}" in err
    trials = trials_of(tmp_path / "runs" / "full")
    assert not [t for t in trials if status_of(t) is TrialStatus.FAILED]
    handed_back = [t for t in trials if run_of(t).get("error")]
    assert handed_back and run_of(handed_back[0])["error"]["staging"]["path"] == str(small_fs / "hpo-full")
    # Room made, the same command runs every configuration, the one cut short included.
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)
    status, _, err = hpo("run", space, "--engine", "inline", "--runs-dir", tmp_path / "runs")
    assert status == 0, err
    trials = trials_of(tmp_path / "runs" / "full")
    assert sorted(t.params["x"] for t in trials if status_of(t) is TrialStatus.COMPLETE) == [0, 1, 2, 3]


# -- the COMPSs double ---------------------------------------------------------------------


def test_compss_workers_stage_on_first_use(compss, dataset, tmp_path):
    compss.start(nodes=2, cpus_per_node=2)
    scratch = tmp_path / "node"
    space = staging_space("compss", dataset, str(scratch), tmp_path / "compss", search={"parallel": 4})
    result = hpo.run(space, runs_dir=tmp_path / "runs", progress=False)
    assert result.counts["COMPLETE"] == 4
    seen = records(tmp_path / "compss")
    assert len({tuple(r["marker"]) for r in seen.values()}) == 1  # one copy...
    assert max(r["copies"] for r in seen.values()) == 1  # ...made once
    assert not (scratch / "hpo-compss").exists()  # the master's own node: it removes them


# -- a real Dask cluster: two nodes, one joining late ----------------------------------------


@pytest.fixture
def scheduler(tmp_path):
    """A Dask scheduler in its own process; ``start_node(name, workers, threads)``
    starts a node: worker processes with their own staging folder."""
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(scheduler_file), "--dashboard-address", ":0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def start_node(name: str, workers: int, threads: int) -> Path:
        scratch = tmp_path / name
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
             "--nworkers", str(workers), "--nthreads", str(threads), "--host", "127.0.0.1",
             "--no-dashboard", "--local-directory", str(tmp_path / "dask"), "--name", name],
            env={**env, "HPO_NODE_SCRATCH": str(scratch)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return scratch

    wait_for(scheduler_file.exists, 60, "the scheduler")
    try:
        yield str(scheduler_file), start_node
    finally:
        stop_processes(procs)


def test_each_node_copies_once_and_a_late_node_stages_on_its_first_trial(scheduler, dataset, tmp_path):
    from distributed import Client

    scheduler_file, start_node = scheduler
    node_a = start_node("node-a", workers=2, threads=2)  # 4 trials at once, in 2 processes
    with Client(scheduler_file=scheduler_file) as client:
        client.wait_for_workers(2, timeout=120)
    gate = tmp_path / "go"
    space = staging_space("nodes", dataset, NODE_SCRATCH % (tmp_path / "nowhere"), tmp_path / "nodes",
                          trials=12, fixed={"gate": str(gate)}, search={"parallel": None})
    with concurrent.futures.ThreadPoolExecutor(1) as master:
        running = master.submit(hpo.run, space, engine="dask", scheduler=scheduler_file,
                                runs_dir=tmp_path / "runs", progress=False)
        try:
            seen = wait_for(lambda: (r := records(tmp_path / "nodes")) and len(r) >= 4 and r, 180,
                            "four trials on node A, holding its slots")
            node_b = start_node("node-b", workers=1, threads=1)  # joins after node A's trials staged
            wait_for(lambda: any(r["node"] == str(node_b) for r in records(tmp_path / "nodes").values()),
                     180, "a trial on the node that joined late")
        finally:
            gate.touch()
        result = running.result(timeout=300)
    assert result.counts["COMPLETE"] == 12
    seen = records(tmp_path / "nodes")
    for node in (node_a, node_b):
        here = [r for r in seen.values() if r["node"] == str(node)]
        assert here, f"no trial ran on {node.name}"
        assert {r["path"] for r in here} == {str(node / "hpo-nodes" / ".ds.copy-1" / "fashion")}
        assert len({tuple(r["marker"]) for r in here}) == 1  # one copy per node...
        assert max(r["copies"] for r in here) == 1  # ...made once
        assert {r["bytes"] for r in here} == {sum(map(len, tree_bytes(dataset).values()))}
        assert not (node / "hpo-nodes").exists()  # removed at the end by the node's workers
    assert len({r["pid"] for r in seen.values() if r["node"] == str(node_a)}) == 2
