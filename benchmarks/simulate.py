"""Part 2: learning efficiency of the samplers in a simulated GRPO learner.

The simulator replaces the language model by a population of problems with latent success
logits, and drives the REAL store (``MemoryStore`` with its ``heap`` / ``weighted`` / ``uniform``
samplers, retest pools and statistics) through ``store.sample`` / ``store.report`` with simulated
binary rewards. What is measured is therefore our sampler code, not a re-implementation of it.

Model (the assumptions are in docs/METHOD.md, "How the figures are measured"):

* Problem j belongs to one of K skills c(j) (equal-sized groups, assigned at random). Its logit
  is ℓ_j = b_j + z_c(j): a problem-specific part b_j ~ N(μ, σ_b²) and a shared skill part
  z_c ~ N(0, σ_z²). Its success probability (pass@1) is p_j = σ(ℓ_j).
* A group of G completions has rewards r_i ~ Bernoulli(p_j), independent.
* Training on a group (one GRPO update) changes the logits by the exact policy gradient of a
  Bernoulli-logit policy with the group-mean baseline (Dr. GRPO advantages A_i = r_i − p̂, no
  std normalisation): Σ_i A_i · ∂log π(r_i)/∂ℓ / G = Σ_i (r_i − p̂)(r_i − p_j) / G = p̂(1 − p̂) = ω̂,
  the group's empirical priority (Fatemi, arXiv 2601.02648, eq. for ω). So b_j += η_b·ω̂ and
  z_c(j) += η_z·ω̂ (the shared skill moves every problem of the skill). All-correct and
  all-wrong groups have ω̂ = 0 and change nothing.
* Forgetting: after every optimizer step, each problem not trained in that step has
  b_j −= δ (interference from updates on other problems).
* Per-group updates do not depend on the batch's composition (no dilution of the gradient by
  zero-variance groups; this favours the uniform baseline).
* Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476): generation batches of B problems
  are drawn until B mixed groups have accumulated; the optimizer step uses the first B; the
  rest (and every zero-variance group) are discarded. Discarded rollouts count in the budget.

All methods see the same populations (the population depends only on the seed: paired design)
and the same rollout budget (completions generated).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks.sim_stats import pool_misfiled_share, summarize
from prioreplay.priority_server.store import Store, StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool, PriorityParams

#: The clock the simulated store reads starts here (unix seconds) and moves 1 s per batch.
SIM_EPOCH_S = 1_700_000_000.0


@dataclass(frozen=True)
class SimParams:
    """Parameters of the simulated population, learner and budget.

    Attributes:
        n_problems: N, problems in the dataset.
        n_skills: K, shared skills (N/K problems each).
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

    def __post_init__(self) -> None:
        if self.n_heldout < 0:
            raise ValueError(f"n_heldout ({self.n_heldout}) must be >= 0")
        if self.n_problems < self.batch_size:
            raise ValueError(f"n_problems ({self.n_problems}) must be >= batch_size ({self.batch_size})")
        if self.n_skills < 1 or self.n_problems % self.n_skills:
            raise ValueError(f"n_problems ({self.n_problems}) must be a multiple of n_skills ({self.n_skills}) >= 1")
        if self.budget_rollouts < self.batch_size * self.group_size:
            raise ValueError("budget_rollouts must cover at least one batch (batch_size * group_size)")


#: Tiny parameters for ``--quick`` and the test suite (seconds in total).
QUICK = SimParams(n_problems=200, n_skills=10, batch_size=16, budget_rollouts=16 * 8 * 60, target_success=0.55)


@dataclass(frozen=True)
class Method:
    """A sampling method: the store's sampler and retest share, plus the learner-side filter."""

    name: str
    label: str
    sampler: str
    retest_fraction: float
    dynamic_sampling: bool = False
    alpha: float = 1.0
    train_probes: bool = False  # mixed probe groups (fewer than G completions) go to the learner
    #: zero-variance groups stay in the step's batch and dilute it (plain GRPO as TRL runs it: the
    #: token-mean loss counts their tokens, which carry zero advantage); SimParams.dilute for all
    dilute: bool = False
    store: tuple[tuple[str, Any], ...] = ()  # further StoreConfig fields (temperature, posterior_decay...)


METHODS: tuple[Method, ...] = (
    Method("uniform", "uniform", "uniform", 0.0),
    Method("uniform_dapo", "uniform + dynamic sampling (DAPO)", "uniform", 0.0, dynamic_sampling=True),
    Method("heap_no_retest", "heap, no retest (retest_fraction=0)", "heap", 0.0),
    Method("heap", "heap + retest (the paper, retest_fraction=0.1)", "heap", 0.1),
    Method("weighted", "weighted (alpha=1) + retest 0.1", "weighted", 0.1),
)

#: The samplers beyond the paper (docs/METHOD.md, "How a default is chosen"; figures ``samplers.*``),
#: each against ``heap`` and ``uniform``.
CANDIDATES: tuple[Method, ...] = (
    Method("gumbel_t1", "Gumbel-top-k T=1 + retest 0.1", "gumbel", 0.1, store=(("gumbel_temperature", 1.0),)),
    Method("gumbel_t03", "Gumbel-top-k T=0.3 + retest 0.1", "gumbel", 0.1, store=(("gumbel_temperature", 0.3),)),
    Method("posterior_l1", "posterior retests, decay 1 (no step decay)", "posterior", 0.1, store=(("posterior_decay", 1.0),)),
    Method("posterior_l095", "posterior retests, decay 0.95/step", "posterior", 0.1, store=(("posterior_decay", 0.95),)),
    Method("posterior_l08", "posterior retests, decay 0.8/step", "posterior", 0.1, store=(("posterior_decay", 0.8),)),
    Method("thompson_l095", "Thompson retests, decay 0.95/step", "thompson", 0.1, store=(("posterior_decay", 0.95),)),
    Method("screened", "screened: probes of 2 for unseen, probes not trained", "screened", 0.1),
    Method("screened_train", "screened, mixed probes trained", "screened", 0.1, train_probes=True),
    Method("screened_pools", "screened-pools: unseen and retests probed", "screened-pools", 0.1),
    Method(
        "screened_posterior",
        "screened probes + posterior retests (0.95)",
        "screened-posterior",
        0.1,
        store=(("posterior_decay", 0.95),),
    ),
    Method(
        "knapsack",
        "knapsack: group size per problem in a budget of G per problem (≤ 4G), all groups trained",
        "knapsack",
        0.1,
        train_probes=True,
        store=(("mean_group_size", 8), ("max_group_size", 32)),
    ),
    Method("predicted", "predicted: unseen problems ranked by kNN-predicted priority (DOTS)", "predicted", 0.1),
    Method(
        "heap_versions_k1",
        "heap + retest 0.1, due 1 policy version after the last test (--retest-versions 1)",
        "heap",
        0.1,
        store=(("retest_versions", 1),),
    ),
    Method(
        "heap_versions_k4",
        "heap + retest 0.1, due 4 policy versions after the last test (--retest-versions 4)",
        "heap",
        0.1,
        store=(("retest_versions", 4),),
    ),
    Method(
        "heap_decay08",
        "heap + retest, statistics decay λ=0.8 per report",
        "heap",
        0.1,
        store=(("params", PriorityParams(decay=0.8)),),
    ),
    Method(
        "heap_decay05",
        "heap + retest, statistics decay λ=0.5 per report",
        "heap",
        0.1,
        store=(("params", PriorityParams(decay=0.5)),),
    ),
)

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


class _Clock:
    """A deterministic clock for the store (unix seconds)."""

    def __init__(self) -> None:
        self.t = SIM_EPOCH_S

    def __call__(self) -> float:
        return self.t


def memory_store_factory(config: StoreConfig, clock: Callable[[], float]) -> Store:
    """The in-process store, no snapshot file."""
    from prioreplay.priority_server.store.memory_store import MemoryStore

    return MemoryStore(config, snapshot_path=None, clock=clock)


@dataclass
class RunResult:
    """One (method, seed) run. Curves are sampled after every generation batch."""

    method: str
    seed: int
    rollouts_to_target: float  # NaN when the target was not reached within the budget
    final_success: float
    effective_group_fraction: float  # store's mixed groups / all groups generated
    forgetting_events: int  # store: solved problems that failed a retest
    breakthroughs: int  # store: unsolved problems that passed a retest
    forgotten_at_end: int  # ground truth: final pass@1 at least 0.1 below the problem's peak
    optimizer_steps: int
    useful_rollout_fraction: float = 0.0  # completions in groups the learner trained on / generated
    probes: int = 0  # probe groups generated (fewer than G completions)
    pool_misfiled_share: float = math.nan  # audit at the end (pool_misfiled_share); NaN: empty pools
    pooled_at_end: int = 0  # problems in the solved or unsolved pool at the end
    curve_rollouts: list[int] = field(default_factory=list)
    curve_success: list[float] = field(default_factory=list)
    curve_heldout: list[float] = field(default_factory=list)  # held-out mean pass@1 (SimParams.n_heldout)


async def _generate_batch(
    store: Store, pop: Population, rng: np.random.Generator, B: int, G: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, ...]]]:
    """Lease ``B`` problems, draw g_j Bernoulli rewards each and report them: (idx (b,), g_j (b,), groups)."""
    lease = await store.sample(B)
    idx = np.fromiter((int(sp.problem.id[1:]) for sp in lease.problems), dtype=np.int64)  # (b,)
    sizes = np.fromiter((sp.group_size or G for sp in lease.problems), dtype=np.int64)  # (b,) g_j
    # (b, max(G, g_j)): the same draws whatever g_j <= G, columns >= g_j unused
    u = rng.random((idx.size, max(G, int(sizes.max(initial=0)))))
    hits = u < pop.success(idx)[:, None]
    groups = [tuple(map(float, hits[j, : sizes[j]])) for j in range(idx.size)]
    await store.report(lease.lease_id, [GroupOutcome(sp.problem.id, g) for sp, g in zip(lease.problems, groups, strict=True)])
    return idx, sizes, groups


def _group_updates(
    groups: list[tuple[float, ...]], sizes: np.ndarray, G: int, train_probes: bool, dilute: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Which groups train (mixed, (b,) bool) and each group's update size ((b,), ω̂ · g_j / G)."""
    phat = np.array([sum(g) / len(g) for g in groups])  # (b,)
    omega = phat * (1.0 - phat)  # (b,) empirical priority ω̂
    mixed = omega > 0
    if not train_probes:
        mixed &= sizes == G
    # a group's update scales with its completions (token-mean loss): ω̂ · g_j / G
    update = omega * sizes / G
    if dilute:  # zero-variance groups dilute the step (token mean over the whole batch)
        update = update * (sizes[mixed].sum() / sizes.sum())
    return mixed, update


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


@dataclass
class _Learner:
    """The learn side of one simulated run: one optimizer step per batch with a mixed group, or
    (dynamic sampling) per ``batch_size`` mixed groups gathered over batches."""

    pop: Population
    batch_size: int
    dynamic_sampling: bool
    steps: int = 0
    trained_rollouts: int = 0
    buf_idx: list[np.ndarray] = field(default_factory=list)  # dynamic sampling: mixed groups waiting
    buf_omega: list[np.ndarray] = field(default_factory=list)

    def learn(self, idx: np.ndarray, sizes: np.ndarray, mixed: np.ndarray, update: np.ndarray) -> None:
        """Train on a batch's mixed groups: problem ids ``idx``, group sizes, mask and updates, each (B,)."""
        if self.dynamic_sampling:
            self.buf_idx.append(idx[mixed])
            self.buf_omega.append(update[mixed])
            self.trained_rollouts += int(sizes[mixed].sum())
            if sum(a.size for a in self.buf_idx) >= self.batch_size:
                B = self.batch_size
                self.pop.train(np.concatenate(self.buf_idx)[:B], np.concatenate(self.buf_omega)[:B])
                self.steps += 1
                self.buf_idx, self.buf_omega = [], []
        elif mixed.any():
            self.pop.train(idx[mixed], update[mixed])
            self.trained_rollouts += int(sizes[mixed].sum())
            self.steps += 1


async def _open_store(
    pop: Population, method: Method, seed: int, store_factory: Callable[[StoreConfig, Callable[[], float]], Store], clock
) -> Store:
    """A store with ``method``'s sampler settings and the population's problems registered."""
    params = pop.params
    config = StoreConfig(
        sampler=method.sampler,
        alpha=method.alpha,
        retest_fraction=method.retest_fraction,
        retest_interval=params.retest_interval,
        seed=seed,
        **dict(method.store),
    )
    store = store_factory(config, clock)
    await store.register(problem_records(pop))
    return store


async def run_one(
    params: SimParams,
    method: Method,
    seed: int,
    store_factory: Callable[[StoreConfig, Callable[[], float]], Store] = memory_store_factory,
    history: list[dict[str, Any]] | None = None,
    pop_seed: int | None = None,
    final_dump: dict[str, Any] | None = None,
) -> RunResult:
    """Train one simulated population with one method until the rollout budget is spent.

    Args:
        history: when given, receives one row per generated group in the format of a demo run's
            ``outcomes.jsonl`` (``problem_id``, ``policy_version`` = optimizer steps before the
            group's batch, ``rewards``, ``sampler``, ``seed``): what ``benchmarks/calibrate.py`` fits.
        pop_seed: the population's seed when it differs from ``seed`` (a second run on the same
            problems and starting model, with its own draws).
        final_dump: when given, receives the store's ``dump()`` at the end (its statistics).
    """
    pop = Population(params, seed if pop_seed is None else pop_seed)  # pop_seed: the same "base model", another run
    rng = np.random.default_rng([seed, 1])
    clock = _Clock()
    store = await _open_store(pop, method, seed, store_factory, clock)
    B, G = params.batch_size, params.group_size
    learner = _Learner(pop, B, method.dynamic_sampling)
    rollouts, reached, probes, version = 0, math.nan, 0, 0
    peak = pop.success()
    curve_r, curve_s, curve_h = [0], [float(peak.mean())], [pop.heldout_success()]
    while rollouts + B * G <= params.budget_rollouts:
        # -- generate: lease a batch, draw g_j rewards per problem, report them ---------------
        idx, sizes, groups = await _generate_batch(store, pop, rng, B, G)
        if history is not None:
            history.extend(
                {
                    "problem_id": f"p{j:07d}",
                    "policy_version": learner.steps,
                    "rewards": list(g),
                    "sampler": method.name,
                    "seed": seed,
                }
                for j, g in zip(idx.tolist(), groups, strict=True)
            )
        rollouts += int(sizes.sum())
        probes += int(np.sum(sizes < G))
        clock.t += 1.0
        mixed, update = _group_updates(groups, sizes, G, method.train_probes, params.dilute or method.dilute)
        # -- learn: one optimizer step per batch (dynamic sampling: per B mixed groups) -------
        learner.learn(idx, sizes, mixed, update)
        if learner.steps > version:  # each optimizer step publishes a policy version (a sync learner)
            version = learner.steps
            await store.publish(version, f"sim/v{version}")
        success = pop.success()
        np.maximum(peak, success, out=peak)
        mean = float(success.mean())
        curve_r.append(rollouts)
        curve_s.append(mean)
        curve_h.append(pop.heldout_success())
        if math.isnan(reached) and mean >= params.target_success:
            reached = float(rollouts)

    st = await store.stats()
    final = pop.success()
    dump = await store.dump()
    if final_dump is not None:
        final_dump.update(dump)
    misfiled = pool_misfiled_share(dump, final, G, np.random.default_rng([seed, 2]))
    pooled = sum(1 for pool, *_ in dump["problems"].values() if pool in (Pool.SOLVED, Pool.UNSOLVED))
    await store.close()
    return RunResult(
        method=method.name,
        seed=seed,
        rollouts_to_target=reached,
        final_success=float(final.mean()),
        effective_group_fraction=st.effective_group_fraction,
        forgetting_events=st.forgetting_events,
        breakthroughs=st.breakthroughs,
        forgotten_at_end=int(np.sum(final < peak - 0.1)),
        optimizer_steps=learner.steps,
        useful_rollout_fraction=learner.trained_rollouts / max(rollouts, 1),
        probes=probes,
        pool_misfiled_share=misfiled,
        pooled_at_end=pooled,
        curve_rollouts=curve_r,
        curve_success=curve_s,
        curve_heldout=curve_h,
    )


def run_simulation(
    params: SimParams = SimParams(),
    seeds: Sequence[int] = range(10),
    methods: Sequence[Method] = METHODS,
    plot_path: str | None = None,
    store_factory: Callable[[StoreConfig, Callable[[], float]], Store] = memory_store_factory,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every method on every seed; summarize with means and 95% bootstrap intervals.

    Ratios against ``uniform`` are paired per seed (same population), then summarized.
    A run that never reaches the target counts as NaN in ``rollouts_to_target`` (``reached``
    says how many seeds did); a ratio is only formed where both runs reached it.

    Returns:
        {"params", "seeds", "methods": {name: {...summaries..., "runs": [...]}}, "wall_s"}, and
        ``"plot_error"`` (``"PATH: error"``) when ``plot_path`` was given and the plot failed.
    """
    t0 = time.perf_counter()
    runs: dict[str, list[RunResult]] = {m.name: [] for m in methods}
    for m in methods:
        for s in seeds:
            runs[m.name].append(asyncio.run(run_one(params, m, s, store_factory)))
        if progress:
            progress(f"simulate: {m.name} done ({time.perf_counter() - t0:.1f}s)")
    out: dict[str, Any] = {"params": asdict(params), "seeds": list(seeds), "methods": {}}
    for m in methods:
        out["methods"][m.name] = _method_summary(m, runs)
    out["wall_s"] = time.perf_counter() - t0
    if plot_path:
        try:
            plot_curves(runs, methods, params, plot_path)
        except Exception as e:  # noqa: BLE001 - minutes of measurement outweigh the picture
            out["plot_error"] = f"{plot_path}: {type(e).__name__}: {e}"
            if progress:
                progress(f"simulate: plot {plot_path} failed ({type(e).__name__}: {e}); the figures are kept")
    return out


#: The RunResult fields summarized per method (mean and 95% bootstrap interval over seeds).
SUMMARIZED = (
    "rollouts_to_target",
    "final_success",
    "effective_group_fraction",
    "forgetting_events",
    "breakthroughs",
    "forgotten_at_end",
    "optimizer_steps",
    "useful_rollout_fraction",
    "probes",
    "pool_misfiled_share",
)


def _paired_ratios(rs: Sequence[RunResult], ref: Sequence[RunResult], name: str) -> dict[str, float]:
    """The summarized per-seed ratio ``r.name / ref.name`` over the seeds both have (a reference
    of 0 is left out)."""
    by_seed = {r.seed: r for r in ref}
    return summarize(
        [
            getattr(r, name) / getattr(by_seed[r.seed], name)
            for r in rs
            if r.seed in by_seed and getattr(by_seed[r.seed], name) > 0
        ]
    )


def _paired_differences(rs: Sequence[RunResult], ref: Sequence[RunResult], name: str) -> dict[str, float]:
    """The summarized per-seed difference ``r.name − ref.name`` over the seeds both have (NaNs left out)."""
    by_seed = {r.seed: r for r in ref}
    return summarize([getattr(r, name) - getattr(by_seed[r.seed], name) for r in rs if r.seed in by_seed])


def _method_summary(m: Method, runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """One method's entry of :func:`run_simulation`: summaries, ratios paired per seed against
    ``heap`` and ``uniform`` (where those ran), and its runs without their curves."""
    rs = runs[m.name]
    entry: dict[str, Any] = {"label": m.label, "reached": int(sum(np.isfinite(r.rollouts_to_target) for r in rs))}
    entry |= {name: summarize([getattr(r, name) for r in rs]) for name in SUMMARIZED}
    if "heap" in runs and m.name != "heap":
        entry["rollouts_ratio_vs_heap"] = _paired_ratios(rs, runs["heap"], "rollouts_to_target")
        entry["misfiled_change_vs_heap"] = _paired_differences(rs, runs["heap"], "pool_misfiled_share")
    if runs.get("uniform"):
        entry["rollouts_ratio_vs_uniform"] = _paired_ratios(rs, runs["uniform"], "rollouts_to_target")
        entry["efg_ratio_vs_uniform"] = _paired_ratios(rs, runs["uniform"], "effective_group_fraction")
    entry["runs"] = [{k: v for k, v in asdict(r).items() if not k.startswith("curve")} for r in rs]
    return entry


def plot_curves(runs: dict[str, list[RunResult]], methods: Sequence[Method], params: SimParams, path: str) -> None:
    """Mean pass@1 vs rollouts (mean over seeds, band = 2.5–97.5 percentile of seeds) and the
    effective-group fraction per method (mean, 95% bootstrap interval), as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for m in methods:
        rs = runs[m.name]
        n = min(len(r.curve_success) for r in rs)
        x = np.asarray(rs[0].curve_rollouts[:n])
        y = np.array([r.curve_success[:n] for r in rs])  # (seeds, points)
        (line,) = ax.plot(x, y.mean(axis=0), label=m.label)
        lo, hi = np.percentile(y, [2.5, 97.5], axis=0)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(params.target_success, color="k", ls=":", lw=1, label=f"target {params.target_success:.2f}")
    ax.set_xlabel("rollouts (completions generated)")
    ax.set_ylabel("mean pass@1 over the population")
    ax.set_title(f"Simulated GRPO: N={params.n_problems}, B={params.batch_size}, G={params.group_size}, {len(rs)} seeds")
    ax.legend(fontsize=8)
    names = [m.name for m in methods]
    stats = [summarize([r.effective_group_fraction for r in runs[n]]) for n in names]
    means = np.array([s["mean"] for s in stats])
    err = np.array([[s["mean"] - s["lo"] for s in stats], [s["hi"] - s["mean"] for s in stats]])
    bx.bar(range(len(names)), means, yerr=err, capsize=4, color="#2a7ab9")
    bx.set_xticks(range(len(names)))
    bx.set_xticklabels(names, rotation=20, fontsize=8)
    bx.set_ylabel("effective-group fraction (mixed groups / groups generated)")
    bx.set_ylim(0, 1)
    bx.set_title("Share of generated groups that carry a GRPO gradient")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def quick_params() -> SimParams:
    """The tiny configuration of ``--quick`` and the tests."""
    return replace(QUICK)
