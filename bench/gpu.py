"""PyTorch trials on a real GPU: packed against one at a time, isolation,
exact resume and the paraDL cost model (run it on a machine with an NVIDIA GPU).

1. **Packing.** The same N trials (``bench/_gpu_trial.py``: the PyTorch
   example's CNN on generated images, a fixed number of steps each, sized so
   that one trial alone trains for about ``--trial-s`` seconds) as a study with
   ``"gpus": 0.25`` (four at once on one GPU) and with ``"gpus": 1`` (one at a
   time), on hpo's Dask engine. ``nvidia-smi`` is sampled every 0.5 s
   (utilisation and memory); printed: GPU busy % over the study, makespan,
   trials per minute.
2. **Isolation.** Each trial writes what its process saw (GPU ids, devices
   torch sees, its memory share, its peak memory, whether an allocation
   beyond its share was refused); ``nvidia-smi``'s per-process memory is
   sampled beside it.
3. **Exact resume on the GPU.** ``hpo check-resume`` with the PyTorch example
   on ``cuda`` with deterministic kernels: the verdict and the checkpoint's
   save and restore times.
4. **The paraDL cost model.** For several CNN widths and batch sizes, each
   layer is timed alone at two batch sizes (forward+backward per sample is
   the slope, the weight update the rest of the intercept over a trivial
   model's step, as ``hpo.allocation.profile_keras`` does for Keras), the
   model's step time is predicted with ``hpo.allocation.step_time``, and the
   whole model's step is measured: predicted, measured and accuracy
   (1 - |error| / measured) per configuration and the median.

Each study also gives, per trial, the time from its task's start on the
worker to the objective's first line (the trial's process start: forked
from the worker's warm process, or with ``--fresh`` also a fresh Python per
trial) and to its first step (CUDA, the model, a checkpoint's restore);
``--resume`` adds a round-robin study whose every trial resumes a segment.

Run: ``python bench/gpu.py [--trials 12] [--trial-s 6] [--fresh] [--resume]
[--quick] [--out DIR]``. Every figure is printed and also written to
``DIR/gpu.json``; the last lines are ``gpu_busy_pct=`` (packed),
``segment_resume_s=`` (with ``--resume``) and ``packed_speedup=<packed
trials per minute / one-at-a-time trials per minute>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))
# The trial processes import bench/_gpu_trial.py by name.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import hpo  # noqa: E402
from hpo.allocation import Layer, ModelCost, step_time  # noqa: E402
from hpo.examples.torch_digits import build_model  # noqa: E402

BATCH = 512
CHANNELS = [32, 48, 64]
DEVICE = "cuda"  # "cpu" for --dry-run: the whole script on fake GPU ids, to test it


# -- nvidia-smi, sampled ---------------------------------------------------------------


class GpuSampler:
    """``nvidia-smi`` every ``period`` s: utilisation and memory of the GPU,
    and each compute process's memory (its peak kept per PID)."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.samples: list[tuple[float, float, float]] = []  # (time, busy %, memory MiB)
        self.process_peak_mib: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.perf_counter()
            gpu = _smi("--query-gpu=utilization.gpu,memory.used")
            if gpu:
                busy, used = (float(v) for v in gpu[0][:2])
                self.samples.append((now, busy, used))
            for row in _smi("--query-compute-apps=pid,used_memory"):
                pid, used = int(row[0]), float(row[1])
                self.process_peak_mib[pid] = max(used, self.process_peak_mib.get(pid, 0.0))

    def busy_percent(self, start: float, end: float) -> float:
        inside = [busy for at, busy, _ in self.samples if start <= at <= end]
        return statistics.fmean(inside) if inside else float("nan")


def _smi(query: str) -> list[list[str]]:
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]


# -- 1 and 2: packing and isolation -------------------------------------------------


def calibrate_steps(trial_s: float) -> int:
    """Steps for one trial of the widest CNN alone to train about ``trial_s`` s."""
    model = build_model(28, max(CHANNELS)).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(BATCH, 1, 28, 28, device=DEVICE)
    y = torch.randint(0, 10, (BATCH,), device=DEVICE)
    if DEVICE != "cuda":
        return 2  # a dry run only tries the code
    per_step = _step_seconds(model, optimizer, x, y, 200)
    return max(50, int(trial_s / 2 / per_step))  # two epochs per trial


def study(share: float, trials: int, steps: int, tmp: Path, warm: bool = True,
          scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
    """One study of ``trials`` trials at ``share`` GPUs each; ``warm``: their
    processes fork from the workers' warm processes (else a fresh Python
    each, ``HPO_WARM_START=0``); ``scheduling``: the space's, to suspend and
    resume them."""
    name = f"gpu-{share:g}" + ("" if warm else "-fresh") + ("-segments" if scheduling else "")
    probe = tmp / f"probe-{name}"
    probe.mkdir()
    space = {
        "name": name, "objective": "_gpu_trial:train",
        "metric": {"name": "loss", "direction": "minimize"},
        "search": {"algorithm": "grid"},
        "resources": {"gpus": share, "cpus": 1},
        "fixed": {"batch_size": BATCH, "steps_per_epoch": steps, "max_epochs": 2,
                  "probe_dir": str(probe)},
        "space": {"channels": CHANNELS, "seed": list(range(trials // len(CHANNELS)))},
        **({"scheduling": scheduling} if scheduling else {}),
    }
    os.environ["HPO_WARM_START"] = "1" if warm else "0"  # the study's workers inherit it
    try:
        with GpuSampler() as sampler:
            started = time.perf_counter()
            result = hpo.run(space, engine="dask", runs_dir=tmp / "runs", progress=True)
            ended = time.perf_counter()
    finally:
        os.environ.pop("HPO_WARM_START")
    makespan = ended - started
    probes = [json.loads(p.read_text()) for p in sorted(probe.glob("*.json"))]
    return {
        "share": share, "warm": warm, "trials": len(result.trials),
        "complete": result.counts.get("COMPLETE", 0),
        "makespan_s": makespan, "trials_per_min": 60 * len(result.trials) / makespan,
        "gpu_busy_pct": sampler.busy_percent(started, ended),
        "peak_gpu_memory_mib": max((m for _, _, m in sampler.samples), default=float("nan")),
        "probes": probes, **_starts(tmp / "runs" / name, probes),
        "process_peak_mib": {str(pid): mib for pid, mib in sampler.process_peak_mib.items()},
    }


def _starts(run_dir: Path, probes: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the trials' last segments: from the task's start on its
    worker to the objective's first line (the process's start), and on to
    its first step (CUDA, the model, the checkpoint's restore)."""
    from hpo.store import RunDir
    from hpo.store.records import RUN_ATTR

    began = {t.number: t.system_attrs[RUN_ATTR]["segment_started_at"]
             for t in RunDir(run_dir).load_study().trials if RUN_ATTR in t.system_attrs}
    process = [p["entered_at"] - began[p["number"]] for p in probes if p["number"] in began]
    first = [p["first_step_at"] - began[p["number"]] for p in probes
             if p["number"] in began and p.get("first_step_at")]
    median = statistics.median
    return {"process_start_s": median(process) if process else float("nan"),
            "first_step_s": median(first) if first else float("nan")}


def report_packing(packed: dict[str, Any], alone: dict[str, Any], *others: dict[str, Any]) -> float:
    print("\n1. packing: the same trials, four to a GPU against one at a time")
    print(f"  {'gpus per trial':15s} {'process':>8s} {'trials':>6s} {'makespan_s':>10s} "
          f"{'trials/min':>10s} {'GPU busy %':>10s} {'peak MiB':>9s} {'start s':>7s} "
          f"{'1st step s':>10s}")
    for row in (packed, alone, *others):
        print(f"  {row['share']:<15g} {'warm' if row['warm'] else 'fresh':>8s} {row['complete']:>6d} "
              f"{row['makespan_s']:10.1f} {row['trials_per_min']:10.2f} {row['gpu_busy_pct']:10.1f} "
              f"{row['peak_gpu_memory_mib']:9.0f} {row['process_start_s']:7.2f} "
              f"{row['first_step_s']:10.2f}")
    print("  start: the task's start on its worker to the objective's first line; 1st step: to its "
          "first training step (CUDA, the model, a checkpoint's restore)")
    speedup = packed["trials_per_min"] / alone["trials_per_min"]
    print(f"  packed / one at a time: {speedup:.2f}x the trials per minute")
    return speedup


def report_isolation(packed: dict[str, Any]) -> None:
    print("\n2. isolation: what each packed trial's process saw")
    print(f"  {'trial':>5s} {'gpus':>6s} {'CUDA_VISIBLE':>12s} {'devices':>7s} {'share':>5s} "
          f"{'peak GiB':>8s} {'share GiB':>9s} {'beyond refused':>14s} {'smi MiB':>8s}")
    for seen in sorted(packed["probes"], key=lambda s: s["number"]):
        limit = seen["memory_fraction"] * seen.get("total_gb", float("nan"))
        smi = packed["process_peak_mib"].get(str(seen["pid"]), float("nan"))
        print(f"  {seen['number']:>5d} {','.join(seen['gpus']):>6s} "
              f"{str(seen['cuda_visible_devices']):>12s} {seen['device_count']:>7d} "
              f"{seen['memory_fraction']:>5g} {seen.get('peak_reserved_gb', 0):8.2f} {limit:9.1f} "
              f"{str(seen.get('beyond_share_refused')):>14s} {smi:8.0f}")
    ok = all(s["device_count"] == 1 and s.get("beyond_share_refused") is True
             and s.get("peak_reserved_gb", 0) <= s["memory_fraction"] * s.get("total_gb", 0)
             for s in packed["probes"])
    print(f"  every trial saw one device and stayed within its share: {'yes' if ok else 'NO'}")
    print("  (nvidia-smi's per-process figure adds the CUDA context, which the share does not cover)")


# -- 3: exact resume on the GPU ---------------------------------------------------------


def resume_on_gpu() -> dict[str, Any]:
    from hpo.check_resume import check_resume, parse_config
    from hpo.space import load_spec

    config = {"optimizer": "sgd", "learning_rate": 0.05, "channels": 16, "dropout": 0.1,
              "max_epochs": 6, "device": DEVICE, "deterministic": True}
    print("\n3. exact resume on the GPU: hpo check-resume search_spaces/torch_digits.json "
          f"--suspend-at 2 --config '{json.dumps(config)}'", flush=True)
    spec = load_spec(ROOT / "search_spaces/torch_digits.json")
    try:
        text = check_resume(spec, parse_config(json.dumps(config), spec), 2)
    except Exception as exc:  # the figures of the other sections still count
        text = f"check-resume failed: {type(exc).__name__}: {exc}"
    print("\n".join("  " + line for line in text.splitlines()))
    saved = re.search(r"last save ([\d.]+) ms, restore ([\d.]+) ms", text)
    return {"identical": "verdict: identical after resume" in text,
            "save_ms": float(saved[1]) if saved else None,
            "restore_ms": float(saved[2]) if saved else None}


# -- 4: the paraDL cost model --------------------------------------------------------------


def _step_seconds(model: nn.Module, optimizer: Any, x: Any, y: Any, steps: int = 50) -> float:
    """Mean seconds per training step, the GPU synchronised, after a warm-up."""
    loss_of = nn.CrossEntropyLoss() if y.dtype == torch.long else nn.MSELoss()
    steps = steps if DEVICE == "cuda" else 2  # a dry run only tries the code
    for _ in range(10 if DEVICE == "cuda" else 1):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(x), y).backward()
        optimizer.step()
    _synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(x), y).backward()
        optimizer.step()
    _synchronize()
    return (time.perf_counter() - started) / steps


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _time_alone(part: nn.Module, in_shape: tuple, batch: int) -> float:
    part = part.to(DEVICE)
    x = torch.rand(batch, *in_shape, device=DEVICE)
    with torch.no_grad():
        y = torch.zeros_like(part(x))
    weights = list(part.parameters())
    optimizer = torch.optim.SGD(weights or [torch.zeros(1, device=DEVICE, requires_grad=True)],
                                lr=0.01)
    x.requires_grad_(not weights)  # a weightless part still runs its backward
    return _step_seconds(part, optimizer, x, y)


def _layers(model: nn.Sequential) -> list[tuple[nn.Module, tuple, tuple, int]]:
    """The CNN cut into its three timed parts: (part, input shape, output shape, weights)."""
    convs = [i for i, m in enumerate(model) if isinstance(m, nn.Conv2d)]
    cuts = [(0, convs[1]), (convs[1], convs[1] + 3), (convs[1] + 3, len(model))]
    shape: tuple = (1, 28, 28)
    parts = []
    for start, end in cuts:
        part = nn.Sequential(*list(model)[start:end])
        with torch.no_grad():
            out = tuple(part(torch.zeros(1, *shape)).shape[1:])
        parts.append((part, shape, out, sum(p.numel() for p in part.parameters())))
        shape = out
    return parts


def cost_model(small: int = 128, large: int = 1024) -> list[dict[str, Any]]:
    trivial = _time_alone(nn.Linear(1, 1), (1,), small)  # the framework's fixed cost per step
    rows = []
    for channels in CHANNELS:
        layers = []
        for part, in_shape, out_shape, weights in _layers(build_model(28, channels)):
            t_small, t_large = (_time_alone(part, in_shape, b) for b in (small, large))
            slope = max((t_large - t_small) / (large - small), 0.0)
            layers.append(Layer(_size(in_shape), _size(out_shape), weights, "given",
                                fw_bw_s=slope, wu_s=max(t_small - small * slope - trivial, 0.0)))
        for batch in (256, 1024):
            cost = ModelCost(tuple(layers), samples=batch * 100, batch_size=batch,
                             step_overhead_s=trivial)
            model = build_model(28, channels).to(DEVICE)
            measured = _step_seconds(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                     torch.rand(batch, 1, 28, 28, device=DEVICE),
                                     torch.randint(0, 10, (batch,), device=DEVICE))
            predicted = step_time(cost)
            rows.append({"channels": channels, "batch": batch, "predicted_ms": 1e3 * predicted,
                         "measured_ms": 1e3 * measured,
                         "accuracy_pct": 100 * (1 - abs(predicted - measured) / measured)})
    print("\n4. the paraDL cost model: predicted against measured step time")
    print(f"  {'channels':>8s} {'batch':>5s} {'predicted_ms':>12s} {'measured_ms':>11s} {'accuracy %':>10s}")
    for row in rows:
        print(f"  {row['channels']:>8d} {row['batch']:>5d} {row['predicted_ms']:12.3f} "
              f"{row['measured_ms']:11.3f} {row['accuracy_pct']:10.1f}")
    print(f"  median accuracy: {statistics.median(r['accuracy_pct'] for r in rows):.1f}% "
          "(the thesis reports 86.74% on average)")
    return rows


def _size(shape: tuple) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


# -- the run ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="trials per study (a multiple of 3)")
    parser.add_argument("--trial-s", type=float, default=6.0,
                        help="seconds one trial trains alone (sets its steps)")
    parser.add_argument("--out", default=".", help="where gpu.json goes")
    parser.add_argument("--fresh", action="store_true",
                        help="also the packed study with a fresh Python per trial (HPO_WARM_START=0)")
    parser.add_argument("--resume", action="store_true",
                        help="also a round-robin study whose trials resume a segment per epoch")
    parser.add_argument("--quick", action="store_true",
                        help="packing only: no check-resume, no cost model")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: the whole script on the CPU with a fake GPU id (figures mean nothing)")
    args = parser.parse_args()
    if args.dry_run:
        global DEVICE, BATCH
        DEVICE, BATCH = "cpu", 32
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # one fake GPU for the engine to pack
    elif not torch.cuda.is_available():
        sys.exit("bench/gpu.py: no CUDA device is visible here; run it on a machine with a GPU "
                 "(--dry-run tries the script on the CPU)")
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU (dry run)"
    print(f"device: {name}, torch {torch.__version__}, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    figures: dict[str, Any] = {"device": name}
    steps = calibrate_steps(args.trial_s)
    print(f"trial size: 2 epochs of {steps} steps of batch {BATCH} (about {args.trial_s:g} s alone)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        packed = study(0.25, args.trials, steps, tmp)
        alone = study(1, args.trials, steps, tmp)
        others = [study(0.25, args.trials, steps, tmp, warm=False)] if args.fresh else []
        # Round robin, a segment per epoch: every trial's second epoch is a resumed segment.
        segments = study(1, len(CHANNELS), steps, tmp, scheduling={
            "policy": "round_robin", "segment_steps": 1}) if args.resume else None
    speedup = report_packing(packed, alone, *others, *([segments] if segments else []))
    if segments:
        print(f"  resumed segments (round robin, one epoch each): {segments['first_step_s']:.2f} s "
              "from the segment's start to its first step, its checkpoint's restore included")
    report_isolation(packed)
    figures.update(packed=packed, alone=alone, speedup=speedup, fresh=others, segments=segments)
    if not args.quick:
        figures["resume"] = resume_on_gpu()
        figures["cost_model"] = cost_model()
    Path(args.out, "gpu.json").write_text(json.dumps(figures, indent=1))
    print(f"gpu_busy_pct={packed['gpu_busy_pct']:.1f}")
    if segments:
        print(f"segment_resume_s={segments['first_step_s']:.2f}")
    print(f"packed_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
