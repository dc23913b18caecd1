"""FLEET's greedy flotilla: share GPUs among trials so they finish together.

A *flotilla* is a set of trials started at once. Each member gets enough GPUs
to train about as fast as the fastest member does on one GPU, so the members
end near the same time and free their GPUs together for the next flotilla.

The steps, as pure functions:

* :func:`profile_rate` turns profiled batch durations into a training rate;
* :class:`RateCurve` predicts a trial's rate on any GPU count (FLEET's Eq. 1);
* :func:`flotilla` picks members and GPU counts (Algorithm 1, createFlotilla);
* :func:`pack_nodes` places those counts on nodes (Algorithms 2 and 3);
* :func:`grow_choice` decides whether freed GPUs should grow a running trial.

Readings of the paper where its text leaves a choice:

* findNext adds the remaining candidate that needs the fewest GPUs to reach the
  target rate (ties: faster on one GPU, then mapping order).
* The pairing pass of Algorithm 2 pairs *complementary* remainders (their sum
  fills whole nodes); the printed pseudo-code keys both look-ups by the same
  remainder, which would only pair remainders of half a node.
* The placement score (the paper's Eq. 7 is not at hand) counts the nodes each
  member spans beyond the fewest it could use; fewer means less cross-node
  traffic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "RateCurve",
    "finish_spread",
    "flotilla",
    "grow_choice",
    "gpus_to_reach",
    "grow_saving",
    "pack_nodes",
    "placement_order",
    "profile_rate",
    "should_grow",
]

# The members of a flotilla, whatever names them (the planner: trial numbers).
K = TypeVar("K", bound=Hashable)

# Modelled rates carry float rounding; a rate this close to the target reaches it.
_RATE_TOLERANCE = 1e-9


def profile_rate(batch_seconds: Sequence[float], batch_size: int, max_batches: int = 48,
                 averaged: int = 20) -> float | None:
    """Samples per second from a profiling run, or None when it is too short.

    FLEET trains at most ``max_batches`` batches and times the last
    ``averaged`` of them; later batches are ignored. At least ``averaged + 1``
    batches are required so the first batch, which pays for warm-up (graph
    building, allocation, data loading), never enters the average.

    >>> profile_rate([2.0] * 28 + [0.125] * 20, batch_size=32)
    256.0
    >>> profile_rate([0.125] * 20, batch_size=32) is None
    True
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if averaged < 1:
        raise ValueError(f"averaged must be at least 1, got {averaged}")
    if max_batches <= averaged:
        raise ValueError(f"max_batches ({max_batches}) must exceed averaged ({averaged}) "
                         "so the warm-up batch is left out")
    profiled = list(batch_seconds[:max_batches])
    if len(profiled) < averaged + 1:
        return None
    timed = profiled[-averaged:]
    if any(seconds <= 0 for seconds in timed):
        raise ValueError("batch_seconds must be positive durations; drop or re-time the zero ones")
    return batch_size / (sum(timed) / averaged)


def _check_gpu_count(m: int, name: str = "m") -> None:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"{name} must be a whole number of GPUs, at least 1; got {m!r}")


def _eq1(base: int, r_base: float, r_before: float, m: int) -> float:
    """FLEET's Eq. 1: per-GPU rate decays geometrically past ``base``.

    >>> _eq1(8, 600.0, 560.0, 10)
    659.1796875
    """
    efficiency = r_base / r_before * (base - 1) / base
    return m * r_base / base * efficiency ** (m - base)


@dataclass(frozen=True)
class RateCurve:
    """A trial's training rate (samples/s) by GPU count, measured or predicted.

    ``measured`` is accepted as a mapping or pairs and kept as a sorted tuple
    of ``(gpus, rate)`` so the curve stays hashable; it must include one GPU,
    which FLEET always profiles. ``scaling`` is an optional cost model of the
    relative speed-up by GPU count; only its ratios are used.

    >>> curve = RateCurve({1: 100.0, 7: 560.0, 8: 600.0}, gpus_per_node=4)
    >>> curve.rate(8), curve.rate(10), curve.rate(3)
    (600.0, 659.1796875, 300.0)
    """

    measured: Mapping[int, float] | tuple[tuple[int, float], ...]
    gpus_per_node: int
    scaling: Callable[[int], float] | None = None

    def __post_init__(self) -> None:
        pairs = self.measured.items() if isinstance(self.measured, Mapping) else self.measured
        pairs = tuple(sorted((m, float(r)) for m, r in pairs))
        counts = [m for m, _ in pairs]
        for m in counts:
            _check_gpu_count(m, "each GPU count in measured")
        if len(set(counts)) != len(counts):
            raise ValueError(f"measured lists a GPU count twice ({counts}); keep one rate per count")
        if 1 not in counts:
            raise ValueError("measured must include the rate on 1 GPU; profile the trial on one GPU")
        if any(r <= 0 for _, r in pairs):
            raise ValueError("measured rates must be positive samples per second")
        _check_gpu_count(self.gpus_per_node, "gpus_per_node")
        object.__setattr__(self, "measured", pairs)

    def rate(self, m: int) -> float:
        """The rate on ``m`` GPUs.

        In order: the measured rate; Eq. 1 past ``M_b = 2 * gpus_per_node``
        when ``M_b`` and ``M_b - 1`` were measured; Eq. 1 past the largest
        measured count ``a`` when ``a - 1`` was measured too; the nearest
        measured count below ``m`` scaled by the cost model; that count scaled
        linearly, which assumes no loss to communication and so is optimistic.
        """
        _check_gpu_count(m)
        rates = dict(self.measured)
        if m in rates:
            return rates[m]
        for base in (2 * self.gpus_per_node, max(rates)):
            if m > base and base - 1 in rates and base in rates:
                return _eq1(base, rates[base], rates[base - 1], m)
        below = max(count for count in rates if count < m)
        if self.scaling is not None:
            return rates[below] * self.scaling(m) / self.scaling(below)
        return rates[below] * m / below


def gpus_to_reach(curve: RateCurve, target: float, limit: int) -> int | None:
    """The fewest GPUs, at most ``limit``, giving a rate of at least ``target``.

    None when even ``limit`` GPUs fall short (or ``limit`` is below 1).

    >>> curve = RateCurve({1: 60.0}, gpus_per_node=4)
    >>> gpus_to_reach(curve, 176.0, 8), gpus_to_reach(curve, 176.0, 2)
    (3, None)
    """
    for m in range(1, limit + 1):
        if curve.rate(m) >= target * (1 - _RATE_TOLERANCE):
            return m
    return None


def _find_next(curves: Mapping[K, RateCurve], waiting: list[K], target: float,
               left: int) -> tuple[K, int] | None:
    """The waiting candidate needing the fewest GPUs to reach ``target`` within ``left``.

    Ties go to the faster candidate on one GPU, then to the earlier one.
    """
    options = []
    for position, name in enumerate(waiting):
        need = gpus_to_reach(curves[name], target, left)
        if need is not None:  # otherwise too slow for the GPUs left: it waits for the next flotilla
            options.append((need, -curves[name].rate(1), position))
    if not options:
        return None
    need, _, position = min(options)
    return waiting[position], need


def flotilla(curves: Mapping[K, RateCurve], gpus: int) -> dict[K, int]:
    """Members of the next flotilla and their GPU counts (FLEET's createFlotilla).

    The fastest candidate on one GPU sets the target rate and gets one GPU.
    Candidates are then added, fewest GPUs needed first, while their count
    fits; leftover GPUs go one at a time to the member slowest on its current
    count (ties: the member added first).

    >>> ideal = {name: RateCurve({1: r}, 4) for name, r in {"a": 176.0, "b": 88.0, "c": 60.0}.items()}
    >>> flotilla(ideal, 6)
    {'a': 1, 'b': 2, 'c': 3}
    """
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}; wait until a GPU is free")
    if not curves:
        return {}
    names = list(curves)
    fastest = max(names, key=lambda name: curves[name].rate(1))  # first of equals wins
    target = curves[fastest].rate(1)
    counts = {fastest: 1}
    waiting = [name for name in names if name != fastest]
    while waiting:
        found = _find_next(curves, waiting, target, gpus - sum(counts.values()))
        if found is None:
            break
        counts[found[0]] = found[1]
        waiting.remove(found[0])
    for _ in range(gpus - sum(counts.values())):
        slowest = min(counts, key=lambda name: curves[name].rate(counts[name]))
        counts[slowest] += 1
    return counts


def _extra_nodes(start: int, count: int, gpus_per_node: int) -> int:
    """Nodes a block of ``count`` GPUs from global index ``start`` spans beyond the minimum.

    >>> _extra_nodes(0, 4, 4), _extra_nodes(3, 2, 4), _extra_nodes(2, 6, 4)
    (0, 1, 0)
    """
    spanned = (start + count - 1) // gpus_per_node - start // gpus_per_node + 1
    return spanned - math.ceil(count / gpus_per_node)


def _order_score(order: Sequence[tuple[K, int]], start: int, gpus_per_node: int) -> int:
    """Extra nodes spanned when ``order`` is laid out back to back from ``start``."""
    score = 0
    for _, count in order:
        score += _extra_nodes(start, count, gpus_per_node)
        start += count
    return score


def placement_order(counts: Mapping[K, int], gpus_per_node: int,
                    max_permutations: int = 1024) -> tuple[list[K], int]:
    """The order in which members take consecutive GPUs, and permutations explored.

    Pass 1 places members filling whole nodes; pass 2 pairs members whose
    remainders fill a node together (the later member first, as the paper
    does); pass 3 tries
    up to ``max_permutations`` orders of the rest and keeps the first with the
    fewest extra nodes spanned. Passes 1 and 2 keep the next index on a node
    boundary, so their members never span more nodes than needed.

    >>> placement_order({"a": 2, "b": 3, "c": 2, "d": 1}, 4)
    (['c', 'a', 'd', 'b'], 0)
    """
    if max_permutations < 1:
        raise ValueError(f"max_permutations must be at least 1, got {max_permutations}")
    whole = [name for name, count in counts.items() if count % gpus_per_node == 0]
    order = list(whole)
    waiting: dict[int, list[K]] = {}  # complement remainder -> members waiting for it
    for name, count in counts.items():
        if name in whole:
            continue
        partners = waiting.get(count % gpus_per_node)
        if partners:
            order += [name, partners.pop(0)]  # the paper's order: current member, then its partner
        else:
            waiting.setdefault(-count % gpus_per_node, []).append(name)
    rest = [(name, counts[name]) for name in counts if name not in order]
    if not rest:
        return order, 0
    start = sum(counts[name] for name in order)
    best, best_score, explored = rest, math.inf, 0
    for candidate in itertools.islice(itertools.permutations(rest), max_permutations):
        explored += 1
        score = _order_score(candidate, start, gpus_per_node)
        if score < best_score:
            best, best_score = list(candidate), score
    return order + [name for name, _ in best], explored


def pack_nodes(counts: Mapping[K, int], gpus_per_node: int, nodes: int, *,
               max_permutations: int = 1024) -> dict[K, list[tuple[int, int]]]:
    """Concrete ``(node, local GPU)`` slots for each member's GPU count.

    Members take consecutive global GPU indices in :func:`placement_order`;
    global index ``j`` is GPU ``j % gpus_per_node`` of node ``j // gpus_per_node``.

    >>> pack_nodes({"a": 4, "b": 3, "c": 1}, gpus_per_node=4, nodes=2)
    {'a': [(0, 0), (0, 1), (0, 2), (0, 3)], 'b': [(1, 1), (1, 2), (1, 3)], 'c': [(1, 0)]}
    """
    _check_gpu_count(gpus_per_node, "gpus_per_node")
    _check_gpu_count(nodes, "nodes")
    for name, count in counts.items():
        _check_gpu_count(count, f"counts[{name!r}]")
    if sum(counts.values()) > nodes * gpus_per_node:
        raise ValueError(f"counts ask for {sum(counts.values())} GPUs but {nodes} nodes of "
                         f"{gpus_per_node} hold {nodes * gpus_per_node}; shrink the flotilla")
    order, _ = placement_order(counts, gpus_per_node, max_permutations)
    slots: dict[K, list[tuple[int, int]]] = {}
    start = 0
    for name in order:
        slots[name] = [divmod(j, gpus_per_node) for j in range(start, start + counts[name])]
        start += counts[name]
    return {name: slots[name] for name in counts}


def grow_saving(remaining_samples: float, rate_now: float, rate_grown: float,
                restart_s: float) -> float:
    """Seconds saved by restarting on more GPUs, net of the restart cost.

    >>> grow_saving(1000.0, 100.0, 200.0, 2.0)
    3.0
    """
    if rate_now <= 0 or rate_grown <= 0:
        raise ValueError("rate_now and rate_grown must be positive samples per second")
    if remaining_samples < 0 or restart_s < 0:
        raise ValueError("remaining_samples and restart_s must not be negative")
    return remaining_samples / rate_now - remaining_samples / rate_grown - restart_s


def should_grow(remaining_samples: float, rate_now: float, rate_grown: float,
                restart_s: float) -> bool:
    """Whether restarting from the checkpoint on more GPUs finishes sooner.

    >>> should_grow(1000.0, 100.0, 200.0, 2.0), should_grow(1000.0, 100.0, 200.0, 5.0)
    (True, False)
    """
    return grow_saving(remaining_samples, rate_now, rate_grown, restart_s) > 0


def grow_choice(running: Mapping[K, tuple[RateCurve, int, float]], free: int,
                restart_s: float) -> tuple[K, int] | None:
    """The running member to grow onto freed GPUs, and its new GPU count.

    ``running`` maps member -> (curve, current GPUs, remaining samples). The
    choice saves the most time net of ``restart_s`` (ties: fewer GPUs, then
    mapping order); None when no growth saves time.

    >>> curve = RateCurve({1: 100.0}, gpus_per_node=4)
    >>> grow_choice({"x": (curve, 1, 1000.0)}, free=1, restart_s=2.0)
    ('x', 2)
    """
    if free < 0:
        raise ValueError(f"free must not be negative, got {free}")
    best: tuple[K, int] | None = None
    best_saving = 0.0
    for name, (curve, current, remaining) in running.items():
        rate_now = curve.rate(current)
        for grown in range(current + 1, current + free + 1):
            saving = grow_saving(remaining, rate_now, curve.rate(grown), restart_s)
            if saving > best_saving:
                best, best_saving = (name, grown), saving
    return best


def finish_spread(curves: Mapping[K, RateCurve], counts: Mapping[K, int],
                  work: Mapping[K, float]) -> float:
    """(latest − earliest predicted finish) / latest finish; 0 means all end together.

    >>> curves = {"a": RateCurve({1: 100.0}, 4), "b": RateCurve({1: 50.0}, 4)}
    >>> finish_spread(curves, {"a": 1, "b": 2}, {"a": 100.0, "b": 100.0})
    0.0
    """
    if not counts:
        raise ValueError("counts is empty; give at least one member")
    missing = [name for name in counts if name not in work or name not in curves]
    if missing:
        raise ValueError(f"curves and work need every member of counts; missing {missing}")
    if any(work[name] <= 0 for name in counts):
        raise ValueError("work must be a positive number of samples for every member")
    times = [work[name] / curves[name].rate(counts[name]) for name in counts]
    return (max(times) - min(times)) / max(times)
