"""Rollouts to target on learning curves (prioreplay.curves): interpolation, censoring, pairing."""

from __future__ import annotations

import math

import pytest

from prioreplay.curves import Curve, accuracy_at, first_crossing, rollouts_to_target_ratio

X = (0.0, 100.0, 200.0, 300.0, 400.0)


def curve(*acc: float) -> Curve:
    return Curve(X, tuple(acc))


def test_first_crossing_interpolates_between_points():
    c = curve(0.1, 0.2, 0.4, 0.5, 0.6)
    assert first_crossing(c, 0.3) == (150.0, True)
    assert first_crossing(c, 0.1) == (0.0, True)
    assert first_crossing(c, 0.6) == (400.0, True)


def test_first_crossing_censored_when_never_reached():
    assert first_crossing(curve(0.1, 0.2, 0.2, 0.2, 0.25), 0.5) == (400.0, False)


def test_first_crossing_takes_the_first_of_several():
    assert first_crossing(curve(0.1, 0.5, 0.2, 0.6, 0.6), 0.5)[0] == 100.0


def test_curve_refuses_too_few_points_and_disorder():
    with pytest.raises(ValueError, match=">= 5"):
        Curve((0.0, 1.0), (0.1, 0.2))
    with pytest.raises(ValueError, match="ascending"):
        Curve((0.0, 2.0, 1.0, 3.0, 4.0), (0.1,) * 5)
    with pytest.raises(ValueError, match="non-finite"):
        Curve(X, (0.1, math.nan, 0.1, 0.1, 0.1))


def test_ratio_above_one_when_the_arm_is_faster():
    base = {s: curve(0.1, 0.2, 0.3, 0.4, 0.5) for s in range(3)}  # reaches 0.5 at 400
    arm = {s: curve(0.1, 0.3, 0.5, 0.5, 0.5) for s in range(3)}  # at 200
    r = rollouts_to_target_ratio(arm, base)
    assert r.ratio == pytest.approx(2.0)
    assert r.per_seed == (2.0, 2.0, 2.0)
    assert r.censored == 0
    assert r.ci_low == pytest.approx(2.0) and r.ci_high == pytest.approx(2.0)


def test_ratio_pairs_seeds_and_bootstraps_an_interval():
    base = {0: curve(0.1, 0.2, 0.3, 0.4, 0.5), 1: curve(0.1, 0.2, 0.3, 0.4, 0.6), 2: curve(0.0, 0.1, 0.2, 0.3, 0.4)}
    arm = {0: curve(0.1, 0.5, 0.5, 0.5, 0.5), 1: curve(0.1, 0.2, 0.3, 0.6, 0.6), 2: curve(0.0, 0.1, 0.4, 0.4, 0.4), 9: base[0]}
    r = rollouts_to_target_ratio(arm, base, resamples=2000)
    assert r.seeds == (0, 1, 2)
    assert r.per_seed == pytest.approx((4.0, 400 / 300, 2.0))
    assert r.ratio == pytest.approx(1200 / 600)
    assert r.ci_low < r.ratio < r.ci_high


def test_censored_arm_gives_an_upper_bound_and_is_counted():
    base = {0: curve(0.1, 0.2, 0.3, 0.4, 0.5)}
    arm = {0: curve(0.1, 0.1, 0.1, 0.1, 0.2)}
    r = rollouts_to_target_ratio(arm, base)
    assert r.censored == 1 and r.ratio == 1.0
    assert math.isnan(r.ci_low)  # one seed: no interval


def test_target_from_another_arm():
    grpo = {0: curve(0.1, 0.2, 0.3, 0.4, 0.4)}
    dapo = {0: curve(0.1, 0.2, 0.4, 0.5, 0.6)}  # reaches grpo's 0.4 at 200
    heap = {0: curve(0.1, 0.4, 0.5, 0.6, 0.6)}  # at 100
    r = rollouts_to_target_ratio(heap, dapo, target_from=grpo)
    assert r.targets == (0.4,) and r.ratio == pytest.approx(2.0)


def test_target_read_at_r_of_a_2r_curve():
    grpo = {0: curve(0.1, 0.2, 0.3, 0.5, 0.7), 1: curve(0.1, 0.2, 0.3, 0.5, 0.7)}
    heap = {0: curve(0.1, 0.4, 0.5, 0.6, 0.6), 1: curve(0.1, 0.4, 0.5, 0.6, 0.6)}
    # seed 0: grpo at 250 (halfway from 0.3 to 0.5) = 0.4; heap reaches 0.4 at 100, grpo at 250
    r = rollouts_to_target_ratio(heap, grpo, target_at={0: 250.0})
    assert r.targets[0] == pytest.approx(0.4) and r.per_seed[0] == pytest.approx(2.5)
    # seed 1 has no R: its target is grpo's last point, which heap never reaches (censored)
    assert r.targets[1] == pytest.approx(0.7) and r.censored == 1


def test_no_common_seed_is_refused():
    with pytest.raises(ValueError, match="no common seed"):
        rollouts_to_target_ratio({0: curve(*(0.1,) * 5)}, {1: curve(*(0.1,) * 5)})


def test_accuracy_at_interpolates():
    assert accuracy_at({0: curve(0.0, 0.2, 0.4, 0.6, 0.8)}, 250.0) == [pytest.approx(0.5)]
    assert accuracy_at({0: curve(0.0, 0.2, 0.4, 0.6, 0.8)}, 900.0) == [0.8]


def test_a_seed_whose_baseline_never_improved_is_left_out():
    flat = {0: curve(0.0, 0.0, 0.0, 0.0, 0.0), 1: curve(0.1, 0.2, 0.3, 0.4, 0.5)}
    arm = {0: curve(0.0, 0.1, 0.1, 0.1, 0.1), 1: curve(0.1, 0.5, 0.5, 0.5, 0.5)}
    r = rollouts_to_target_ratio(arm, flat)
    assert r.no_gain == (0,) and r.seeds == (1,) and r.ratio == pytest.approx(4.0)
    none = rollouts_to_target_ratio({0: arm[0]}, {0: flat[0]})
    assert none.no_gain == (0,) and math.isnan(none.ratio)


# -- the honest estimator: a target fixed apart from the arms, t-intervals on log ratios ----------


def test_ratio_to_target_is_the_geometric_mean_of_per_seed_ratios_with_a_log_t_interval():
    from prioreplay.curves import fixed_targets, ratio_to_target

    base = {s: curve(0.1, 0.2, 0.3, 0.4, 0.5) for s in (0, 1, 2)}  # 0.4 at 300
    arm = {0: curve(0.1, 0.4, 0.4, 0.4, 0.5), 1: curve(0.1, 0.2, 0.4, 0.5, 0.5), 2: curve(0.1, 0.2, 0.3, 0.4, 0.5)}
    r = ratio_to_target(arm, base, fixed_targets(0.4, [0, 1, 2]))
    assert r.per_seed == pytest.approx((3.0, 1.5, 1.0)) and r.ratio == pytest.approx(4.5 ** (1 / 3))
    assert r.ci_low < r.ratio < r.ci_high and r.ci_low * r.ci_high == pytest.approx(r.ratio**2)  # symmetric in log
    assert r.bound == "exact" and r.censored == 0 and r.left_out == ()
    swapped = ratio_to_target(base, arm, fixed_targets(0.4, [0, 1, 2]))
    assert swapped.ratio == pytest.approx(1 / r.ratio) and swapped.ci_high == pytest.approx(1 / r.ci_low)


def test_censored_crossings_are_kept_as_bounds_and_named_and_seeds_without_a_ratio_are_left_out():
    from prioreplay.curves import fixed_targets, ratio_to_target

    base = {0: curve(0.1, 0.2, 0.3, 0.4, 0.5), 1: curve(0.1, 0.2, 0.3, 0.3, 0.3), 2: curve(0.1, 0.1, 0.1, 0.1, 0.1)}
    arm = {0: curve(0.1, 0.2, 0.2, 0.2, 0.2), 1: curve(0.1, 0.5, 0.5, 0.5, 0.5), 2: curve(0.1, 0.1, 0.1, 0.1, 0.1)}
    r = ratio_to_target(arm, base, fixed_targets(0.4, [0, 1, 2]))
    assert r.seeds == (0, 1) and r.left_out == (2,)  # seed 2: neither reaches 0.4
    assert r.censored_arm == (0,) and r.censored_base == (1,) and r.bound == "mixed"
    assert r.per_seed == pytest.approx((300 / 400, 400 / 75))  # each censored curve at its last evaluation
    at_start = ratio_to_target({0: curve(0.5, 0.5, 0.5, 0.5, 0.5)}, {0: curve(0.5, 0.6, 0.6, 0.6, 0.6)}, {0: 0.4})
    assert at_start.left_out == (0,) and math.isnan(at_start.ratio)  # reached before training: nothing to compare


def test_a_leave_one_out_target_never_reads_the_seeds_own_curve():
    from prioreplay.curves import leave_one_out_targets

    grpo = {0: curve(0.1, 0.2, 0.3, 0.4, 0.5), 1: curve(0.1, 0.3, 0.4, 0.5, 0.6), 2: curve(0.1, 0.1, 0.2, 0.2, 0.3)}
    t = leave_one_out_targets(grpo, {s: 200.0 for s in grpo})
    assert t == pytest.approx({0: (0.4 + 0.2) / 2, 1: (0.3 + 0.2) / 2, 2: (0.3 + 0.4) / 2})
    moved = leave_one_out_targets({**grpo, 0: curve(0.1, 0.9, 0.9, 0.9, 0.9)}, {s: 200.0 for s in grpo})
    assert moved[0] == t[0] and moved[1] != t[1]
    assert leave_one_out_targets(grpo)[2] == pytest.approx(0.55)  # without `at`: the last points
    with pytest.raises(ValueError, match=">= 2 seeds"):
        leave_one_out_targets({0: grpo[0]})


def test_a_fixed_target_must_be_an_accuracy_and_ratio_to_target_needs_a_common_seed():
    from prioreplay.curves import fixed_targets, ratio_to_target

    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        fixed_targets(1.5, [0])
    with pytest.raises(ValueError, match="no common seed"):
        ratio_to_target({0: curve(*(0.1,) * 5)}, {1: curve(*(0.1,) * 5)}, {0: 0.2, 1: 0.2})
    one = ratio_to_target({0: curve(0.1, 0.2, 0.3, 0.4, 0.5)}, {0: curve(0.1, 0.2, 0.3, 0.4, 0.5)}, {0: 0.3})
    assert one.ratio == 1.0 and math.isnan(one.ci_low)  # one seed: no interval
