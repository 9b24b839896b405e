"""One simulated run: a population trained through the REAL store (``MemoryStore`` with its
samplers, retest pools and statistics, driven by ``MemoryStore.sample`` / ``MemoryStore.report`` with
simulated binary rewards), by the synchronous learner or by the real learner's model
(``benchmarks/sim_learner.py``). What is measured is therefore our sampler code, not a
re-implementation of it.

All methods see the same populations (the population depends only on the seed: paired design)
and the same rollout budget (completions generated). Discarded rollouts (zero-variance groups,
stale groups, dynamic sampling's surplus) count in the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.sim_arms import Method
from benchmarks.sim_learner import SyncLearner, SystemLearner, SystemModel, group_updates
from benchmarks.sim_population import Population, SimParams, problem_records
from benchmarks.sim_stats import pool_misfiled_share
from prioreplay.priority_server.store import Store, StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool

#: The clock the simulated store reads starts here (unix seconds) and moves 1 s per batch.
SIM_EPOCH_S = 1_700_000_000.0


class Clock:
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
    #: the real learner's model only: groups generated, trained, dropped as stale, left untrained at the end
    groups: dict[str, int] = field(default_factory=dict)


async def generate_batch(
    store: Store, pop: Population, rng: np.random.Generator, B: int, G: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, ...]]]:
    """Lease ``B`` problems, draw g_j Bernoulli rewards each and report them: (idx (b,), g_j (b,), groups)."""
    lease, idx, sizes, groups = await lease_and_draw(store, pop, rng, B, G)
    await report(store, lease, groups)
    return idx, sizes, groups


async def lease_and_draw(store: Store, pop: Population, rng: np.random.Generator, B: int, G: int) -> tuple[Any, ...]:
    """Lease ``B`` problems and draw g_j Bernoulli rewards each from the policy of now: (lease, idx
    (b,), g_j (b,), groups); :func:`report` reports them."""
    lease = await store.sample(B)
    idx = np.fromiter((int(sp.problem.id[1:]) for sp in lease.problems), dtype=np.int64)  # (b,)
    sizes = np.fromiter((sp.group_size or G for sp in lease.problems), dtype=np.int64)  # (b,) g_j
    # (b, max(G, g_j)): the same draws whatever g_j <= G, columns >= g_j unused
    u = rng.random((idx.size, max(G, int(sizes.max(initial=0)))))
    hits = u < pop.success(idx)[:, None]
    groups = [tuple(map(float, hits[j, : sizes[j]])) for j in range(idx.size)]
    return lease, idx, sizes, groups


async def report(store: Store, lease: Any, groups: list[tuple[float, ...]]) -> None:
    """Report a lease's groups (:func:`lease_and_draw`)."""
    await store.report(lease.lease_id, [GroupOutcome(sp.problem.id, g) for sp, g in zip(lease.problems, groups, strict=True)])


async def open_store(
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


StoreFactory = Callable[[StoreConfig, Callable[[], float]], Store]


async def run_one(
    params: SimParams,
    method: Method,
    seed: int,
    store_factory: StoreFactory = memory_store_factory,
    history: list[dict[str, Any]] | None = None,
    pop_seed: int | None = None,
    final_dump: dict[str, Any] | None = None,
    system: SystemModel | None = None,
) -> RunResult:
    """Train one simulated population with one method until the rollout budget is spent.

    Args:
        history: when given, receives one row per generated group in the format of a demo run's
            ``outcomes.jsonl`` (``problem_id``, ``policy_version`` = optimizer steps before the
            group's batch, ``rewards``, ``sampler``, ``seed``): what ``benchmarks/calibrate.py`` fits.
        pop_seed: the population's seed when it differs from ``seed`` (a second run on the same
            problems and starting model, with its own draws).
        final_dump: when given, receives the store's ``dump()`` at the end (its statistics).
        system: the real learner's model (:class:`~benchmarks.sim_learner.SystemModel`: a queue,
            steps of ``batch_groups``, staleness, pace, an Adam-like step); None: the synchronous
            learner, one step per generation batch (``params.batch_size`` problems).
    """
    pop = Population(params, seed if pop_seed is None else pop_seed)  # pop_seed: the same "base model", another run
    rng = np.random.default_rng([seed, 1])
    clock = Clock()
    store = await open_store(pop, method, seed, store_factory, clock)
    trace = _Trace(pop, params.target_success)
    if system is None:
        steps, trained = await _sync_loop(params, method, seed, store, pop, rng, clock, trace, history)
        counts: dict[str, int] = {}
    else:
        learner = await _system_loop(params, method, system, store, pop, rng, clock, trace)
        steps, trained, counts = learner.version, learner.trained_rollouts, learner.counts()
    return await _result(params, method, seed, store, pop, trace, steps, trained, counts, final_dump)


class _Trace:
    """The curves of a run (population and held-out mean pass@1 against rollouts), each
    problem's peak pass@1, and the rollouts at which the population reached its target."""

    def __init__(self, pop: Population, target: float) -> None:
        self.pop, self.target = pop, target
        self.peak = pop.success()
        self.rollouts, self.success, self.heldout = [0], [float(self.peak.mean())], [pop.heldout_success()]
        self.reached, self.probes = math.nan, 0

    def record(self, rollouts: int) -> None:
        """A point after a batch's report: the policy of that moment."""
        success = self.pop.success()
        np.maximum(self.peak, success, out=self.peak)
        mean = float(success.mean())
        self.rollouts.append(rollouts)
        self.success.append(mean)
        self.heldout.append(self.pop.heldout_success())
        if math.isnan(self.reached) and mean >= self.target:
            self.reached = float(rollouts)


async def _sync_loop(params, method, seed, store, pop, rng, clock, trace, history) -> tuple[int, int]:
    """The synchronous learner: generate a batch, then learn from it; returns (steps, trained rollouts)."""
    B, G = params.batch_size, params.group_size
    learner = SyncLearner(pop, B, method.dynamic_sampling)
    rollouts, version = 0, 0
    while rollouts + B * G <= params.budget_rollouts:
        # -- generate: lease a batch, draw g_j rewards per problem, report them ---------------
        idx, sizes, groups = await generate_batch(store, pop, rng, B, G)
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
        trace.probes += int(np.sum(sizes < G))
        clock.t += 1.0
        mixed, update = group_updates(groups, sizes, G, method.train_probes, params.dilute or method.dilute)
        # -- learn: one optimizer step per batch (dynamic sampling: per B mixed groups) -------
        learner.learn(idx, sizes, mixed, update)
        if learner.steps > version:  # each optimizer step publishes a policy version (a sync learner)
            version = learner.steps
            await store.publish(version, f"sim/v{version}")
        trace.record(rollouts)
    return learner.steps, learner.trained_rollouts


async def _system_loop(params, method, system, store, pop, rng, clock, trace) -> SystemLearner:
    """The real learner's model (``sim_learner``): events in time, one lease generating at a time
    (1 time unit each), learner steps of ``system.step_time``; the run ends with the report that
    spends the budget (a step still computing then is not applied)."""
    G = params.group_size
    learner = SystemLearner(pop, system, G, keep_zero_variance=method.dilute or params.dilute)
    rollouts, leased, now = 0, 0, 0.0
    lease: tuple[Any, ...] | None = None  # (done at, lease, idx, sizes, groups, version)
    while rollouts < params.budget_rollouts:
        room = system.lease_room(len(learner.queue)) if lease is None else 0
        if room >= 1 and leased < params.budget_rollouts:
            drawn = await lease_and_draw(store, pop, rng, room, G)
            lease = (now + 1.0, *drawn, learner.version)
            leased += int(drawn[2].sum())
        learner.advance(now)
        now = min(lease[0] if lease else math.inf, learner.next_event())
        if not math.isfinite(now):
            raise RuntimeError(f"simulated system stalled at {rollouts} rollouts (backlog {learner.backlog}, {system})")
        clock.t = SIM_EPOCH_S + now
        if learner.next_event() <= now:  # a step ends: its update is applied and published
            version = learner.finish()
            await store.publish(version, f"sim/v{version}")
        if lease is not None and lease[0] <= now:  # the lease's groups are reported
            _, handle, idx, sizes, groups, version = lease
            await report(store, handle, groups)
            learner.receive(idx, sizes, groups, version)
            rollouts += int(sizes.sum())
            trace.probes += int(np.sum(sizes < G))
            lease = None
            trace.record(rollouts)
    return learner


async def _result(params, method, seed, store, pop, trace, steps, trained, counts, final_dump) -> RunResult:
    """The run's figures from the store and the population at its end; closes the store."""
    st = await store.stats()
    final = pop.success()
    dump = await store.dump()
    if final_dump is not None:
        final_dump.update(dump)
    misfiled = pool_misfiled_share(dump, final, params.group_size, np.random.default_rng([seed, 2]))
    pooled = sum(1 for pool, *_ in dump["problems"].values() if pool in (Pool.SOLVED, Pool.UNSOLVED))
    await store.close()
    return RunResult(
        method=method.name,
        seed=seed,
        rollouts_to_target=trace.reached,
        final_success=float(final.mean()),
        effective_group_fraction=st.effective_group_fraction,
        forgetting_events=st.forgetting_events,
        breakthroughs=st.breakthroughs,
        forgotten_at_end=int(np.sum(final < trace.peak - 0.1)),
        optimizer_steps=steps,
        useful_rollout_fraction=trained / max(trace.rollouts[-1], 1),
        probes=trace.probes,
        pool_misfiled_share=misfiled,
        pooled_at_end=pooled,
        curve_rollouts=trace.rollouts,
        curve_success=trace.success,
        curve_heldout=trace.heldout,
        groups=counts,
    )
