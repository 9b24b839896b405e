"""The simulator's population: N problems with latent success logits in K skills, trained by
logit updates (no language model). The model's assumptions are in docs/METHOD.md, "How the
figures are measured".

* Problem j belongs to one of K skills c(j) (equal-sized groups, assigned at random). Its logit
  is ℓ_j = b_j + z_c(j): a problem-specific part b_j ~ N(μ, σ_b²) (or, with ``tiers``, from the
  tier it is drawn into) and a shared skill part z_c ~ N(0, σ_z²). Its success probability
  (pass@1) is p_j = σ(ℓ_j).
* A group of G completions has rewards r_i ~ Bernoulli(p_j), independent.
* Training on a group (one GRPO update) changes the logits by the exact policy gradient of a
  Bernoulli-logit policy with the group-mean baseline (Dr. GRPO advantages A_i = r_i − p̂, no
  std normalisation): Σ_i A_i · ∂log π(r_i)/∂ℓ / G = Σ_i (r_i − p̂)(r_i − p_j) / G = p̂(1 − p̂) = ω̂,
  the group's empirical priority (Fatemi, arXiv 2601.02648, eq. for ω). So b_j += η_b·ω̂ and
  z_c(j) += η_z·ω̂ (the shared skill moves every problem of the skill), each times the step's
  scale when the learner normalises its steps (``benchmarks/sim_learner.py``). All-correct and
  all-wrong groups have ω̂ = 0 and change nothing.
* Forgetting: after every optimizer step, each problem not trained in that step has
  b_j −= δ (interference from updates on other problems).
* Held-out problems (``n_heldout``) share the skills and are never trained: they move only
  through z, and their mean pass@1 is the held-out accuracy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from prioreplay.problems import ProblemRecord


@dataclass(frozen=True)
class SimParams:
    """Parameters of the simulated population, learner and budget.

    Attributes:
        n_problems: N, problems in the dataset.
        n_skills: K, shared skills (N/K problems each; with ``tiers``, one per tier, as drawn).
        logit_mean: μ, mean of the problem-specific logit b_j (logits, nats).
        problem_sd: σ_b, spread of b_j (logits).
        skill_sd: σ_z, spread of the skill logits z_c (logits).
        group_size: G, completions per problem.
        batch_size: B, problems per optimizer step (and per generation batch).
        budget_rollouts: completions each method may generate.
        lr_problem: η_b, logit change of a problem per unit of its group's ω̂ (logits).
        lr_skill: η_z, logit change of the problem's skill per unit of ω̂ (logits).
        forget_drift: δ, logit decrease of every untrained problem per optimizer step (logits).
        target_success: mean pass@1 over the population that counts as "reached".
        retest_interval: StoreConfig.retest_interval of the methods with retests (batches).
        dilute: zero-variance groups dilute the step: every update of a step is scaled by
            (completions in its mixed groups) / (completions in the step), as a token-mean loss
            over the whole batch does.
        n_heldout: problems never trained on, spread over the K skills like the training set:
            their logit is b'_j + z_c(j), so they move only by skill transfer. Their mean pass@1
            is the held-out accuracy (``RunResult.curve_heldout``); 0: none.
        tiers: ((μ, σ), ...): the problem part b_j of each problem (held-out ones too) is drawn
            from one of these normal laws (logits), the tier chosen with equal chance, as
            arithmetic's ``tiers`` set draws trivial, easy and hard problems, and the tier is the
            problem's skill (``n_skills`` must equal the number of tiers: learning a trivial sum
            does not teach a 3-digit product); empty: one law, N(logit_mean, problem_sd²), and
            skills assigned at random.
    """

    n_problems: int = 2000
    n_skills: int = 40
    logit_mean: float = -0.5
    problem_sd: float = 2.0
    skill_sd: float = 1.0
    group_size: int = 8
    batch_size: int = 64
    budget_rollouts: int = 64 * 8 * 500
    lr_problem: float = 1.0
    lr_skill: float = 0.02
    forget_drift: float = 0.002
    target_success: float = 0.65
    retest_interval: int = 4
    dilute: bool = False
    n_heldout: int = 0
    tiers: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.n_heldout < 0:
            raise ValueError(f"n_heldout ({self.n_heldout}) must be >= 0")
        if self.n_problems < self.batch_size:
            raise ValueError(f"n_problems ({self.n_problems}) must be >= batch_size ({self.batch_size})")
        if self.n_skills < 1 or (self.n_problems % self.n_skills and not self.tiers):
            raise ValueError(f"n_problems ({self.n_problems}) must be a multiple of n_skills ({self.n_skills}) >= 1")
        if any(sd < 0 for _, sd in self.tiers):
            raise ValueError(f"tiers ({self.tiers}) must give a spread >= 0 for each tier")
        if self.tiers and self.n_skills != len(self.tiers):
            raise ValueError(f"n_skills ({self.n_skills}) must equal the number of tiers ({len(self.tiers)}): a tier is a skill")
        if self.budget_rollouts < self.batch_size * self.group_size:
            raise ValueError("budget_rollouts must cover at least one batch (batch_size * group_size)")


#: Tiny parameters for ``--quick`` and the test suite (seconds in total).
QUICK = SimParams(n_problems=200, n_skills=10, batch_size=16, budget_rollouts=16 * 8 * 60, target_success=0.55)

#: The populations of part 2b (docs/METHOD.md, "How the figures are measured"; stated before the runs).
POPULATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "hard": {"logit_mean": -2.0, "target_success": 0.45},
    "forgetting": {"forget_drift": 0.006, "target_success": 0.55},
    "dilute": {"dilute": True, "target_success": 0.60},
}


class Population:
    """Latent logits of N problems (see the module docstring for the model)."""

    def __init__(self, params: SimParams, seed: int):
        rng = np.random.default_rng([seed, 0])
        self.params = params
        per = params.n_problems // params.n_skills
        self.skill_of = rng.permutation(np.repeat(np.arange(params.n_skills), per))  # (N,)
        self.base = rng.normal(params.logit_mean, params.problem_sd, params.n_problems)  # (N,)
        self.skill = rng.normal(0.0, params.skill_sd, params.n_skills)  # (K,)
        held = np.random.default_rng([seed, 3])  # its own stream: the training population is unchanged
        self.heldout_skill = held.integers(0, params.n_skills, params.n_heldout)  # (M,)
        self.heldout_base = held.normal(params.logit_mean, params.problem_sd, params.n_heldout)  # (M,)
        if params.tiers:  # streams of their own: populations without tiers draw as before
            self.skill_of, self.base = _tiered(params.tiers, params.n_problems, np.random.default_rng([seed, 5]))
            self.heldout_skill, self.heldout_base = _tiered(params.tiers, params.n_heldout, np.random.default_rng([seed, 6]))

    def heldout_success(self) -> float:
        """Mean pass@1 of the held-out problems (NaN when there are none)."""
        if not self.heldout_base.size:
            return math.nan
        logit = self.heldout_base + self.skill[self.heldout_skill]
        return float(np.mean(1.0 / (1.0 + np.exp(-logit))))

    def success(self, idx: np.ndarray | None = None) -> np.ndarray:
        """pass@1 σ(b_j + z_c(j)) of the problems ``idx`` (all when None)."""
        logit = self.base + self.skill[self.skill_of]
        if idx is not None:
            logit = logit[idx]
        return 1.0 / (1.0 + np.exp(-logit))

    def train(self, idx: np.ndarray, omega: np.ndarray) -> None:
        """One optimizer step on the groups of problems ``idx`` with (scaled) updates ``omega``."""
        p = self.params
        np.add.at(self.base, idx, p.lr_problem * omega)
        np.add.at(self.skill, self.skill_of[idx], p.lr_skill * omega)
        untrained = np.ones(p.n_problems, dtype=bool)
        untrained[idx] = False
        self.base[untrained] -= p.forget_drift


def _tiered(tiers: tuple[tuple[float, float], ...], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` problems' tiers, chosen with equal chance ((n,) int), and logits, each from its tier's law ((n,))."""
    tier = rng.integers(0, len(tiers), n)  # (n,)
    law = np.asarray(tiers, dtype=float)[tier]  # (n, 2)
    return tier, rng.normal(law[:, 0], law[:, 1])


_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "bo", "di", "fa", "gu", "he", "jo")


def topic_prompt(j: int, skill: int) -> str:
    """Problem j's prompt: its index and three made-up words naming its skill, so problems of a
    skill share text (what the ``predicted`` sampler's prompt embedding can find; every other
    sampler ignores prompts)."""
    digests = (hashlib.blake2b(f"{skill}:{w}".encode(), digest_size=3).digest() for w in range(3))
    words = ["".join(_SYLLABLES[b % len(_SYLLABLES)] for b in d) for d in digests]
    return f"problem {j} about {' '.join(words)}"


def problem_records(pop: Population) -> list[ProblemRecord]:
    """The population's N problems as registered: ids ``p0000000``.., prompts by :func:`topic_prompt`."""
    return [
        ProblemRecord(id=f"p{j:07d}", prompt=topic_prompt(j, int(pop.skill_of[j])), answer="0")
        for j in range(pop.params.n_problems)
    ]
