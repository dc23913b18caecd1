"""Predict a trial's time per training step and its memory from its configuration.

The model is paraDL's oracle for data parallelism (Kahira, thesis, chapter 4).
Over layers ``l = 1..G``, for one epoch of ``D`` samples at global mini-batch
``B`` on ``p`` devices:

* compute: ``T_comp = (D/p)·Σ(FW_l + BW_l) + (D/B)·Σ WU_l``, where ``FW_l + BW_l``
  is layer ``l``'s forward and backward time for one sample and ``WU_l`` its
  weight update per iteration, both measured on the target machine;
* communication, a ring allreduce of the gradients:
  ``T_comm = 2(D/B)(p − 1)(α + Σ|w_l|·δβ/p)``, zero on one device;
* memory per device: ``M = 2γδ·Σ((B/p)(|x_l| + |y_l|) + |w_l|)``.

A step takes ``(T_comp + T_comm) / (D/B)``. The one addition to the thesis is
``step_overhead_s``, the framework's fixed cost per step (Python, dispatch,
metrics, and the step's share of the per-epoch validation pass), counted once
per step: on a CPU a small network's step is mostly that overhead, which the
per-layer sums do not see. :func:`profile_keras` measures ``FW_l + BW_l``,
``WU_l`` and the overhead with Keras; :func:`measure_network` measures ``α``
and ``β`` (the Hockney model ``T = α + m·β``).

Keras and TensorFlow are imported only inside :func:`profile_keras`.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "Layer",
    "ModelCost",
    "Network",
    "step_time",
    "epoch_time",
    "trial_time",
    "memory_bytes",
    "fits",
    "training_rate",
    "profile_keras",
    "measure_network",
    "accuracy",
]

PROFILED_KINDS = ("dense", "dropout")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class Layer:
    """One layer's sizes (per sample) and, once measured, its times.

    ``kind`` and ``options`` say what :func:`profile_keras` builds: ``"dense"``
    with ``units`` and ``activation``, ``"dropout"`` with ``rate``; ``"given"``
    for a layer whose ``fw_bw_s`` and ``wu_s`` are set by hand.
    """

    inputs: int
    outputs: int
    weights: int
    kind: str = "dense"
    options: tuple = ()
    fw_bw_s: float | None = None
    wu_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("inputs", "outputs", "weights"):
            _check(getattr(self, name) >= 0, f"Layer.{name} is {getattr(self, name)}; "
                   "give a size of 0 or more elements")
        for name in ("fw_bw_s", "wu_s"):
            value = getattr(self, name)
            _check(value is None or value >= 0, f"Layer.{name} is {value}; give seconds "
                   ">= 0, or None to have profile_keras measure it")

    @property
    def measured(self) -> bool:
        """Whether both times are known."""
        return self.fw_bw_s is not None and self.wu_s is not None


@dataclass(frozen=True)
class ModelCost:
    """A trial as the cost model sees it: its layers and how it trains.

    ``validation_samples``, ``optimizer``, ``loss`` and ``metrics`` describe the
    training loop, so that :func:`profile_keras` times the same loop; they do
    not enter the formulas.
    """

    layers: tuple[Layer, ...]
    samples: int
    batch_size: int
    epochs: int = 1
    bytes_per_item: int = 4
    memory_reuse: float = 1.0
    step_overhead_s: float = 0.0
    validation_samples: int = 0
    optimizer: str = "sgd"
    loss: str = "mean_squared_error"
    metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(len(self.layers) > 0, "ModelCost.layers is empty; give at least one Layer")
        for name in ("samples", "batch_size", "epochs", "bytes_per_item"):
            _check(getattr(self, name) >= 1, f"ModelCost.{name} is {getattr(self, name)}; "
                   "it must be at least 1")
        _check(self.memory_reuse > 0, f"ModelCost.memory_reuse is {self.memory_reuse}; "
               "give a factor > 0 (1.0: no reuse)")
        _check(self.step_overhead_s >= 0, f"ModelCost.step_overhead_s is "
               f"{self.step_overhead_s}; give seconds >= 0")
        _check(self.validation_samples >= 0, f"ModelCost.validation_samples is "
               f"{self.validation_samples}; give 0 or more")

    @property
    def steps_per_epoch(self) -> int:
        """Iterations per epoch; the last one may be a partial batch, as in Keras."""
        return math.ceil(self.samples / self.batch_size)


@dataclass(frozen=True)
class Network:
    """The Hockney model of a link: a message of ``m`` bytes takes ``α + m·β`` seconds."""

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        _check(self.alpha_s >= 0, f"Network.alpha_s is {self.alpha_s}; give seconds >= 0")
        _check(self.beta_s_per_byte >= 0, f"Network.beta_s_per_byte is "
               f"{self.beta_s_per_byte}; give seconds per byte >= 0")


# ------------------------------------------------------------------ formulas


def _check_run(cost: ModelCost, gpus: int, speed: float) -> None:
    _check(gpus >= 1, f"gpus is {gpus}; give 1 or more devices")
    _check(gpus <= cost.batch_size, f"gpus ({gpus}) exceeds batch_size "
           f"({cost.batch_size}): some devices would get no sample; use fewer gpus")
    _check(speed > 0, f"speed is {speed}; give a relative device speed > 0 (1.0: as profiled)")
    missing = [i for i, layer in enumerate(cost.layers) if not layer.measured]
    _check(not missing, f"layers {missing} have no fw_bw_s/wu_s; set them or call "
           "profile_keras(cost) first")


def _compute_per_epoch(cost: ModelCost, gpus: int) -> float:
    # Every layer is measured (_check_run): None is never added.
    per_sample = sum(layer.fw_bw_s or 0.0 for layer in cost.layers)
    per_iteration = sum(layer.wu_s or 0.0 for layer in cost.layers)
    return cost.samples / gpus * per_sample + cost.steps_per_epoch * per_iteration


def _comm_per_epoch(cost: ModelCost, gpus: int, network: Network) -> float:
    if gpus == 1:
        return 0.0
    weights = sum(layer.weights for layer in cost.layers)
    per_round = network.alpha_s + weights * cost.bytes_per_item * network.beta_s_per_byte / gpus
    return 2 * cost.steps_per_epoch * (gpus - 1) * per_round


def epoch_time(cost: ModelCost, gpus: int = 1, network: Network = Network(),
               speed: float = 1.0) -> float:
    """Seconds per epoch: ``T_comp / speed + T_comm`` plus the overhead once per step.

    ``D/B`` of the thesis is taken as Keras's ``ceil(D/B)`` iterations.

    >>> cost = ModelCost((Layer(2, 2, 6, "given", fw_bw_s=1e-3, wu_s=0.01),), 100, 10)
    >>> round(epoch_time(cost), 6)  # 100 samples x 1 ms + 10 updates x 10 ms
    0.2
    """
    _check_run(cost, gpus, speed)
    compute = _compute_per_epoch(cost, gpus) / speed
    overhead = cost.steps_per_epoch * cost.step_overhead_s
    return compute + _comm_per_epoch(cost, gpus, network) + overhead


def step_time(cost: ModelCost, gpus: int = 1, network: Network = Network(),
              speed: float = 1.0) -> float:
    """Seconds per iteration on ``gpus`` devices of relative speed ``speed``.

    Compute is divided by ``speed``; communication and the framework's
    per-step overhead (host work) are not.

    >>> cost = ModelCost((Layer(2, 2, 6, "given", fw_bw_s=1e-3, wu_s=0.01),), 100, 10)
    >>> round(step_time(cost, gpus=2), 6)  # 5 samples x 1 ms + 10 ms, and p=2 with α=β=0
    0.015
    """
    return epoch_time(cost, gpus, network, speed) / cost.steps_per_epoch


def trial_time(cost: ModelCost, gpus: int = 1, network: Network = Network(),
               speed: float = 1.0) -> float:
    """Seconds for the whole trial: ``epochs`` epochs."""
    return cost.epochs * epoch_time(cost, gpus, network, speed)


def training_rate(cost: ModelCost, gpus: int = 1, network: Network = Network(),
                  speed: float = 1.0) -> float:
    """Samples per second: ``batch_size / step_time``."""
    return cost.batch_size / step_time(cost, gpus, network, speed)


def memory_bytes(cost: ModelCost, gpus: int = 1) -> float:
    """Bytes per device: ``2γδ·Σ((B/p)(|x_l| + |y_l|) + |w_l|)``.

    >>> cost = ModelCost((Layer(64, 10, 650),), samples=100, batch_size=32)
    >>> memory_bytes(cost)  # 2 x 4 x (32 x 74 + 650)
    24144.0
    """
    _check(gpus >= 1, f"gpus is {gpus}; give 1 or more devices")
    local_batch = cost.batch_size / gpus
    items = sum(local_batch * (layer.inputs + layer.outputs) + layer.weights
                for layer in cost.layers)
    return float(2 * cost.memory_reuse * cost.bytes_per_item * items)


def fits(cost: ModelCost, gpus: int, device_bytes: float) -> bool:
    """Whether the predicted memory per device is at most ``device_bytes``."""
    return memory_bytes(cost, gpus) <= device_bytes


def accuracy(predicted: float, measured: float) -> float:
    """The thesis's accuracy of a prediction: ``1 − |predicted − measured| / measured``.

    >>> accuracy(0.9, 1.0)
    0.9
    """
    _check(measured > 0, f"measured is {measured}; accuracy needs a measured value > 0")
    return 1.0 - abs(predicted - measured) / measured


# ----------------------------------------------------------------- profiling

# Batch sizes of the per-layer timings: t(b) = b·(FW+BW) + c.
_SMALL_BATCH = 32
_LARGE_BATCH = 256
_ROUNDS = 9          # interleaved rounds; the fastest is the least disturbed
_CALLS = 10          # train steps per timed round
# Overhead fit: the first epoch (tracing) is not counted; it stops after
# _FIT_SECONDS of counted epochs, and at least _FIT_MIN_EPOCHS of them.
_FIT_EPOCHS = 12
_FIT_MIN_EPOCHS = 3
_FIT_SECONDS = 1.0


class _Cache:
    """Measured values in a JSON file, keyed by host and what was measured."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else Path(path)
        self.entries: dict[str, Any] = {}
        if self.path is not None and self.path.exists():
            self.entries = json.loads(self.path.read_text() or "{}")

    @staticmethod
    def key(*parts: Any) -> str:
        return json.dumps([socket.gethostname(), *parts])

    def get(self, key: str) -> Any:
        return self.entries.get(key)

    def put(self, key: str, value: Any) -> None:
        self.entries[key] = value
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
        os.replace(tmp, self.path)  # readers never see half a file


def profile_keras(cost: ModelCost, *, cache: str | os.PathLike | None = None) -> ModelCost:
    """Return ``cost`` with every missing ``fw_bw_s``/``wu_s`` and a zero
    ``step_overhead_s`` measured on this machine with Keras.

    Each layer shape is timed alone (a one-layer model, the trial's optimizer,
    mean squared error against zeros) at two batch sizes: the slope of
    ``t(b) = b·(FW+BW) + c`` is ``FW+BW`` per sample and ``c`` minus the
    intercept of a trivial model is ``WU``. The overhead is the step time of
    ``model.fit`` on a trivial model with the trial's samples, batch size,
    validation set, optimizer, loss and metrics. Results are cached in the
    JSON file ``cache`` per host and shape, so each is measured once.
    """
    store = _Cache(cache)
    layers = tuple(layer if layer.measured else _profile_layer(layer, cost, store)
                   for layer in cost.layers)
    overhead = cost.step_overhead_s or _profile_overhead(cost, store)
    return replace(cost, layers=layers, step_overhead_s=overhead)


def _options(layer: Layer) -> dict[str, Any]:
    return dict(layer.options)


def _profile_layer(layer: Layer, cost: ModelCost, store: _Cache) -> Layer:
    _check(layer.kind in PROFILED_KINDS, f"Layer.kind {layer.kind!r} cannot be profiled; "
           f"use one of {PROFILED_KINDS} or set fw_bw_s and wu_s")
    key = store.key("layer", layer.kind, sorted(layer.options), layer.inputs,
                    cost.optimizer.lower())
    found = store.get(key)
    if found is None:
        slope, extra = _time_layer(_keras_layer(layer.kind, _options(layer)), layer.inputs,
                                   cost.optimizer)
        found = {"fw_bw_s": slope, "wu_s": extra if layer.weights else 0.0}
        store.put(key, found)
    given = {name: getattr(layer, name) for name in ("fw_bw_s", "wu_s")}
    return replace(layer, **{name: found[name] if value is None else value
                             for name, value in given.items()})


def _keras_layer(kind: str, options: dict[str, Any]) -> Any:
    import keras

    if kind == "dense":
        _check("units" in options, "a dense Layer needs options (('units', n), ...)")
        return keras.layers.Dense(int(options["units"]), activation=options.get("activation"))
    return keras.layers.Dropout(float(options.get("rate", 0.0)))


def _time_layer(layer: Any, inputs: int, optimizer: str) -> tuple[float, float]:
    """``FW+BW`` per sample, and the fixed cost per step beyond a 1-unit dense
    layer on 1 input (whose step is the framework's own fixed cost)."""
    model, small, large = _one_layer_steps(layer, inputs, optimizer)
    base, base_small, _ = _one_layer_steps(_keras_layer("dense", {"units": 1}), 1, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a weightless layer: "no trainable weights"
        fastest = _fastest_steps([(model, small), (model, large), (base, base_small)])
    slope = max((fastest[1] - fastest[0]) / (_LARGE_BATCH - _SMALL_BATCH), 0.0)
    return slope, max(fastest[0] - _SMALL_BATCH * slope - fastest[2], 0.0)


def _one_layer_steps(layer: Any, inputs: int, optimizer: str) -> tuple[Any, tuple, tuple]:
    """A compiled one-layer model and its small and large training batches."""
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input(shape=(inputs,)), layer])
    model.compile(optimizer=optimizer, loss="mean_squared_error")
    outputs = model.output_shape[1:]
    return model, *((np.random.default_rng(0).random((b, inputs), dtype=np.float32),
                     np.zeros((b, *outputs), np.float32)) for b in (_SMALL_BATCH, _LARGE_BATCH))


def _fastest_steps(runs: list[tuple[Any, tuple]]) -> list[float]:
    """The fastest mean time of ``_CALLS`` ``train_on_batch`` calls of each
    (model, batch), interleaved so that a slow spell of the machine hits all."""
    for model, batch in runs:
        for _ in range(3):  # warm-up: tracing, allocation
            model.train_on_batch(*batch)
    best = [math.inf] * len(runs)
    for _ in range(_ROUNDS):
        for i, (model, batch) in enumerate(runs):
            start = time.perf_counter()
            for _ in range(_CALLS):
                model.train_on_batch(*batch)
            best[i] = min(best[i], (time.perf_counter() - start) / _CALLS)
    return best


def _profile_overhead(cost: ModelCost, store: _Cache) -> float:
    last = cost.layers[-1]
    activation = _options(last).get("activation")
    key = store.key("overhead", cost.samples, cost.batch_size, cost.validation_samples,
                    cost.optimizer.lower(), cost.loss, list(cost.metrics), last.outputs,
                    activation)
    found = store.get(key)
    if found is None:
        found = _fit_step_seconds(cost, max(last.outputs, 1), activation)
        store.put(key, found)
    return found


def _fit_step_seconds(cost: ModelCost, outputs: int, activation: str | None) -> float:
    """Step time of ``model.fit`` on a 1-input dense model shaped like the trial's
    output: the training loop without the trial's layers. The fastest timed
    epoch is taken: other work on the machine only ever adds time."""
    import keras
    import numpy as np

    def data(n: int) -> tuple[Any, Any]:
        target = (n,) if cost.loss.startswith("sparse") else (n, outputs)
        return np.zeros((n, 1), np.float32), np.zeros(target, np.float32)

    model = keras.Sequential([keras.Input(shape=(1,)),
                              keras.layers.Dense(outputs, activation=activation)])
    model.compile(optimizer=cost.optimizer, loss=cost.loss, metrics=list(cost.metrics) or None)
    timer = _EpochTimer()
    validation = data(cost.validation_samples) if cost.validation_samples else None
    model.fit(*data(cost.samples), validation_data=validation, epochs=_FIT_EPOCHS,
              batch_size=cost.batch_size, callbacks=[timer.callback()], verbose=0)
    return min(timer.seconds) / cost.steps_per_epoch


class _EpochTimer:
    """Wall time of each epoch after the first, from a Keras callback that stops
    training once enough epochs are timed."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.started = 0.0

    def enough(self) -> bool:
        return len(self.seconds) >= _FIT_MIN_EPOCHS and sum(self.seconds) >= _FIT_SECONDS

    def callback(self) -> Any:
        import keras

        timer = self

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                timer.started = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                if epoch > 0:
                    timer.seconds.append(time.perf_counter() - timer.started)
                self.model.stop_training = timer.enough()

        return Timer()


# ------------------------------------------------------------------- network

_NETWORK_SIZES = (64, 4096, 65536, 1 << 20, 4 << 20)


def measure_network(*, sizes: Iterable[int] = _NETWORK_SIZES, repeats: int = 10) -> Network:
    """Measure this machine's ``α`` and ``β`` by a TCP ping-pong on loopback.

    An echo thread returns each message; one direction takes half the round
    trip. The fastest of ``repeats`` trips per size is fitted by least squares
    (relative residuals, so small messages pin ``α``) to ``T = α + m·β``. This
    is the link of multi-process data parallelism on one node.
    """
    sizes = sorted({int(s) for s in sizes})
    _check(len(sizes) >= 2 and sizes[0] >= 1, f"sizes are {sizes}; give at least two "
           "distinct message sizes of 1 byte or more")
    _check(repeats >= 1, f"repeats is {repeats}; give 1 or more")
    server = socket.create_server(("127.0.0.1", 0))
    echo = threading.Thread(target=_echo, args=(server, max(sizes)), daemon=True)
    echo.start()
    with socket.create_connection(server.getsockname()) as link:
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(max(sizes))
        one_way = [_fastest_trip(link, buffer, size, repeats) / 2 for size in sizes]
    echo.join(timeout=5)
    server.close()
    alpha, beta = _fit_line(sizes, one_way)
    return Network(alpha_s=max(alpha, 0.0), beta_s_per_byte=max(beta, 0.0))


def _echo(server: socket.socket, largest: int) -> None:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(largest)
    with conn:
        while True:
            header = _receive(conn, bytearray(8), 8)
            if header is None:
                return
            size = int.from_bytes(header, "big")
            if _receive(conn, buffer, size) is None:
                return
            conn.sendall(memoryview(buffer)[:size])


def _receive(conn: socket.socket, buffer: bytearray, size: int) -> bytearray | None:
    view, got = memoryview(buffer), 0
    while got < size:
        n = conn.recv_into(view[got:size])
        if n == 0:
            return None
        got += n
    return buffer


def _fastest_trip(link: socket.socket, buffer: bytearray, size: int, repeats: int) -> float:
    payload = memoryview(buffer)[:size]
    best = math.inf
    for _ in range(repeats + 1):  # the first trip warms the connection up
        start = time.perf_counter()
        link.sendall(size.to_bytes(8, "big"))
        link.sendall(payload)
        _receive(link, buffer, size)
        best = min(best, time.perf_counter() - start)
    return best


def _fit_line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least squares of ``y = a + b·x`` with residuals relative to ``y``."""
    import numpy as np

    x, y = np.asarray(xs, float), np.asarray(ys, float)
    design = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    return float(a), float(b)
