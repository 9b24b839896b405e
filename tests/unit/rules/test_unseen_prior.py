"""The prior for unseen problems as a pure rule (prioreplay/unseen_prior.py): the setting, the fit's
sums, ω_unseen by hand, and the identity its docstring claims: the mean first-visit priority is the
Beta fitted by moments' E[p(1 − p)] on the heap's (plug-in) scale."""

from __future__ import annotations

import pytest

from prioreplay import rules
from prioreplay.unseen_prior import FIT, OFF, PSEUDO_VISITS, UnseenFit, observe, parse_setting, unseen_priority


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("off", "off"), (" FIT ", "fit"), ("0.1", "0.1"), (0.1, "0.1"), ("0", "0.0"), (0, "0.0"), ("0.25", "0.25")],
)
def test_the_setting_is_off_fit_or_a_priority_in_its_canonical_form(given, canonical):
    assert parse_setting(given) == canonical


@pytest.mark.parametrize("bad", ["on", "", "0.3", "-0.01", "nan", "inf", True, None])
def test_any_other_setting_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match=r"'off'.*'fit'.*\[0, 0\.25\]"):
        parse_setting(bad)


def test_off_is_the_priority_of_no_observations_and_a_number_is_itself():
    fit = UnseenFit(3, 0.5)
    assert unseen_priority(OFF, fit, 0.25) == 0.25
    assert unseen_priority(OFF, fit, 0.1875) == 0.1875  # a per-problem Beta prior lowers ω₀
    assert unseen_priority("0.1", fit, 0.25) == 0.1


def test_the_fit_starts_at_the_prior_priority_and_moves_to_the_mean_first_visit_priority():
    assert PSEUDO_VISITS == 4.0
    assert unseen_priority(FIT, UnseenFit(), 0.25) == 0.25  # before any first visit: the first batch explores
    # first visits of G = 4 that scored 2/4, 1/4, 0/4 and 4/4: priorities 0.25, 0.1875, 0, 0
    fit, params = UnseenFit(), rules.PriorityParams()
    for x in (2, 1, 0, 4):
        stats = rules.update_stats(rules.Stats(), [1.0] * x + [0.0] * (4 - x), params)
        fit = observe(fit, 4, rules.priority(stats, params))
    assert fit == UnseenFit(4, 0.4375)
    assert unseen_priority(FIT, fit, 0.25) == (4 * 0.25 + 0.4375) / 8 == 0.1796875
    many = UnseenFit(10_000, 10_000 * 0.1)
    assert unseen_priority(FIT, many, 0.25) == pytest.approx(0.1, abs=1e-4)  # the pseudo visits fade


def test_a_group_of_one_completion_is_not_a_first_visit_the_fit_counts():
    assert observe(UnseenFit(2, 0.3), 1, 0.0) == UnseenFit(2, 0.3)
    assert observe(UnseenFit(2, 0.3), 2, 0.25) == UnseenFit(3, 0.55)


def test_the_mean_first_visit_priority_is_the_moment_fitted_beta_on_the_plug_in_scale():
    """G = 4, first visits X = 2, 1, 0, 4, 3 successes (by hand): mean p̂ = 1/2, mean X(X − 1)/(G(G − 1)) =
    (2 + 0 + 0 + 12 + 6)/12/5 = 1/3, so Var(p) = 1/3 − 1/4 = 1/12 and E[p(1 − p)] = 1/2 − 1/3 = 1/6: the
    moments fit Beta(1, 1) (a + b = E[p(1 − p)]/Var(p) = 2), whose ab/((a + b)(a + b + 1)) is 1/6 too. On
    the heap's scale that is 3/4 · 1/6 = 1/8, the mean of the plug-in priorities p̂(1 − p̂)."""
    G, xs = 4, (2, 1, 0, 4, 3)
    m1 = sum(x / G for x in xs) / len(xs)
    m2 = sum(x * (x - 1) / (G * (G - 1)) for x in xs) / len(xs)
    pq, var = m1 - m2, m2 - m1 * m1
    assert (m1, m2, pq, var) == pytest.approx((0.5, 1 / 3, 1 / 6, 1 / 12))
    ab = pq / var
    a, b = m1 * ab, (1 - m1) * ab
    assert (a, b) == pytest.approx((1.0, 1.0))
    assert a * b / ((a + b) * (a + b + 1)) == pytest.approx(1 / 6)
    fit = UnseenFit()
    params = rules.PriorityParams()
    for x in xs:
        stats = rules.update_stats(rules.Stats(), [1.0] * x + [0.0] * (G - x), params)
        fit = observe(fit, G, rules.priority(stats, params))
    assert fit.priority_sum / fit.visits == pytest.approx((G - 1) / G * pq) == pytest.approx(0.125)
    assert unseen_priority(FIT, fit, 0.25) == pytest.approx((1.0 + 0.625) / 9)
