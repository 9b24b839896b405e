"""The real learner's model in the simulator (benchmarks/sim_learner.py): the queue, staleness,
pace and the Adam-like step, without a store."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.sim_learner import StepNorm, SystemLearner, SystemModel
from benchmarks.sim_population import Population, SimParams

PARAMS = SimParams(n_problems=16, n_skills=1, group_size=4, batch_size=4, budget_rollouts=64, skill_sd=0.0, forget_drift=0.0)
MIXED, ALL_WRONG = (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0)


def report(learner: SystemLearner, problems: list[int], groups: list[tuple[float, ...]], version: int) -> None:
    learner.receive(np.array(problems), np.array([4] * len(problems)), groups, version)


def test_adam_like_steps_move_the_skill_about_as_far_with_one_mixed_group_as_with_four():
    one, four = StepNorm(1.0, 0.999), StepNorm(1.0, 0.999)
    u1, u4 = np.array([0.1875]), np.full(4, 0.1875)
    s1, s4 = one.scale(u1), four.scale(u4)
    assert (u1 * s1).sum() == pytest.approx(0.25)  # the first step is the gradient's size normalised away
    assert (u4 * s4).sum() == pytest.approx(2 * 0.25)  # four groups: their shared skill adds up as sqrt(4)
    assert StepNorm(0.0, 0.999).scale(u4) == 1.0  # SGD
    diluted = StepNorm(1.0, 0.999)
    assert (u4 / 4 * diluted.scale(u4 / 4)).sum() == pytest.approx((u4 * s4).sum())  # a constant dilution cancels


def test_a_step_takes_batch_groups_oldest_first_and_drops_the_stale_ones():
    pop = Population(PARAMS, 0)
    learner = SystemLearner(pop, SystemModel(batch_groups=2, max_staleness=1, prefetch=False), 4, keep_zero_variance=False)
    report(learner, [0, 1, 2], [MIXED, ALL_WRONG, MIXED], version=0)
    assert learner.generated == 3 and learner.backlog == 2  # the all-wrong group is counted, not queued
    learner.version = 2  # two versions published since: both queued groups are stale
    report(learner, [3, 4], [MIXED, MIXED], version=2)
    learner.advance(0.0)
    assert learner.stale == 2 and learner.busy_until == pytest.approx(2.0) and learner.backlog == 0
    before = pop.base.copy()
    assert learner.finish() == 3
    assert pop.base[3] > before[3] and pop.base[4] > before[4] and pop.base[0] == before[0]
    assert learner.counts() == {"generated": 5, "queued": 4, "trained": 2, "stale": 2, "left": 0}


def test_grpos_rule_queues_and_trains_zero_variance_groups_and_prefetch_pulls_the_next_batch():
    learner = SystemLearner(Population(PARAMS, 0), SystemModel(batch_groups=2), 4, keep_zero_variance=True)
    report(learner, [0, 1, 2, 3, 5], [MIXED, ALL_WRONG, ALL_WRONG, MIXED, MIXED], version=0)
    learner.advance(0.0)
    assert learner.trained == 2 and len(learner.pulled) == 2 and learner.backlog == 3  # one queued, two prefetched
    learner.finish()
    learner.advance(2.0)
    assert learner.trained == 4 and learner.counts()["left"] == 3  # the step in progress and one queued


def test_pacing_cuts_a_lease_to_the_room_the_store_would_leave():
    """The store's rule (store.pace.pace_room): room = K·b − undelivered groups, a lease cut to it."""
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.priority_server.store.pace import pace_room

    assert SystemModel(lease_size=8).lease_room(10_000) == 8  # unpaced
    paced = SystemModel(batch_groups=4, lease_size=8, pace=1)
    assert [paced.lease_room(u) for u in (0, 1, 3, 4, 9)] == [4, 3, 1, 0, -5]  # cut to K·b − u, never the whole 8
    assert SystemModel(batch_groups=4, lease_size=8, pace=2).lease_room(3) == 5
    store_rule = StoreConfig(pace_batches=1, pace_batch_groups=4)
    assert all(paced.lease_room(u) == pace_room(store_rule, 8, lambda u=u: u, 4) for u in range(10))
    with pytest.raises(ValueError, match="pace"):
        SystemModel(pace=0)
    with pytest.raises(ValueError, match="adam"):
        SystemModel(adam=1.5)


def test_tiers_are_the_skills_of_their_problems():
    p = SimParams(n_problems=90, n_skills=3, tiers=((3.0, 0.1), (0.0, 0.1), (-3.0, 0.1)), n_heldout=30)
    pop = Population(p, 1)
    for k, mean in enumerate((3.0, 0.0, -3.0)):
        assert abs(pop.base[pop.skill_of == k].mean() - mean) < 0.2
        assert abs(pop.heldout_base[pop.heldout_skill == k].mean() - mean) < 0.2
    with pytest.raises(ValueError, match="a tier is a skill"):
        SimParams(n_problems=90, n_skills=2, tiers=((0.0, 1.0),))
