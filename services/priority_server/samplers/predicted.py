"""``predicted``: problems never tested get a priority predicted from their tested neighbours (DOTS).

Memory store only (no Lua branch: the similarity search is numpy's, over prompt embeddings the
Redis scripts cannot compute); the Redis store refuses it at construction. numpy is imported on
the first sample, so configurations stay light.

The embedding is a deterministic text embedding computed offline from the prompt alone: hashed
character 3-grams (the hashing trick), not the worker's prefill hidden states. Hidden states
would be cheaper and closer to what the policy sees, but they would need a new report field and
every generation backend to expose them (vLLM does not by default); the n-gram embedding needs
nothing from the worker and is the same on every machine.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Literal

from prioreplay.rules import Pool

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .knapsack import pass_rate_estimate
from .params import SamplerParams

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..config import StoreConfig

#: Dimensions of the hashed n-gram embedding (float32: 1 KiB per problem in the cache).
EMBED_DIM = 256
#: Neighbours of the kNN prediction, and the softmax temperature over their cosine similarities.
NEIGHBOURS = 16
TEMPERATURE = 0.1
#: Caps per sample: unseen candidates per slot, tested reference problems from the heap and from
#: the end of each pool (the most recently tested).
CANDIDATES_PER_SLOT = 2
REFERENCE_HEAP = 512
REFERENCE_POOL = 256


def embed_prompt(text: str, dim: int = EMBED_DIM) -> np.ndarray:
    """The prompt's embedding, shape (dim,), float32, unit L2 norm (all zero for an empty text).

    Counts of the lowercased text's character 3-grams (padded with a space each side), each
    hashed into one of ``dim`` buckets by CRC-32 (the hashing trick: Weinberger et al. 2009,
    "Feature Hashing for Large Scale Multitask Learning", arXiv 0902.2206). Deterministic: no
    process salt, no model.
    """
    import numpy as np

    s = f" {text.lower()} "
    idx = np.fromiter((zlib.crc32(s[i : i + 3].encode("utf-8")) % dim for i in range(len(s) - 2)), dtype=np.int64)
    v = np.bincount(idx, minlength=dim).astype(np.float32)  # (dim,)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def predict_pass_rates(
    query: np.ndarray, reference: np.ndarray, rates: np.ndarray, k: int = NEIGHBOURS, tau: float = TEMPERATURE
) -> np.ndarray:
    """kNN-weighted pass rates of unseen problems from tested ones (DOTS: Sun et al. 2025,
    "Improving Data Efficiency for LLM Reinforcement Fine-tuning Through Difficulty-targeted Online
    Data Selection and Rollout Replay", arXiv 2506.05316, attention-based adaptive difficulty
    prediction): p̂_u = Σ_j w_uj p̂_j over the k most similar reference problems j, with
    w_u = softmax(cos(e_u, e_j) / τ).

    Args:
        query: (U, D) unit embeddings of the unseen problems.
        reference: (R, D) unit embeddings of tested problems, R >= 1.
        rates: (R,) their estimated pass rates p̂_j in [0, 1].
        k: neighbours (capped at R); tau: softmax temperature (> 0).

    Returns:
        (U,) predicted pass rates in [0, 1].
    """
    import numpy as np

    sims = query @ reference.T  # (U, R) cosine similarities
    k = min(k, reference.shape[0])
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]  # (U, k) the k nearest, any order
    s = np.take_along_axis(sims, top, axis=1) / tau  # (U, k)
    w = np.exp(s - s.max(axis=1, keepdims=True))  # (U, k)
    w /= w.sum(axis=1, keepdims=True)
    return (w * rates[top]).sum(axis=1)  # (U,)


class PredictedPriority(RetestThenHeap):
    """``predicted``: R and F as ``heap``; H ranks the top of the heap with predicted priorities
    for the problems never tested (statistics n == 0).

    The window is the heap from the top down to its ``count``-th tested problem, keeping at most
    ``CANDIDATES_PER_SLOT · count`` unseen ones (tested problems tied at the top priority with the
    unseen ones skipped past the cap are not in it). Each unseen one's key is p̂(1 − p̂) for its
    :func:`predict_pass_rates` p̂ over the reference set (tested heap problems met on the way down,
    up to :data:`REFERENCE_HEAP`, and the :data:`REFERENCE_POOL` most recently tested of each pool,
    with p̂ from :func:`~.knapsack.pass_rate_estimate`); a tested one's key is its priority. H is
    the ``count`` largest keys (ties: rank), in key order. With no tested problem yet it is
    ``heap``. Draws no random numbers; memory store only.
    """

    def __init__(self, config: StoreConfig, params: SamplerParams) -> None:
        super().__init__(config, params)
        self._embeddings: dict[str, tuple[str, np.ndarray]] = {}  # member -> (prompt, (EMBED_DIM,))

    def _embed(self, view: SamplerView, members: list[str]) -> np.ndarray:
        """(len(members), EMBED_DIM) embeddings, computed once per problem and prompt text (a
        problem registered again with another prompt is embedded again)."""
        import numpy as np

        out = []
        for m in members:
            prompt, cached = view.problem_prompt(m), self._embeddings.get(m)
            if cached is None or cached[0] != prompt:
                cached = self._embeddings[m] = (prompt, embed_prompt(prompt))
            out.append(cached[1])
        return np.stack(out) if out else np.zeros((0, EMBED_DIM), np.float32)

    def _window(self, view: SamplerView, count: int) -> tuple[list[tuple[float, int, str]], list[str]]:
        """(window entries (priority, rank, member), an unseen one's rank stored as −rank − 1;
        reference members). Once the unseen candidates are full, the rest of the block at the top
        priority is skipped by bisection (problems never tested all share that priority)."""
        window: list[tuple[float, int, str]] = []
        reference: list[str] = []
        tested = unseen = 0
        size, cap = view.heap_size(), CANDIDATES_PER_SLOT * count
        top, rank = view.heap_entry(0)[0], 0
        while rank < size and tested < max(count, REFERENCE_HEAP):
            prio, member = view.heap_entry(rank)
            if view.problem_stats(member).n > 0.0:
                if tested < count:
                    window.append((prio, rank, member))
                tested += 1
                reference.append(member)
            elif unseen < cap and tested < count:
                window.append((prio, -rank - 1, member))  # to be predicted
                unseen += 1
            elif prio == top:  # jump past the unseen block: the first rank below the top priority
                lo, hi = rank, size
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (mid + 1, hi) if view.heap_entry(mid)[0] == top else (lo, mid)
                rank = lo
                continue
            rank += 1
        for pool in (Pool.SOLVED, Pool.UNSOLVED):
            n = view.pool_size(pool)
            reference += [view.pool_entry(pool, i)[1] for i in range(max(0, n - REFERENCE_POOL), n)]
        return window, reference

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        if count <= 0 or view.heap_size() == 0:
            return []
        import numpy as np

        window, reference = self._window(view, count)
        keys = [prio for prio, _, _ in window]
        todo = [i for i, (_, r, _) in enumerate(window) if r < 0]
        if todo and reference:
            params = self.config.params
            rates = np.array([pass_rate_estimate(view.problem_stats(m), params) for m in reference])
            p = predict_pass_rates(self._embed(view, [window[i][2] for i in todo]), self._embed(view, reference), rates)
            for i, pu in zip(todo, p.tolist(), strict=True):
                keys[i] = pu * (1.0 - pu)
        ranks = [r if r >= 0 else -r - 1 for _, r, _ in window]
        order = sorted(range(len(window)), key=lambda i: (-keys[i], ranks[i]))[:count]
        chosen = [ranks[i] for i in order]
        taken: dict[int, Pick] = {}
        for rank in sorted(chosen, reverse=True):  # highest rank first: the lower ranks stay valid
            taken[rank] = view.take_heap(rank)
        return [taken[rank] for rank in chosen]


class PredictedParams(SamplerParams):
    """Parameters of ``predicted`` (none)."""

    name: Literal["predicted"] = "predicted"
