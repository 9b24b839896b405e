"""Tiny versions of every benchmark (a few seconds), so that ``benchmarks/`` cannot rot.

The figures themselves come from ``python -m benchmarks.run`` (every figure in benchmarks/RESULTS.md); here each
part runs with every size turned down and the tests check the mechanics: the real store is
driven, zero-variance groups teach nothing, results are deterministic, rates and latencies are
sane, Redis keys are cleaned up, and results.json entries carry their provenance.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from benchmarks import overhead, run, service, service_load, service_openloop, simulate
from prioreplay.v1 import priority_service_pb2 as pb

# N=100 problems in 5 skills, B=10, G=8, 30 batches: ~0.1 s per run
TINY_SIM = simulate.SimParams(n_problems=100, n_skills=5, batch_size=10, budget_rollouts=10 * 8 * 30, target_success=0.5)


# -- part 2: the simulator ---------------------------------------------------------------------
def test_training_moves_only_mixed_groups_and_drifts_the_rest():
    p = replace(TINY_SIM, forget_drift=0.01)
    pop = simulate.Population(p, seed=3)
    base, skill = pop.base.copy(), pop.skill.copy()
    pop.train(np.array([4, 7]), np.array([0.25, 0.0]))  # problem 7's group was all-correct/all-wrong
    assert pop.base[4] == pytest.approx(base[4] + p.lr_problem * 0.25)
    assert pop.base[7] == pytest.approx(base[7])  # ω̂ = 0: trained on, but no gradient, no drift
    others = np.setdiff1d(np.arange(p.n_problems), [4, 7])
    np.testing.assert_allclose(pop.base[others], base[others] - 0.01)
    k4, k7 = pop.skill_of[4], pop.skill_of[7]
    assert pop.skill[k4] == pytest.approx(skill[k4] + p.lr_skill * 0.25 + (0.0 if k4 != k7 else 0.0))
    untouched = np.setdiff1d(np.arange(p.n_skills), [k4])
    np.testing.assert_allclose(pop.skill[untouched], skill[untouched])


async def test_simulation_drives_the_real_store_deterministically():
    by = {m.name: m for m in simulate.METHODS}
    a = await simulate.run_one(TINY_SIM, by["heap"], seed=1)
    b = await simulate.run_one(TINY_SIM, by["heap"], seed=1)
    assert a.curve_success == b.curve_success and a.effective_group_fraction == b.effective_group_fraction
    assert a.curve_rollouts[-1] == TINY_SIM.budget_rollouts
    assert 0 < a.effective_group_fraction <= 1
    u = await simulate.run_one(TINY_SIM, by["uniform"], seed=1)
    d = await simulate.run_one(TINY_SIM, by["uniform_dapo"], seed=1)
    assert u.curve_success[0] == a.curve_success[0]  # paired: the same population
    assert d.optimizer_steps < u.optimizer_steps  # dynamic sampling waits for B mixed groups
    h0 = await simulate.run_one(TINY_SIM, by["heap_no_retest"], seed=1)
    assert h0.curve_success != a.curve_success  # retest_fraction reaches the store


def test_run_simulation_summaries_and_paired_ratios():
    out = simulate.run_simulation(TINY_SIM, seeds=range(2))  # (plots: left to `make bench`, matplotlib is slow to import)
    assert set(out["methods"]) == {m.name for m in simulate.METHODS}
    u = out["methods"]["uniform"]
    if u["reached"]:
        assert u["rollouts_ratio_vs_uniform"]["mean"] == 1.0  # paired with itself
    for m in out["methods"].values():
        s = m["effective_group_fraction"]
        assert s["lo"] <= s["mean"] <= s["hi"] and s["n"] == 2


async def test_probes_count_in_the_budget_and_are_trained_only_when_asked():
    by = {m.name: m for m in simulate.CANDIDATES}
    heap = await simulate.run_one(TINY_SIM, simulate.METHODS[3], seed=2)
    scr = await simulate.run_one(TINY_SIM, by["screened"], seed=2)
    tr = await simulate.run_one(TINY_SIM, by["screened_train"], seed=2)
    assert heap.probes == 0 and scr.probes >= TINY_SIM.n_problems  # every problem is probed once first
    assert scr.curve_rollouts[1] == TINY_SIM.batch_size * 2  # the first batch: B probes of 2 completions
    assert scr.curve_rollouts[-1] > heap.curve_rollouts[-1] - TINY_SIM.batch_size * TINY_SIM.group_size
    assert tr.useful_rollout_fraction > scr.useful_rollout_fraction  # mixed probes reach the learner
    # in the first batch every group is a probe: only screened_train learns from it
    assert scr.curve_success[1] < tr.curve_success[1]


def test_dilution_scales_each_update_by_the_mixed_share_of_the_step():
    plain = asyncio.run(simulate.run_one(TINY_SIM, simulate.METHODS[0], seed=4))
    diluted = asyncio.run(simulate.run_one(replace(TINY_SIM, dilute=True), simulate.METHODS[0], seed=4))
    assert diluted.curve_success[0] == plain.curve_success[0]  # paired population
    assert diluted.final_success < plain.final_success  # the same draws, smaller steps
    assert set(simulate.POPULATIONS) == {"default", "hard", "forgetting", "dilute"}
    for overrides in simulate.POPULATIONS.values():
        replace(simulate.SimParams(), **overrides)  # every population is a valid SimParams


def test_summarize_drops_nan_and_brackets_the_mean():
    s = simulate.summarize([1.0, 2.0, 3.0, math.nan])
    assert s["n"] == 3 and s["mean"] == 2.0 and 1.0 <= s["lo"] < 2.0 < s["hi"] <= 3.0
    assert math.isnan(simulate.summarize([math.nan])["mean"])


# -- part 1: the service -----------------------------------------------------------------------
TINY_SERVICE = replace(
    service.QUICK,
    problems=500,
    batch_size=16,
    concurrency=(1, 3),
    duration_s=0.15,
    warmup_s=0.03,
    server="inprocess",
    big_register=1_000,
)


async def test_load_counts_a_pair_per_loop_even_when_calls_outlast_the_window():
    """A loaded machine's first calls can outlast a short window; the rate is then over a
    stretched window that holds every counted call, never 0 (a CI run measured 0.0 once)."""

    async def sample():
        await asyncio.sleep(0.05)
        return "L", ["a", "b"]

    async def report(lease_id, ids):
        await asyncio.sleep(0.05)

    res = await service_load.load(2, [(sample, report)], duration_s=0.01, warmup_s=0.01)
    s = res.summary()
    assert res.reported >= 4 and res.sampled >= 4  # each of the 2 loops counted a pair
    assert res.window_s >= 0.1  # stretched to the end of the counted pairs (≥ 2 × 50 ms)
    assert 0 < s["reported_per_s"] <= res.reported / 0.1


def test_the_cpu_ratio_is_ceiling_cpu_per_problem_over_server_cpu_per_problem():
    e2e = {"server_cores": 0.5, "sampled_per_s": 10_000.0}  # 50 µs of server CPU per problem
    ceil = {"client_cores": 0.25, "sampled_per_s": 10_000.0}  # 25 µs per problem in-process
    assert service._cpu_ratio(e2e, ceil) == pytest.approx(0.5)
    assert service._cpu_ratio({**e2e, "sampled_per_s": 20_000.0}, ceil) == pytest.approx(1.0)  # same CPU, twice the rate
    assert math.isnan(service._cpu_ratio({**e2e, "server_cores": None}, ceil))  # an in-process server: no figure


@pytest.mark.redis
async def test_service_loop_both_stores_and_ceiling(redis_url):
    out = await service.run_throughput(TINY_SERVICE, redis_url)
    assert len(out["rows"]) == 2 * 2 * 2  # stores × (grpc, inprocess) × C
    for row in out["rows"]:
        assert row["sampled_per_s"] > 0 and row["reported_per_s"] > 0
        assert row["sample_p50_ms"] <= row["sample_p99_ms"]
    assert {(r["store"], r["clients"]) for r in out["ratios"]} == {(s, c) for s in ("memory", "redis") for c in (1, 3)}
    assert all(r["sampled_ratio"] > 0 for r in out["ratios"])
    assert set(out["register_s"]) == {"memory", "redis"}


async def test_service_rounds_interleave_the_two_sides_of_each_ratio():
    """With rounds, each C's gRPC row is followed by its in-process row, round after round (A B A B),
    each ratio pairs one round's two rows, and the figures carry their intervals and the rounds."""
    from dataclasses import replace

    params = replace(TINY_SERVICE, stores=("memory",), concurrency=(1,))
    out = await service.run_throughput(params, rounds=2)
    assert [(r["path"], r["round"]) for r in out["rows"]] == [("grpc", 0), ("inprocess", 0), ("grpc", 1), ("inprocess", 1)]
    (ratio,) = out["ratios"]
    rows = out["rows"]
    paired = [rows[i]["sampled_per_s"] / rows[i + 1]["sampled_per_s"] for i in (0, 2)]
    assert ratio["rounds"] == 2 and ratio["sampled_ratio"] == pytest.approx(sum(paired) / 2)
    lo, hi = ratio["sampled_ratio_ci95"]
    assert lo <= ratio["sampled_ratio"] <= hi and lo < hi
    ceiling = next(r for r in out["mean_rows"] if r["path"] == "inprocess")  # (TINY's server runs in this process)
    assert ceiling["rounds"] == 2
    assert ceiling["cpu_us_per_problem"] == pytest.approx(sum(r["cpu_us_per_problem"] for r in rows[1::2]) / 2)
    assert len(out["load"]) == 2
    with pytest.raises(ValueError, match="rounds"):
        await service.run_throughput(params, rounds=0)


@pytest.mark.redis
async def test_redis_memory_counts_keys_and_cleans_up(redis_url, namespace):
    import redis

    mem = await service.run_redis_memory(TINY_SERVICE, redis_url, namespace=namespace)
    assert mem["problems"] == 1_000
    assert set(mem["key_bytes"]) >= {"problems", "stats", "heap"}
    assert 50 < mem["state_bytes_per_problem"] < 2_000
    assert mem["prompt_bytes_per_problem"] > 100  # the ~130-byte synthetic prompts
    r = redis.Redis.from_url(redis_url)
    assert list(r.scan_iter(match=f"*{{{namespace}}}*")) == []
    r.close()


def test_synthetic_outcomes_are_valid_and_mixed():
    gen = service_load.Outcomes(TINY_SERVICE, seed=0)
    outs = gen.proto([f"bench-{i:07d}" for i in range(200)])
    assert all(len(o.completions) == TINY_SERVICE.group_size for o in outs)
    c = outs[0].completions[0]
    assert len(c.token_ids) == len(c.logprobs) == TINY_SERVICE.tokens
    kinds = [len({x.reward for x in o.completions}) for o in outs]
    assert 0.3 < kinds.count(2) / len(kinds) < 0.95  # mixed and zero-variance groups both occur


# -- part 4: overhead --------------------------------------------------------------------------
def test_rpc_share_from_a_run_directory(tmp_path):
    (tmp_path / "report.json").write_text(
        json.dumps(
            {
                "worker_metrics": {
                    "worker-0": {
                        "prioreplay_worker_rpc_seconds_sum": 1.0,
                        "prioreplay_worker_generation_seconds_sum": 97.0,
                        "prioreplay_worker_verification_seconds_sum": 2.0,
                    },
                    "worker-1": {"prioreplay_worker_rpc_seconds_sum": 1.0, "prioreplay_worker_generation_seconds_sum": 99.0},
                }
            }
        )
    )
    lines = [
        {"step": 1, "rpc_s": 0.2, "pull_s": 0.9, "wait_s": 1.0, "compute_s": 8.0, "publish_s": 1.0},
        {"step": 2, "rpc_s": 0.3, "pull_s": 0.4, "wait_s": 0.5, "compute_s": 9.0, "publish_s": 0.5},
        {"event": "start"},
    ]
    (tmp_path / "learner.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    out = overhead.rpc_share(tmp_path)
    assert out["worker"]["share"] == pytest.approx(2.0 / 200.0) and out["worker"]["workers"] == 2
    assert out["learner"]["share"] == pytest.approx(0.5 / 20.0) and out["learner"]["steps"] == 2
    assert out["learner"]["share_of_compute"] == pytest.approx(0.5 / 17.0)
    assert out["learner"]["pull_s"] == pytest.approx(1.3)  # long-polls: reported, not counted as overhead
    old = [{k: v for k, v in x.items() if k != "pull_s"} for x in lines[:2]]
    assert overhead.learner_share(old) is None  # a log without pull_s cannot give the overhead
    with pytest.raises(FileNotFoundError):
        overhead.rpc_share(tmp_path / "missing")


def test_cli_writes_figures_with_provenance(tmp_path):
    out = tmp_path / "results.json"
    (tmp_path / "results.json").write_text(json.dumps([{"name": "kept.figure", "value": 1, "unit": "s"}]))
    assert run.main(["--quick", "--parts", "simulate", "--seeds", "1", "--out", str(out)]) == 0
    items = json.loads(out.read_text())
    names = {i["name"] for i in items}
    assert "kept.figure" in names and "sim.heap.effective_group_fraction" in names
    for i in items:
        if i["name"] != "kept.figure":
            assert {"name", "value", "unit", "command", "date", "machine_cores"} <= set(i)
            assert i["command"].startswith("python -m benchmarks.run --quick")


# -- part 5: the TRL integration's overhead --------------------------------------------------------
@pytest.mark.slow  # two TRL trainings
def test_trl_overhead_runs_both_arms_and_writes_its_figures(tmp_path):
    out = tmp_path / "results.json"
    assert run.main(["--quick", "--parts", "integration", "--out", str(out)]) == 0
    items = {i["name"]: i for i in json.loads(out.read_text())}
    share = items["integration.trl.overhead_share"]["value"]
    assert 0 < share < 1  # the integration took some, not all, of the run
    assert items["integration.trl.lease_ms_per_step"]["value"] > 0
    assert items["integration.trl.step_s.trl"]["value"] > 0 and items["integration.trl.step_s.prioreplay"]["value"] > 0
    assert items["integration.trl.step_ratio"]["min"] <= items["integration.trl.step_ratio"]["value"]
    assert 0 < items["integration.trl.bare_sample_p50_ms"]["value"] <= items["integration.trl.bare_sample_p90_ms"]["value"]


def test_publish_share_from_a_run_directory(tmp_path):
    from benchmarks.publish import main, publish_figures

    lines = [
        {"step": 1, "compute_s": 18.0, "publish_s": 2.0, "checkpoint_s": 0.0, "wait_s": 30.0},
        {"step": 2, "compute_s": 22.0, "publish_s": 2.0, "wait_s": 1.0},
    ]
    (tmp_path / "learner.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "learner.log").write_text("INFO step 2: checkpoint /x/step-2 in 10.00 s; acknowledged 4 groups\n")
    f = publish_figures(tmp_path, checkpoint_every=10)
    assert f["publish_share"] == pytest.approx(4.0 / 44.0)  # waiting for groups left out
    assert f["checkpoint_s"] == 10.0 and f["checkpoint_share_amortised"] == pytest.approx(1.0 / 23.0)
    out = tmp_path / "results.json"
    out.write_text(json.dumps([{"name": "other", "value": 1}]))
    assert main([str(tmp_path), "--label", "t", "--out", str(out)]) == 0
    names = [r["name"] for r in json.loads(out.read_text())]
    assert names[0] == "other" and "learner.publish.t.publish_share" in names


def test_raw_reports_are_byte_identical_to_the_messages():
    gen = service_load.RawReports(TINY_SERVICE, seed=3)
    ids = [f"bench-{i:07d}" for i in range(50)]
    state = gen.rng.bit_generator.state
    raw = gen.request("lease-1", ids, "w")
    gen.rng.bit_generator.state = state
    assert raw == pb.ReportOutcomesRequest(lease_id="lease-1", outcomes=gen.proto(ids), worker_id="w").SerializeToString()


async def test_open_loop_serves_the_offered_load(redis_url):
    params = replace(TINY_SERVICE, stores=("memory",), duration_s=1.0, warmup_s=0.3)
    out = await service_openloop.run_open_loop(params, redis_url, workers=4, period_s=0.25, loads=(1,))
    row = out["rows"][0]
    assert row["offered_problems_per_s"] == 4 * params.batch_size / 0.25
    assert row["ticks"] >= 12 and row["unfinished"] == 0
    assert row["sampled_per_s"] == pytest.approx(row["offered_problems_per_s"], rel=0.35)
    assert 0 < row["sample_p50_ms"] <= row["sample_p99_ms"] <= row["sample_p999_ms"]
    assert row["client_cores"] >= 0 and row["server_cores"] > 0
    assert out["sustained"][0]["store"] == "memory"


def test_weights_fetch_over_http_is_measured_beside_the_shared_volume_load(tmp_path):
    from benchmarks.publish import main

    out = tmp_path / "results.json"
    assert main(["--fetch", "tiny", "--repeats", "1", "--out", str(out)]) == 0
    figs = {r["name"]: r["value"] for r in json.loads(out.read_text())}
    for k in ("publish_s", "shared_load_s", "http_fetch_s", "http_load_s", "http_total_s"):
        assert figs[f"weights.tiny.{k}"] > 0, k
    assert figs["weights.tiny.http_total_s"] == pytest.approx(
        figs["weights.tiny.http_fetch_s"] + figs["weights.tiny.http_load_s"], abs=2e-4
    )
    assert figs["weights.tiny.bytes"] > 10_000


async def test_knapsack_group_sizes_above_g_are_drawn_and_spend_exactly_the_batch_budget():
    by = {m.name: m for m in simulate.CANDIDATES}
    run = await simulate.run_one(TINY_SIM, by["knapsack"], seed=2)
    steps = np.diff(run.curve_rollouts)
    assert (steps == TINY_SIM.batch_size * TINY_SIM.group_size).all()  # Ḡ = G: the budget of a fixed-G batch
    assert run.probes > 0  # some groups are smaller than G (and hence others larger)
    assert 0 < run.useful_rollout_fraction <= 1


async def test_predicted_runs_in_the_simulator_on_prompts_that_name_their_skill():
    pop = simulate.Population(TINY_SIM, seed=1)
    recs = simulate.problem_records(pop)
    same = [r.prompt.split(" about ")[1] for r, c in zip(recs, pop.skill_of, strict=True) if c == pop.skill_of[0]]
    assert len(set(same)) == 1 and len({r.prompt.split(" about ")[1] for r in recs}) == TINY_SIM.n_skills
    by = {m.name: m for m in simulate.CANDIDATES}
    run = await simulate.run_one(TINY_SIM, by["predicted"], seed=1)
    assert run.optimizer_steps > 0 and run.curve_success[-1] != run.curve_success[0]


def test_the_simulated_pool_audit_counts_pooled_problems_a_test_now_would_place_elsewhere():
    import numpy as np

    from prioreplay.rules import Pool

    # p0 unsolved but always right, p1 unsolved and always wrong, p2 solved and always right,
    # p3 solved but always wrong, p4 in the heap (not audited)
    pools = [Pool.UNSOLVED, Pool.UNSOLVED, Pool.SOLVED, Pool.SOLVED, Pool.HEAP]
    dump = {"problems": {f"p{j:07d}": (int(pool), 4.0, 0.0, 0.0, 1.0) for j, pool in enumerate(pools)}}
    success = np.array([1.0, 0.0, 1.0, 0.0, 0.5])
    assert simulate.pool_misfiled_share(dump, success, 4, np.random.default_rng(0)) == 0.5
    heap_only = {"problems": {"p0000000": (int(Pool.HEAP), 0.0, 0.0, 0.0, 0.25)}}
    assert math.isnan(simulate.pool_misfiled_share(heap_only, success, 4, np.random.default_rng(0)))


def test_calibrate_part_fits_a_simulated_run_and_projects_both_samplers(tmp_path):
    out = tmp_path / "r.json"
    assert run.main(["--quick", "--parts", "calibrate", "--out", str(out)]) == 0
    items = {i["name"]: i for i in json.loads(out.read_text())}
    for name in ("logit_mean", "logit_sd", "lr_problem", "lr_skill", "forget_drift"):
        fig = items[f"calib.fit.{name}"]
        assert fig["ci95"][0] <= fig["ci95"][1] and fig["resamples"] == 3
    assert [c["visit"] for c in items["calib.fit.check"]["by_visit"]][0] == "1"
    for variant in ("fitted", "problem_only"):
        assert f"calib.project.{variant}.n400.heap.rollouts_ratio_vs_uniform" in items
