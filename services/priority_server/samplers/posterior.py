"""``posterior``: the heap's top, retests chosen by a step-decayed Beta posterior (MoPPS).

Lua branch ``posterior`` (``posterior_variance`` there evaluates in the same operation order).
The retest rule (:func:`posterior_retests`) is shared with ``thompson`` and ``screened-posterior``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from prioreplay.rules import Pool, Stats

from .base import (
    Pick,
    RetestThenHeap,
    SampleRequest,
    SamplerView,
    due_window,
)
from .params import PosteriorRetestParams

#: A window entry: (last tested step or policy version, pool, index in its pool, member).
WindowEntry = tuple[float, Pool, int, str]


def posterior_variance(stats: Stats, age: float, decay: float, prior: float) -> float:
    """Expected reward variance of a problem under its step-decayed Beta posterior.

    The evidence decays with the global steps since the problem was last tested (MoPPS: Qu et
    al. 2025, "Can Prompt Difficulty be Online Predicted for Accelerating RL Finetuning of
    Reasoning Models?", arXiv 2507.04632, a discounted Beta posterior per prompt):
    w = decay^age, a = prior + w·s1, b = prior + w·(n − s1), and for p ~ Beta(a, b)
    E[p(1 − p)] = a·b / ((a + b)·(a + b + 1)).

    Evaluated in exactly this operation order by ``lua/sample.lua`` (``posterior_variance``).

    Args:
        stats: the problem's (report-decayed) sums; s1 counts successes for binary rewards.
        age: steps since it was last tested (>= 0); policy versions with ``--retest-versions``.
        decay: per-step evidence decay in (0, 1] (1: no decay between tests).
        prior: α₀ = β₀ > 0, the symmetric Beta prior.

    Returns:
        A float in (0, 0.25).
    """
    w = decay**age
    a = prior + w * stats.s1
    b = prior + w * (stats.n - stats.s1)
    t = a + b
    return a * b / (t * (t + 1.0))


def take_chosen(view: SamplerView, chosen: list[WindowEntry]) -> list[Pick]:
    """Lease the window entries ``chosen`` (in that batch order): popped from the highest pool
    index down, so the indices of the others stay valid."""
    picks: dict[str, Pick] = {}
    for _, pool, index, member in sorted(chosen, key=lambda c: c[2], reverse=True):
        picks[member] = view.take_pool(pool, index)
    return [picks[c[3]] for c in chosen]


def posterior_retests(view: SamplerView, request: SampleRequest, score: Callable[[WindowEntry], float]) -> list[Pick]:
    """R by a posterior score: the window is the ``4·quota`` least recently tested due pooled
    problems; its first (the oldest) is always retested, which bounds starvation (a due problem at
    position i of the merged pool order is retested within i + 1 batches); the other quota − 1
    slots go to the window's highest ``score`` (ties: pool order). Batch order: the oldest, then
    by score descending."""
    if request.quota <= 0:
        return []
    window = due_window(view, request, 4 * request.quota)
    if not window:
        return []
    scored = [(score(e), i) for i, e in enumerate(window[1:], start=1)]
    scored.sort(key=lambda t: (-t[0], t[1]))
    chosen = [window[0]] + [window[i] for _, i in scored[: request.quota - 1]]
    return take_chosen(view, chosen)


class PosteriorSampler(RetestThenHeap):
    """``posterior``: the heap's top; R by :func:`posterior_retests` scored with
    :func:`posterior_variance` (``self.params.posterior_decay``, ``self.params.posterior_prior``)."""

    params: PosteriorRetestParams

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        c = self.params

        def score(entry: WindowEntry) -> float:
            age = request.pool_now - entry[0]  # steps, or versions with --retest-versions
            return posterior_variance(view.problem_stats(entry[3]), age, c.posterior_decay, c.posterior_prior)

        return posterior_retests(view, request, score)


class PosteriorParams(PosteriorRetestParams):
    """Parameters of ``posterior``: ``posterior_decay``, ``posterior_prior``."""

    name: Literal["posterior"] = "posterior"
