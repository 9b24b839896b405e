"""A prior for unseen problems: the one priority every problem never tested holds in the heap.

Without it (``--unseen-prior off``, the paper's rule) a problem never tested has the maximum
priority ``rules.priority(Stats())`` = 0.25, so ``heap`` serves every unseen problem before it
revisits one that scored 1/4 or 3/4: the first epoch is uniform sampling without replacement. None
of the methods it is compared with does that: MoPPS (Qu et al., arXiv 2507.04632) starts every
prompt from a Beta prior, Prompt Replay (Baroian and Berger, arXiv 2603.21177) mixes replayed and
fresh prompts from the first step, DOTS (arXiv 2506.05316) predicts an unseen prompt's difficulty,
GRESO (arXiv 2506.02177) skips only prompts seen to be zero-variance. With a prior an unseen
problem ranks at ω_unseen, the priority the population leads one to expect, so a known mixed
problem above it is revisited from the second batch and unseen problems are explored beside it.

``--unseen-prior`` (:func:`parse_setting`):

* ``off``: ω_unseen = ω₀ = ``rules.priority(Stats(), params)`` (0.25 without a per-problem Beta prior);
* a number in [0, 0.25]: ω_unseen is that number (a prior fixed by the user);
* ``fit``: ω_unseen is fitted online to the first visits (:func:`unseen_priority`).

**The fit.** A *first visit* is a report of a problem whose statistics have n = 0 (never reported,
not warm-started). The heap serves unseen problems in the seeded tie-break order, so first visits
are a random sample of the population (later visits are not: they favour mixed problems). For
each first-visit group of G >= 2 completions the store adds the priority that group gave its
problem, ω̂₁ = ``rules.priority`` of its statistics after the report (:func:`observe`); then

    ω_unseen = (K₀ · ω₀ + Σ ω̂₁) / (K₀ + K),   K first visits, K₀ = :data:`PSEUDO_VISITS` = 4,

the mean first-visit priority, started from K₀ pseudo first visits at ω₀: before any first visit
ω_unseen = ω₀, so the first batch explores as without the prior, and one early group cannot swing
it (no threshold, so no jump when a minimum count is reached). A group of one completion has no
variance to measure and is not counted.

**It is the Beta fit by moments, on the heap's scale.** For binary rewards, a population of success
rates p ~ Beta(a, b) and groups of G, the first-visit pass rates p̂ = X/G give unbiased moments
E[p] = mean p̂ and E[p²] = mean X(X − 1)/(G(G − 1)); the Beta fitted by them has
E[p(1 − p)] = ab/((a + b)(a + b + 1)) = E[p] − E[p²] = mean p̂(1 − p̂)·G/(G − 1). A problem's
priority is the plug-in m2 − m1² = p̂(1 − p̂), which after one group is p(1 − p) biased low by
(G − 1)/G in expectation. ω_unseen compares like with like: it is on the plug-in scale, the fitted
E[p(1 − p)] times (G − 1)/G = mean p̂(1 − p̂) = mean ω̂₁, i.e. the priority an unseen problem is
expected to have after its first visit. So a first visit leaves a problem's expected key where it
was: the heap neither promotes unseen problems over seen ones of the same variance (as comparing
the unbiased E[p(1 − p)] with plug-in keys would) nor demotes them. (``tests/unit/rules/
test_unseen_prior.py`` checks the identity.) The mean of ω̂₁ needs no Beta family and holds as it
is for non-binary rewards (the mean of the plug-in variances) and with a per-problem prior α₀, β₀
(ω̂₁ includes it, as the problem's key will).

Both stores keep the fit's two sums in the namespace (:class:`UnseenFit`; Redis: the ``counters``
fields ``first_visits`` and ``first_visit_priority_sum``; memory: the snapshot) and add to them in
report order with the same double operations, so ω_unseen agrees bit for bit. Only ``heap`` reads
it (the store's docstring, "A prior for unseen problems", has the exact rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: ``--unseen-prior`` values that are not a number.
OFF, FIT = "off", "fit"
#: Pseudo first visits at ω₀ the fit starts from (K₀).
PSEUDO_VISITS = 4.0
#: The largest priority a fixed prior may take (rules.MAX_PRIORITY).
_MAX = 0.25


def parse_setting(value: object) -> str:
    """The canonical ``--unseen-prior`` value: ``"off"``, ``"fit"`` or ``repr(float)`` of a
    number in [0, 0.25] (``"0.1"``; a float or int is accepted too).

    Raises:
        ValueError: anything else (the message names the value and the choices).
    """
    if isinstance(value, str) and value.strip().lower() in (OFF, FIT):
        return value.strip().lower()
    try:
        x = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
    except ValueError:
        x = math.nan
    if not (0.0 <= x <= _MAX):
        raise ValueError(
            f"unseen_prior ({value!r}) must be 'off' (unseen problems at the top, the paper), 'fit' (the mean "
            "priority of first visits) or a priority in [0, 0.25] that unseen problems hold"
        )
    return repr(x)


@dataclass(frozen=True)
class UnseenFit:
    """The sums the fit keeps: first visits counted and the sum of the priorities they gave.

    Attributes:
        visits: K, first-visit groups of G >= 2 completions.
        priority_sum: Σ ω̂₁, added in report order (doubles, left to right from 0.0).
    """

    visits: int = 0
    priority_sum: float = 0.0


def observe(fit: UnseenFit, group_size: int, priority: float) -> UnseenFit:
    """``fit`` with one more first visit: a group of ``group_size`` completions that gave its
    problem ``priority`` (``rules.priority`` of its statistics after the report). A group of one
    completion changes nothing. Lua twin: ``report.lua``'s ``first_visits`` lines."""
    if group_size < 2:
        return fit
    return UnseenFit(fit.visits + 1, fit.priority_sum + priority)


def unseen_priority(setting: str, fit: UnseenFit, base: float) -> float:
    """ω_unseen: the priority every unseen heap problem holds now.

    Args:
        setting: :func:`parse_setting`'s value.
        fit: the first visits so far.
        base: ω₀ = ``rules.priority(Stats(), params)``, the priority of no observations.

    Returns:
        ``base`` for ``off``; the number for a fixed prior; for ``fit``,
        (K₀·ω₀ + Σ ω̂₁) / (K₀ + K) (one IEEE expression, the Lua twin's ``unseen_priority`` in
        ``sample.lua`` computes it with the same operations).
    """
    if setting == OFF:
        return base
    if setting == FIT:
        return (PSEUDO_VISITS * base + fit.priority_sum) / (PSEUDO_VISITS + fit.visits)
    return float(setting)
