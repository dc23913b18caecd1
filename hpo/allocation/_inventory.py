"""What the cluster offers and what is taken: nodes, their CPUs, their GPUs.

The master keeps this ledger on engines that let it choose where a trial
runs (Dask): it places each trial on concrete GPU ids and hosts, so that
trials sharing a GPU, trials on several GPUs and trials on several nodes
never overlap. GPUs are shared best-fit (a 0.25 trial goes to the fullest
GPU it still fits on), so that whole GPUs stay free for whole-GPU trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hpo.allocation._shape import TrialShape

__all__ = ["Device", "Node", "Placement", "Inventory"]

_EPS = 1e-9


@dataclass
class Device:
    """One GPU: its id on its node, its relative speed, and the share taken."""

    id: str
    speed: float = 1.0
    used: float = 0.0

    @property
    def free(self) -> float:
        return 1.0 - self.used


@dataclass
class Node:
    """One engine worker: its host, its address for the engine, its CPUs and GPUs."""

    host: str
    worker: str | None = None
    cpus: int = 1
    devices: list[Device] = field(default_factory=list)
    cpus_used: int = 0

    def whole_free(self) -> list[Device]:
        return [d for d in self.devices if d.used <= _EPS]


@dataclass(frozen=True)
class Placement:
    """Where one trial runs: its nodes (rank order), the GPU ids it uses on
    each, its share of each GPU, and the speed of its slowest GPU."""

    hosts: tuple[str, ...]
    workers: tuple[str | None, ...]
    node_devices: tuple[tuple[str, ...], ...]
    share: float = 1.0
    speed: float = 1.0

    @property
    def devices(self) -> tuple[str, ...]:
        """The GPU ids on the trial's first node (every node holds as many)."""
        return self.node_devices[0] if self.node_devices else ()

    def describe(self) -> str:
        where = "+".join(self.hosts)
        if not self.devices:
            return where
        gpus = ",".join(self.devices)
        share = f" ({self.share:g} of it)" if self.share < 1 else ""
        return f"{where} gpu {gpus}{share}, speed {self.speed:g}"


class Inventory:
    """The nodes of a cluster and what running trials hold of them.

    >>> inv = Inventory([Node("n1", cpus=8, devices=[Device("0"), Device("1", speed=0.5)])])
    >>> inv.place(TrialShape(gpus=0.25)).devices, inv.place(TrialShape(gpus=0.5)).devices
    (('0',), ('0',))
    >>> inv.place(TrialShape(gpus=1)).devices
    ('1',)
    >>> inv.place(TrialShape(gpus=1)) is None
    True
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self._held: dict[int, tuple[Placement, TrialShape]] = {}

    @property
    def gpus_per_node(self) -> int:
        return max((len(n.devices) for n in self.nodes), default=0)

    @property
    def gpus(self) -> int:
        return sum(len(n.devices) for n in self.nodes)

    def free_gpus(self) -> int:
        """Whole GPUs nobody holds any share of."""
        return sum(len(n.whole_free()) for n in self.nodes)

    def fits_ever(self, shape: TrialShape) -> bool:
        """Whether an idle cluster could run ``shape`` at all."""
        hosts = {n.host for n in self.nodes
                 if n.cpus >= shape.cpus and len(n.devices) >= shape.devices * (shape.gpus > 0)}
        return len(hosts) >= shape.nodes

    def place(self, shape: TrialShape, prefer_fast: bool | None = None,
              on: Sequence[tuple[int, Sequence[int]]] | None = None,
              speed: float | None = None) -> Placement | None:
        """Take what ``shape`` needs and say where, or None when it does not
        fit now. ``prefer_fast``: the fastest GPUs (True), the slowest
        (False), or the best fit (None); ``speed``: GPUs of that speed only.
        ``on`` forces (node index, device indexes) pairs, as the rate
        allocation's node packing chose them."""
        chosen = self._chosen(on) if on is not None else self._choose(shape, prefer_fast, speed)
        if chosen is None:
            return None
        share = shape.gpus if shape.shared else 1.0
        for node, devices in chosen:
            node.cpus_used += shape.cpus
            for device in devices:
                device.used += share if shape.gpus else 0.0
        picked = [d for _, devices in chosen for d in devices]
        return Placement(hosts=tuple(n.host for n, _ in chosen), workers=tuple(n.worker for n, _ in chosen),
                         node_devices=tuple(tuple(d.id for d in ds) for _, ds in chosen),
                         share=share, speed=min((d.speed for d in picked), default=1.0))

    def hold(self, key: int, placement: Placement, shape: TrialShape) -> None:
        self._held[key] = (placement, shape)

    def release(self, key: int) -> Placement | None:
        """Give back what trial ``key`` held (nothing if it held nothing)."""
        held = self._held.pop(key, None)
        if held is None:
            return None
        placement, shape = held
        share = placement.share if shape.gpus else 0.0
        for host, worker, ids in zip(placement.hosts, placement.workers, placement.node_devices):
            node = next(n for n in self.nodes if n.host == host and n.worker == worker)
            node.cpus_used -= shape.cpus
            for device in node.devices:
                if device.id in ids:
                    device.used = max(device.used - share, 0.0)
        return placement

    def held(self, key: int) -> tuple[Placement, TrialShape] | None:
        return self._held.get(key)

    def _chosen(self, on: Sequence[tuple[int, Sequence[int]]]) -> list[tuple[Node, list[Device]]]:
        return [(self.nodes[i], [self.nodes[i].devices[j] for j in js]) for i, js in on]

    def speed_classes(self) -> dict[float, tuple[int, int]]:
        """Free whole GPUs by speed: speed -> (how many, the most on one node)."""
        classes: dict[float, tuple[int, int]] = {}
        for node in self.nodes:
            for speed in {d.speed for d in node.whole_free()}:
                here = sum(1 for d in node.whole_free() if d.speed == speed)
                total, widest = classes.get(speed, (0, 0))
                classes[speed] = (total + here, max(widest, here))
        return dict(sorted(classes.items(), reverse=True))

    def _choose(self, shape: TrialShape, prefer_fast: bool | None,
                speed: float | None = None) -> list[tuple[Node, list[Device]]] | None:
        found = [(node, self._devices_on(node, shape, prefer_fast, speed)) for node in self.nodes
                 if node.cpus - node.cpus_used >= shape.cpus]
        options = [(node, devices) for node, devices in found if devices is not None]
        options.sort(key=lambda nd: self._rank(nd[0], nd[1], shape, prefer_fast))
        chosen, hosts = [], set()
        for node, devices in options:  # distinct hosts for a multi-node trial
            if node.host not in hosts:
                chosen.append((node, devices))
                hosts.add(node.host)
            if len(chosen) == shape.nodes:
                return chosen
        return None

    @staticmethod
    def _devices_on(node: Node, shape: TrialShape, prefer_fast: bool | None,
                    speed: float | None = None) -> list[Device] | None:
        if not shape.gpus:
            return []
        devices = [d for d in node.devices if speed is None or d.speed == speed]
        if shape.shared:
            fitting = [d for d in devices if d.free + _EPS >= shape.gpus]
            if not fitting:
                return None
            # Best fit: the fullest GPU it fits on; then by the speed asked for.
            return [min(fitting, key=lambda d: (d.free, _speed_key(d, prefer_fast)))]
        free = sorted((d for d in devices if d.used <= _EPS), key=lambda d: _speed_key(d, prefer_fast))
        return free[:shape.devices] if len(free) >= shape.devices else None

    @staticmethod
    def _rank(node: Node, devices: list[Device], shape: TrialShape, prefer_fast: bool | None) -> tuple:
        speed = min((d.speed for d in devices), default=1.0)
        preference = -speed if prefer_fast else speed if prefer_fast is False else 0.0
        # Then the node with the fewest free GPUs it fits on: keeps whole nodes free.
        return preference, len(node.whole_free()), node.cpus - node.cpus_used


def _speed_key(device: Device, prefer_fast: bool | None) -> tuple[float, str]:
    if prefer_fast is None:
        return 0.0, device.id
    return (-device.speed if prefer_fast else device.speed), device.id
