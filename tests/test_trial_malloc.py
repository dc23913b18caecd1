"""A trial's large buffers come from malloc's heap, not a fresh mmap each,
even in a Dask worker whose nanny fixed glibc's mmap threshold low."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

import hpo
from hpo.store import RunDir
from hpo.store.records import run_of

# How many bytes a 1 MiB buffer added to malloc's mmapped blocks (mallinfo2's hblkhd).
_MAPPED = """
import ctypes, os


class _Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def mapped_bytes():
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _Info
    before = mallinfo2().hblkhd
    buffer = bytearray(1 << 20)
    grown = mallinfo2().hblkhd - before
    del buffer
    return float(grown)


def train(config, trial):
    return {"mapped_bytes": mapped_bytes(), "trim_set": float("MALLOC_TRIM_THRESHOLD_" in os.environ)}
"""

needs_mallinfo2 = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallinfo2"),
    reason="needs glibc 2.33 or later (mallinfo2)")


@needs_mallinfo2
def test_a_dask_trial_allocates_large_buffers_from_the_heap(tmp_path, dask_address):
    (tmp_path / "mapped.py").write_text(_MAPPED)
    space = tmp_path / "space.json"
    space.write_text(json.dumps({
        "name": "heap", "objective": "mapped:train", "metric": {"name": "mapped_bytes", "direction": "minimize"},
        "search": {"algorithm": "grid", "parallel": 2}, "space": {"x": [0, 1]}}))
    result = hpo.run(space, engine="dask", scheduler=dask_address, runs_dir=tmp_path / "runs", progress=False)
    assert result.counts["COMPLETE"] == 2
    metrics = [run_of(t)["metrics"] for t in RunDir(tmp_path / "runs" / "heap").load_study().trials]
    assert [m["trim_set"] for m in metrics] == [1.0, 1.0]  # the nanny fixed the threshold
    assert [m["mapped_bytes"] for m in metrics] == [0.0, 0.0]


@needs_mallinfo2
@pytest.mark.parametrize("chosen, mapped", [({}, False), ({"MALLOC_MMAP_THRESHOLD_": "131072"}, True),
                                            ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}, True)])
def test_a_threshold_chosen_on_purpose_is_kept(tmp_path, chosen, mapped):
    (tmp_path / "mapped.py").write_text(_MAPPED)
    script = ("import mapped\nfrom hpo.trial._malloc import reuse_large_buffers\n"
              "reuse_large_buffers()\nprint(mapped.mapped_bytes())\n")
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", **chosen,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert (float(done.stdout) > 0) is mapped
