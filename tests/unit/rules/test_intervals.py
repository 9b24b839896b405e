"""Intervals of the run report and the comparison: Wilson, Newcombe's paired difference, bootstrap ratio."""

from __future__ import annotations

import pytest

from prioreplay.intervals import bootstrap_ratio, mean_interval, paired_difference, wilson


def test_wilson_matches_published_values():
    # Newcombe (1998, Stat Med 17:857) table I: 81/263 -> 0.2553, 0.3662; 15/148 -> 0.0624, 0.1605
    lo, hi = wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    lo, hi = wilson(15, 148)
    assert (round(lo, 4), round(hi, 4)) == (0.0624, 0.1605)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_paired_difference_is_the_change_and_its_interval_narrows_with_positive_correlation():
    # 28 problems: 12 right both times, 5 right only after, 9 right only before, 2 never
    after = [1] * 12 + [1] * 5 + [0] * 9 + [0] * 2
    before = [1] * 12 + [0] * 5 + [1] * 9 + [0] * 2
    d, lo, hi = paired_difference(before, after)
    assert d == pytest.approx((5 - 9) / 28) and lo < d < hi
    # the same marginals with the discordant pairs made concordant: a narrower interval
    d2, lo2, hi2 = paired_difference([1] * 21 + [0] * 7, [1] * 17 + [0] * 11)
    assert d2 == pytest.approx(d) and hi2 - lo2 < hi - lo
    # swapping before and after mirrors the interval
    d3, lo3, hi3 = paired_difference(after, before)
    assert (d3, lo3, hi3) == pytest.approx((-d, -hi, -lo))


def test_paired_difference_excludes_zero_only_with_evidence():
    same = [True] * 10 + [False] * 90
    d, lo, hi = paired_difference(same, same)
    assert d == 0 and lo < 0 < hi
    d, lo, hi = paired_difference([False] * 100, [True] * 40 + [False] * 60)
    assert d == pytest.approx(0.4) and lo > 0
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])


def test_bootstrap_ratio_and_mean_interval():
    r, lo, hi = bootstrap_ratio([0.5, 0.6, 0.55], [0.3, 0.32, 0.28], paired=True)
    assert r == pytest.approx(0.55 / 0.3) and 1 < lo <= r <= hi
    assert bootstrap_ratio([0.5], [0.25]) == (2.0, 2.0, 2.0)
    m, lo, hi = mean_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and (round(lo, 3), round(hi, 3)) == (round(2 - 4.303 / 3**0.5, 3), round(2 + 4.303 / 3**0.5, 3))


def test_ratio_interval_is_symmetric_on_the_log_scale():
    from prioreplay.intervals import ratio_interval

    r, lo, hi = ratio_interval([2.0, 0.5, 1.0])
    assert r == pytest.approx(1.0) and lo == pytest.approx(1 / hi) and lo < 1 < hi
    assert ratio_interval([1.5]) == (1.5, 1.5, 1.5)
    with pytest.raises(ValueError, match="finite ratios > 0"):
        ratio_interval([1.0, 0.0])
