"""Unit tests of the sampler seam (services/priority_server/samplers/__init__.py and base.py) and
the store's ordering keys (tie-break members, histogram edges): registry, RNG, quota, and a new
sampler plugged in. Each sampler's own behaviour is tested in test_sampler_<name>.py.

Expected values are computed by hand or by an independent implementation in the test (numpy
uint32 arithmetic for xorshift32).
"""

from __future__ import annotations

import re
import typing
from dataclasses import replace

import numpy as np
import pytest

from prioreplay.apps.demo_config import DemoConfig
from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.samplers import (
    SAMPLERS,
    RetestThenHeap,
    SamplerName,
    SamplerSpec,
    XorShift32,
    retest_quota,
    step_seed,
)
from prioreplay.priority_server.store import TIE_HEX_CHARS, StoreConfig, histogram_edges, member_id, tie_member
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.redis import RedisStore
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool


# -- the registry -----------------------------------------------------------------------------------
def _lua_branches() -> set[str]:
    """The branches sample.lua gets: one file lua/samplers/<name>.lua each, adding ``branches[<name>]``."""
    from prioreplay.priority_server.store.redis.scripts import sampler_files

    out = set()
    for name, path in sampler_files().items():
        text = path.read_text(encoding="utf-8")
        assert re.search(rf"^branches(\.{re.escape(name)}|\['{re.escape(name)}'\]) = ", text, re.M), (
            f"{path} adds no branch {name}"
        )
        out.add(name)
    return out


def test_every_registered_sampler_has_its_lua_branch_and_every_branch_a_sampler():
    assert {s.lua_branch for s in SAMPLERS.values() if s.lua_branch} == _lua_branches()
    assert all(name == spec.name for name, spec in SAMPLERS.items())


def test_configurations_offer_exactly_the_registered_samplers():
    names = tuple(SAMPLERS)
    assert typing.get_args(SamplerName) == names
    for cls in (ServerConfig, DemoConfig):
        assert typing.get_args(cls.model_fields["sampler"].annotation) == names
    for name in names:
        assert StoreConfig(sampler=name).sampler == name
    with pytest.raises(InvalidArgument, match="must be one of heap, weighted, uniform"):
        StoreConfig(sampler="greedy")


class _BottomOfHeap(RetestThenHeap):
    """A sampler only this test knows: H is the bottom of the heap, screened with G = 2."""

    def take_from_heap(self, view, request, count):
        picks = [view.take_heap(view.heap_size() - 1) for _ in range(min(count, view.heap_size()))]
        return [replace(p, group_size=2) for p in picks]


async def test_a_new_sampler_plugs_in_through_the_registry_alone(monkeypatch):
    monkeypatch.setitem(
        SAMPLERS, "bottom", SamplerSpec("bottom", _BottomOfHeap, uses_rng=False, retests=True, lua_branch=None, help="test only")
    )
    config = StoreConfig(sampler="bottom", retest_fraction=0.0, seed=3)
    store = MemoryStore(config)
    ids = [f"p{i}" for i in range(10)]
    await store.register([ProblemRecord(i, f"q {i}", "1") for i in ids])
    lease = await store.sample(3)
    bottom_first = sorted(ids, key=lambda i: tie_member(i, 3))  # heap order reversed (equal priorities)
    assert [sp.problem.id for sp in lease.problems] == bottom_first[:3]
    assert all(sp.group_size == 2 and sp.source is Pool.HEAP for sp in lease.problems)
    with pytest.raises(InvalidArgument, match="memory store only"):
        RedisStore(config, "redis://127.0.0.1:1/0", "ns")


# -- tie-break keys (store.py) ------------------------------------------------------------------------------
IDS = [f"p{i:04d}" for i in range(1000)]


def _rank_correlation(order: list[str]) -> float:
    ranks = np.array([IDS.index(i) for i in order], dtype=float)
    return float(np.corrcoef(ranks, np.arange(len(order), dtype=float))[0, 1])


def test_tie_member_is_a_seeded_prefix_plus_the_id():
    m = tie_member("p0042", 7)
    assert len(m) == TIE_HEX_CHARS + len("p0042")
    assert all(c in "0123456789abcdef" for c in m[:TIE_HEX_CHARS])
    assert member_id(m) == "p0042"
    assert tie_member("p0042", 7) == m  # deterministic
    assert tie_member("p0042", 8) != m


def test_tie_order_does_not_follow_dataset_order_and_depends_on_the_seed():
    heap_order = {}
    for seed in (0, 1):
        heap_order[seed] = sorted(IDS, key=lambda i: tie_member(i, seed), reverse=True)
        assert heap_order[seed][:32] != IDS[:32]
        # a random permutation of 1000: |rank correlation| has standard deviation ≈ 0.03
        assert abs(_rank_correlation(heap_order[seed])) < 0.15
    assert heap_order[0] != heap_order[1]
    assert len(set(heap_order[0][:100]) & set(heap_order[1][:100])) < 50


# -- batch arithmetic ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "batch, fraction, first_quotas",
    [
        (10, 0.0, [0, 0, 0]),
        (10, 0.1, [1, 1, 1]),
        (256, 0.1, [25, 26, 25, 26, 26]),  # 25.6 a batch: the remainder carried
        (4, 1.0, [4, 4, 4]),
        (100, 0.25, [25, 25, 25]),
        (7, 0.5, [3, 4, 3, 4]),
        (2, 0.1, [0, 0, 0, 0, 1, 0, 0, 0, 0, 1]),  # one retest in five batches of 2, not one in every batch
    ],
)
def test_retest_quota_is_the_fraction_over_time_with_the_remainder_carried(batch, fraction, first_quotas):
    assert [retest_quota(batch, fraction, s) for s in range(1, len(first_quotas) + 1)] == first_quotas


@pytest.mark.parametrize("batch, fraction", [(2, 0.1), (3, 0.25), (5, 0.3), (16, 0.1), (1, 0.05)])
def test_retest_quotas_sum_to_the_fraction_of_all_batches(batch, fraction):
    steps = 1000
    total = sum(retest_quota(batch, fraction, s) for s in range(1, steps + 1))
    assert abs(total - fraction * batch * steps) < 1.0


def test_histogram_edges_are_equal_buckets_over_zero_to_quarter():
    assert histogram_edges(4) == [0.0, 0.0625, 0.125, 0.1875, 0.25]
    edges = histogram_edges(10)
    assert len(edges) == 11 and edges[0] == 0.0 and edges[-1] == 0.25
    assert np.allclose(np.diff(edges), 0.025)


def test_step_seed_is_32_bit_nonzero_and_changes_with_seed_and_step():
    seeds = {step_seed(s, t) for s in range(3) for t in range(1, 50)}
    assert len(seeds) == 3 * 49
    assert all(0 < x < 2**32 for x in seeds)
    assert step_seed(5, 9) == step_seed(5, 9)


# -- xorshift32 ------------------------------------------------------------------------------------
def _xorshift32_numpy(seed: int, n: int) -> list[int]:
    """Marsaglia (2003), "Xorshift RNGs", J. Stat. Softw. 8(14): y ^= y<<13; y ^= y>>17; y ^= y<<5
    on 32-bit unsigned integers (numpy uint32 wraps modulo 2³²)."""
    y = np.uint32(seed)
    out = []
    with np.errstate(over="ignore"):
        for _ in range(n):
            y ^= np.uint32(y << np.uint32(13))
            y ^= np.uint32(y >> np.uint32(17))
            y ^= np.uint32(y << np.uint32(5))
            out.append(int(y))
    return out


@pytest.mark.parametrize("seed", [1, 2463534242, 0xDEADBEEF, 123456789, step_seed(0, 1)])
def test_xorshift32_matches_an_independent_implementation(seed):
    rng = XorShift32(seed)
    assert [rng.next_u32() for _ in range(20)] == _xorshift32_numpy(seed, 20)


def test_xorshift32_known_first_outputs():
    # seed 1 by hand: 1 ^ (1<<13) = 8193; 8193 >> 17 = 0; 8193 ^ (8193<<5) = 8193 ^ 262176 = 270369
    assert XorShift32(1).next_u32() == 270369
    # Marsaglia's paper seeds y = 2463534242; its first output is 723471715
    assert XorShift32(2463534242).next_u32() == 723471715


def test_xorshift32_random_is_in_unit_interval_and_zero_seed_is_usable():
    rng = XorShift32(0)  # 0 is a fixed point of xorshift; the RNG maps it to 1
    assert rng.next_u32() == 270369
    rng = XorShift32(99)
    expected = _xorshift32_numpy(99, 1000)
    draws = [rng.random() for _ in range(1000)]
    assert draws == [x / 2**32 for x in expected]
    assert all(0.0 <= d < 1.0 for d in draws)
    assert 0.4 < sum(draws) / len(draws) < 0.6


# -- the samplers' parameters ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("gumbel_temperature", 0.0),
        ("probe_size", 0),
        ("posterior_decay", 0.0),
        ("posterior_decay", 1.5),
        ("posterior_prior", 0.0),
    ],
)
def test_new_sampler_parameters_are_validated(field, value):
    with pytest.raises(InvalidArgument, match=field):
        StoreConfig(**{field: value})


def flat_parameter_reads(source: str, flags: tuple[str, ...]) -> list[str]:
    """Reads of a flat sampler setting in ``source``: ``self.config.<flag>``, ``config.<flag>``, or
    ``c.<flag>`` after ``c = self.config``."""
    import ast

    tree = ast.parse(source)
    owners = {"self.config", "config"}
    owners |= {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and ast.unparse(n.value) in owners
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in flags and ast.unparse(node.value) in owners
    ]


def test_no_sampler_reads_a_flat_parameter_setting():
    """A sampler reads its parameters from ``self.params`` (its own model), never from the flat
    ``--alpha``-style settings of the store's configuration: copying any sampler as the template of
    a new one must work for a new parameter too (docs/SAMPLERS.md)."""
    from pathlib import Path

    from prioreplay.priority_server.config import SAMPLER_FLAGS
    from prioreplay.priority_server.samplers import base

    assert {"alpha", "probe_size", "posterior_decay"} <= set(SAMPLER_FLAGS)
    for path in sorted(Path(base.__file__).resolve().parent.glob("*.py")):
        assert flat_parameter_reads(path.read_text(encoding="utf-8"), SAMPLER_FLAGS) == [], path.name
    planted = "def f(self):\n    c = self.config\n    return c.posterior_decay + self.config.alpha + self.params.alpha\n"
    assert flat_parameter_reads(planted, SAMPLER_FLAGS) == ["3: c.posterior_decay", "3: self.config.alpha"]


def test_the_sampler_may_be_given_as_one_nested_setting(tmp_path, monkeypatch):
    """``sampler={"name": ..., <parameter>: ...}``: a dict, a parameter model, a config file's
    mapping or JSON in PRIOREPLAY_SAMPLER all give the same settings as the flat flags."""
    from prioreplay.apps.cli import parse
    from prioreplay.priority_server.samplers.weighted import WeightedParams

    flat = StoreConfig(sampler="weighted", alpha=2.0)
    assert StoreConfig(sampler={"name": "weighted", "alpha": 2.0}) == flat
    assert StoreConfig(sampler=WeightedParams(alpha=2.0)) == flat
    assert flat.sampler_params == WeightedParams(alpha=2.0)
    (tmp_path / "c.yaml").write_text("server:\n  sampler: {name: weighted, alpha: 2.0}\n", encoding="utf-8")
    assert parse("server", ["--config", str(tmp_path / "c.yaml")]).to_store_config() == flat
    monkeypatch.setenv("PRIOREPLAY_SAMPLER", '{"name": "weighted", "alpha": 2.0}')
    assert parse("server", []).to_store_config() == flat


def test_a_nested_sampler_is_checked_like_the_flat_flags():
    with pytest.raises(InvalidArgument, match="alpha is given twice"):
        StoreConfig(sampler={"name": "weighted", "alpha": 2.0}, alpha=3.0)
    with pytest.raises(InvalidArgument, match="needs its name"):
        StoreConfig(sampler={"alpha": 2.0})
    with pytest.raises(InvalidArgument, match="alpha"):
        StoreConfig(sampler={"name": "weighted", "alpha": -1})
    with pytest.raises(InvalidArgument, match="nope"):
        StoreConfig(sampler={"name": "heap", "nope": 1})  # a parameter no model has: refused by sampler_args' check
