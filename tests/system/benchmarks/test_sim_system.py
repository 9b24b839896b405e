"""The simulator with the real learner's model (run_one(..., system=...)) and its prediction for a
real comparison (benchmarks/sim_vs_real.py), on tiny protocols: the real store is driven, every
generated group is counted, pacing leaves nothing to go stale, and the prediction is read as
compare reads a real comparison."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import numpy as np
import pytest

from benchmarks import decision_runs, sim_vs_real, simulate
from benchmarks.sim_learner import SystemModel

TINY = simulate.SimParams(
    n_problems=64, n_skills=1, group_size=4, batch_size=8, budget_rollouts=512, n_heldout=32, logit_mean=-1.5
)
HEAP = next(m for m in simulate.METHODS if m.name == "heap")
GRPO = next(m for m in sim_vs_real.ARMS if m.name == "grpo")


def run(method, system, seed=0):
    return asyncio.run(simulate.run_one(TINY, method, seed, system=system))


def test_unpaced_generation_outruns_the_learner_and_its_groups_go_stale():
    r = run(HEAP, SystemModel(batch_groups=4, lease_size=8, step_time=2.0))
    c = r.groups
    assert c["generated"] == 128 and r.curve_rollouts[-1] == 512
    assert c["trained"] + c["stale"] + c["left"] == c["queued"] < c["generated"]  # zero-variance groups are not queued
    assert c["stale"] > 0 and c["trained"] < c["generated"] / 3  # the learner sets the pace
    assert r.optimizer_steps == pytest.approx(512 / 32 / 2, abs=2)  # a step per two leases
    again = run(HEAP, SystemModel(batch_groups=4, lease_size=8, step_time=2.0))
    assert again.curve_heldout == r.curve_heldout  # deterministic by seed


def test_paced_generation_trains_every_group_it_queues_and_grpo_trains_them_all():
    paced = SystemModel(batch_groups=4, lease_size=8, step_time=2.0, pace=1)
    r = run(GRPO, paced)
    assert r.groups["stale"] == 0 and r.groups["queued"] == r.groups["generated"]
    assert r.groups["trained"] >= 0.9 * r.groups["generated"]
    heap = run(HEAP, paced)
    assert heap.groups["stale"] == 0 and heap.optimizer_steps < r.optimizer_steps  # heap steps on mixed groups only
    assert heap.curve_heldout[0] == r.curve_heldout[0]  # paired: one population


def test_the_synchronous_learner_is_unchanged_by_the_split():
    a = asyncio.run(simulate.run_one(TINY, HEAP, 0))
    assert a.groups == {} and len(a.curve_rollouts) == 512 // 32 + 1


def test_eval_curve_reads_the_policy_when_the_rollouts_reach_each_mark():
    r = simulate.RunResult("heap", 0, math.nan, 0.0, 0.0, 0, 0, 0, 0)
    r.curve_rollouts, r.curve_heldout = [0, 32, 64, 96, 128], [0.1, 0.2, 0.3, 0.4, 0.5]
    proto = replace(sim_vs_real.PROTOCOLS["demo"], rollouts=128, eval_points=3, eval_noise=False)
    c = sim_vs_real.eval_curve(r, proto, np.random.default_rng(0), before=0.1)
    assert c.rollouts == (0.0, 32.0, 64.0, 96.0, 128.0) and c.accuracy == (0.1, 0.2, 0.3, 0.4, 0.5)
    r.curve_rollouts = [0, 40, 80, 120, 130]
    c = sim_vs_real.eval_curve(r, proto, np.random.default_rng(0), before=0.1)
    assert c.accuracy == (0.1, 0.2, 0.3, 0.4, 0.5)  # mark 32 is reached at the report of 40, and so on


def test_the_prediction_runs_every_arm_and_sets_the_measured_beside_it():
    proto = replace(sim_vs_real.PROTOCOLS["demo"], problems=32, rollouts=256, eval_size=32, eval_points=3)
    arms = list(sim_vs_real.ARMS)
    assert tuple(m.name for m in arms) == decision_runs.ARMS  # the decision plan's arms, in its order
    out = sim_vs_real.predict(proto, [0, 1, 2], arms[:3], progress=False)
    assert out["arms"]["grpo"]["vs_grpo"].ratio == pytest.approx(1.0)  # against itself
    assert 0 < out["arms"]["heap"]["trained_share"] <= 1
    items = {i["name"]: i for i in sim_vs_real.predicted_items(out, "cmd", "")}
    heap = items["method.sim_vs_real.demo.heap.predicted"]
    assert heap["vs_dapo"]["ratio"] > 0 and len(heap["vs_grpo"]["real_seeds_ci95"]) == 2
    compare = {
        "samplers": ["grpo", "heap"],
        "rollouts_to_target": {
            "heap_vs_grpo": {"ratio": 1.1, "ci_low": 0.0, "ci_high": 99.0, "per_seed": [1.1], "seeds": [0, 1], "censored": 0}
        },
    }
    measured = {i["name"]: i for i in sim_vs_real.measured_items(compare, list(items.values()), "demo", "cmd", "")}
    assert measured["method.sim_vs_real.demo.heap"]["value"] == 1.1
    assert measured["method.sim_vs_real.demo.heap"]["predicted_in_measured_ci95"] == {"vs_grpo": True}
    with pytest.raises(ValueError, match="run python -m benchmarks.sim_vs_real"):
        sim_vs_real.measured_items(compare, [], "decision", "cmd", "")


def test_protocol_overrides_name_the_field_and_the_value():
    p = sim_vs_real.with_overrides(sim_vs_real.PROTOCOLS["decision"], ["pace=none", "rollouts=4096", "eval_noise=false"])
    assert (p.pace, p.rollouts, p.eval_noise) == (None, 4096, False)
    with pytest.raises(SystemExit, match="unknown field"):
        sim_vs_real.with_overrides(p, ["lr=1"])
    with pytest.raises(SystemExit, match="not a value for rollouts"):
        sim_vs_real.with_overrides(p, ["rollouts=many"])
