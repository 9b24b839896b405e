"""How the heap scores a priority, and reads a score back (the heap's keys), for both stores.

A heap member's score is its priority (store/base.py, "Keys and ordering"), except where a setting
keys the heap otherwise, so that nothing is rescored when time passes or the population is learned:

* ``--heap-age-decay`` γ_h < 1 (FreshPER, docs/METHOD.md): the time-invariant key
  :func:`prioreplay.rules.fresh_key`, read back at the current policy version;
* ``--unseen-prior`` on (:mod:`prioreplay.unseen_prior`): an unseen problem's score is
  :data:`.contract.UNSEEN_SCORE`, the unseen band, read as ω_unseen (store/base.py, "A prior for
  unseen problems").

:class:`HeapKeys` is a base of :class:`.base.Store`: its methods are the store's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prioreplay import rules, unseen_prior
from prioreplay.rules import Pool

from .contract import UNSEEN_SCORE

if TYPE_CHECKING:  # pragma: no cover
    from ..config import StoreConfig


class HeapKeys:
    """The heap's scores of a store with ``config`` (see the module docstring)."""

    def __init__(self, config: StoreConfig):
        self.config = config
        #: The heap's ageing between reports (``--heap-age-decay``): the prior's priority ω₀ and γ_h.
        self._fresh = (rules.priority(rules.Stats(), config.params), config.heap_age_decay)
        #: True while unseen problems live in the unseen band (``--unseen-prior`` fit or a number).
        self.unseen_band = config.unseen_prior != unseen_prior.OFF

    def unseen_priority(self, fit: unseen_prior.UnseenFit) -> float:
        """ω_unseen given the first visits ``fit`` (see "A prior for unseen problems")."""
        return unseen_prior.unseen_priority(self.config.unseen_prior, fit, self._fresh[0])

    def registered_score(self, stats: rules.Stats) -> float:
        """The heap score of a new problem registered with ``stats`` (a warm start's, else empty): the
        unseen band's :data:`UNSEEN_SCORE` when it is unseen and the prior is on, else its priority
        keyed as of version 0 (:meth:`heap_score`)."""
        if stats.n == 0.0 and self.unseen_band:
            return UNSEEN_SCORE
        return self.heap_score(rules.priority(stats, self.config.params), 0)

    def heap_score(self, priority: float, version: int) -> float:
        """The heap score of a problem placed with ``priority`` at policy ``version``: the priority
        itself, or with ``heap_age_decay`` γ_h < 1 its time-invariant key (:func:`rules.fresh_key`:
        the heap's order is the aged priorities' order at every later version, nothing rescored)."""
        prior, gamma = self._fresh
        return priority if gamma == 1.0 else rules.fresh_key(priority, prior, version, gamma)

    def heap_priority(self, score: float, version: int) -> float:
        """The priority a heap member with ``score`` has at policy ``version`` (the inverse of
        :meth:`heap_score`: :func:`rules.fresh_key_priority`, aged toward the prior's)."""
        prior, gamma = self._fresh
        return score if gamma == 1.0 else rules.fresh_key_priority(score, prior, version, gamma)

    def leased_priority(self, source: Pool, score: float, stats: rules.Stats, version: int, unseen: float) -> float:
        """A leased problem's priority as SampleProblems reports it: from the heap's unseen band,
        ``unseen`` (ω_unseen now); from the heap, its score's (:meth:`heap_priority` at policy
        ``version``); from a pool, ``rules.priority`` of ``stats``."""
        if source is not Pool.HEAP:
            return rules.priority(stats, self.config.params)
        return unseen if self.unseen_band and score == UNSEEN_SCORE else self.heap_priority(score, version)
