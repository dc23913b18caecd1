"""FLEET's greedy flotilla: profiling, rate prediction, member choice, node packing, growth.

Expected numbers are worked out by hand from fixed profiles.
"""

from __future__ import annotations

import pytest

from hpo.allocation._fleet import (RateCurve, finish_spread, flotilla, gpus_to_reach, grow_choice,
                                   pack_nodes, placement_order, profile_rate, should_grow)


def ideal(rates: dict[str, float], gpus_per_node: int = 4) -> dict[str, RateCurve]:
    """Curves measured on one GPU only: they scale linearly."""
    return {name: RateCurve({1: rate}, gpus_per_node) for name, rate in rates.items()}


def nodes_of(slots: list[tuple[int, int]]) -> set[int]:
    return {node for node, _ in slots}


# profile_rate

def test_profile_rate_averages_the_last_20_of_48_batches():
    # 28 warm-up/slow batches, then 20 at 0.1 s with 32 samples: 32 / 0.1 = 320/s.
    assert profile_rate([1.5] * 28 + [0.1] * 20, batch_size=32) == pytest.approx(320.0)


def test_profile_rate_ignores_batches_past_the_48th():
    assert profile_rate([1.5] * 28 + [0.1] * 20 + [9.0] * 10, batch_size=32) == pytest.approx(320.0)


def test_profile_rate_needs_a_batch_before_the_averaged_ones():
    assert profile_rate([0.1] * 20, batch_size=32) is None
    # 21 batches: the first is warm-up, the last 20 average to 0.2 s -> 160/s.
    assert profile_rate([5.0] + [0.2] * 20, batch_size=32) == pytest.approx(160.0)


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"batch_size": 32, "averaged": 0},
                                    {"batch_size": 32, "max_batches": 20}])
def test_profile_rate_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        profile_rate([0.1] * 48, **kwargs)


# RateCurve

def test_eq1_extrapolates_from_2_nodes_worth_of_gpus():
    # M_b = 8; efficiency = 600/560 * 7/8 = 0.9375; r(10) = 10 * 600/8 * 0.9375**2.
    curve = RateCurve({1: 100.0, 7: 560.0, 8: 600.0}, gpus_per_node=4)
    assert curve.rate(10) == pytest.approx(10 * 75.0 * 0.87890625)  # 659.1796875
    assert curve.rate(9) == pytest.approx(9 * 75.0 * 0.9375)
    assert curve.rate(7) == 560.0


def test_eq1_generalises_to_the_largest_measured_pair():
    # M_b = 8 unmeasured; a = 3: efficiency = 270/190 * 2/3 = 18/19; r(5) = 5 * 90 * (18/19)**2.
    curve = RateCurve({1: 100.0, 2: 190.0, 3: 270.0}, gpus_per_node=4)
    assert curve.rate(5) == pytest.approx(450.0 * 324 / 361)


def test_linear_fallback_scales_the_nearest_measured_count():
    assert RateCurve({1: 40.0}, gpus_per_node=4).rate(3) == pytest.approx(120.0)
    # 3 lies between measured counts (3 unmeasured, so no Eq. 1 pair): 40 * 3/1, optimistic.
    assert RateCurve({1: 40.0, 4: 140.0}, gpus_per_node=4).rate(3) == pytest.approx(120.0)


def test_cost_model_scaling_fallback():
    def scaling(m: int) -> float:
        return 1 + 0.8 * (m - 1)

    # Nearest measured count below 4 is 2: r(4) = 90 * s(4)/s(2) = 90 * 3.4/1.8 = 170.
    curve = RateCurve({1: 50.0, 3: 120.0}, gpus_per_node=4, scaling=scaling)
    assert curve.rate(2) == pytest.approx(50.0 * 1.8)
    curve = RateCurve({1: 50.0, 2: 90.0, 6: 300.0}, gpus_per_node=4, scaling=scaling)
    assert curve.rate(4) == pytest.approx(170.0)


def test_eq1_takes_precedence_over_the_cost_model():
    curve = RateCurve({1: 100.0, 7: 560.0, 8: 600.0}, gpus_per_node=4, scaling=lambda m: m)
    assert curve.rate(10) == pytest.approx(659.1796875)


def test_rate_curve_is_hashable_and_normalised():
    as_dict = RateCurve({2: 190.0, 1: 100.0}, gpus_per_node=4)
    as_pairs = RateCurve(((1, 100.0), (2, 190.0)), gpus_per_node=4)
    assert as_dict == as_pairs and hash(as_dict) == hash(as_pairs)
    assert as_dict.measured == ((1, 100.0), (2, 190.0))


@pytest.mark.parametrize("measured", [{2: 100.0}, {1: 0.0}, ((1, 1.0), (1, 2.0)), {1: 1.0, 2.5: 2.0}])
def test_rate_curve_rejects_bad_profiles(measured):
    with pytest.raises(ValueError):
        RateCurve(measured, gpus_per_node=4)


@pytest.mark.parametrize("m", [0, 1.5, True])
def test_rate_rejects_non_gpu_counts(m):
    with pytest.raises(ValueError):
        RateCurve({1: 10.0}, gpus_per_node=4).rate(m)


def test_gpus_to_reach():
    curve = RateCurve({1: 88.0}, gpus_per_node=4)
    assert gpus_to_reach(curve, 176.0, 8) == 2  # exactly on target counts
    assert gpus_to_reach(curve, 177.0, 2) is None
    assert gpus_to_reach(curve, 1.0, 0) is None


# flotilla

def test_flotilla_matches_the_hand_worked_allocation():
    curves = ideal({"a": 176.0, "b": 88.0, "c": 60.0, "d": 21.0})
    # Target 176: a gets 1, b needs 2, c needs 3 (180); d needs 9 of the 2 left: waits.
    # Leftover 2 GPUs: a (176) and b (176) tie as slowest, a was added first -> a=2 (352);
    # then b (176) is slowest -> b=3.
    assert flotilla(curves, 8) == {"a": 2, "b": 3, "c": 3}


def test_flotilla_members_finish_closer_together_than_an_even_split():
    curves = ideal({"a": 176.0, "b": 88.0, "c": 60.0, "d": 21.0})
    work = {"a": 1000.0, "b": 1000.0, "c": 1000.0}
    counts = flotilla(curves, 8)
    # Rates 352, 264, 180: spread = 1 - 180/352. Two each: 352, 176, 120: 1 - 120/352.
    assert finish_spread(curves, counts, work) == pytest.approx(1 - 180 / 352)
    even = finish_spread(curves, {"a": 2, "b": 2, "c": 2}, work)
    assert even == pytest.approx(1 - 120 / 352)
    assert finish_spread(curves, counts, work) < even
    # Before the leftovers: rates 176, 176, 180 -> spread 1 - 176/180.
    assert finish_spread(curves, {"a": 1, "b": 2, "c": 3}, work) == pytest.approx(1 - 176 / 180)


def test_flotilla_skips_a_candidate_too_slow_for_the_gpus_left():
    # slow needs 10 GPUs; b needs 2 and is added; the last GPU goes to a (tie with b, added first).
    curves = ideal({"a": 100.0, "slow": 10.0, "b": 50.0})
    assert flotilla(curves, 4) == {"a": 2, "b": 2}


def test_flotilla_tie_on_gpus_needed_goes_to_the_faster():
    # b (50) and c (55) both need 2 GPUs to reach 100; c is faster and takes the 2 left.
    assert flotilla(ideal({"a": 100.0, "b": 50.0, "c": 55.0}), 3) == {"a": 1, "c": 2}


def test_flotilla_fastest_tie_goes_to_the_first():
    assert flotilla(ideal({"x": 80.0, "y": 80.0}), 1) == {"x": 1}


def test_flotilla_edges():
    assert flotilla({}, 4) == {}
    with pytest.raises(ValueError, match="gpus"):
        flotilla(ideal({"a": 1.0}), 0)


# pack_nodes

def test_pack_whole_node_member_alone_and_pair_sharing():
    slots = pack_nodes({"a": 4, "b": 3, "c": 1}, gpus_per_node=4, nodes=2)
    assert slots == {"a": [(0, 0), (0, 1), (0, 2), (0, 3)],
                     "b": [(1, 1), (1, 2), (1, 3)], "c": [(1, 0)]}


def test_pack_pairs_complementary_remainders():
    # Remainders 2+2 (a, c) and 3+1 (b, d) each fill one node; the later member goes first.
    slots = pack_nodes({"a": 2, "b": 3, "c": 2, "d": 1}, gpus_per_node=4, nodes=2)
    assert slots == {"c": [(0, 0), (0, 1)], "a": [(0, 2), (0, 3)],
                     "d": [(1, 0)], "b": [(1, 1), (1, 2), (1, 3)]}
    assert all(len(nodes_of(s)) == 1 for s in slots.values())


# No two of these remainders fill a node of 8, so all go to the permutation search;
# in the given order f would straddle nodes 0 and 1 (GPUs 5-8).
UNPAIRED = {"d": 3, "a": 2, "f": 4, "b": 1, "c": 2, "e": 2, "g": 2}


def test_pack_permutation_search_keeps_every_member_on_one_node():
    slots = pack_nodes(UNPAIRED, gpus_per_node=8, nodes=2)
    assert all(len(nodes_of(s)) == 1 for s in slots.values())
    assert sorted(g for s in slots.values() for g in s) == [(n, i) for n in range(2) for i in range(8)]


def test_pack_permutation_bound_of_one_takes_the_given_order():
    slots = pack_nodes(UNPAIRED, gpus_per_node=8, nodes=2, max_permutations=1)
    assert slots["f"] == [(0, 5), (0, 6), (0, 7), (1, 0)]


def test_pack_explores_at_most_max_permutations():
    awkward = {f"m{i}": 3 for i in range(8)}  # 3 + 3 never fills a node of 4: 8! orders
    assert placement_order(awkward, 4, max_permutations=5)[1] == 5
    assert placement_order(awkward, 4)[1] == 1024
    slots = pack_nodes(awkward, gpus_per_node=4, nodes=6, max_permutations=5)
    assert sorted(g for s in slots.values() for g in s) == [(n, i) for n in range(6) for i in range(4)]


def test_pack_without_leftovers_explores_nothing():
    assert placement_order({"a": 4, "b": 3, "c": 1}, 4) == (["a", "c", "b"], 0)


@pytest.mark.parametrize("counts, kwargs", [({"a": 5, "b": 4}, {}), ({"a": 0}, {}),
                                            ({"a": 1}, {"max_permutations": 0})])
def test_pack_rejects_bad_input(counts, kwargs):
    with pytest.raises(ValueError):
        pack_nodes(counts, gpus_per_node=4, nodes=2, **kwargs)


# growing running trials

def test_should_grow_compares_time_saved_with_restart_cost():
    # 1000 samples at 100/s = 10 s; at 200/s = 5 s: saves 5 s.
    assert should_grow(1000.0, 100.0, 200.0, restart_s=4.0)
    assert not should_grow(1000.0, 100.0, 200.0, restart_s=6.0)


def test_grow_choice_grows_the_member_with_much_work_left():
    curve = RateCurve({1: 100.0}, gpus_per_node=4)
    running = {"small": (curve, 1, 100.0), "big": (curve, 1, 1e6)}
    # big: 1e6/100 - 1e6/200 - 10 = 4990 s; small: 1 - 0.5 - 10 < 0.
    assert grow_choice(running, free=1, restart_s=10.0) == ("big", 2)
    # Onto 3 GPUs: 1e4 - 3333.3 - 10 = 6656.7 s beats 4990 s.
    assert grow_choice(running, free=2, restart_s=10.0) == ("big", 3)


def test_grow_choice_none_when_restart_costs_more():
    curve = RateCurve({1: 100.0}, gpus_per_node=4)
    running = {"small": (curve, 1, 100.0), "big": (curve, 1, 1e6)}
    assert grow_choice(running, free=2, restart_s=1e5) is None
    assert grow_choice(running, free=0, restart_s=0.0) is None


def test_finish_spread_rejects_missing_work():
    with pytest.raises(ValueError, match="missing"):
        finish_spread(ideal({"a": 1.0}), {"a": 1}, {})
