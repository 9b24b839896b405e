"""The recipe of docs/SAMPLERS.md, proved: a sampler added in four places (its Python module: the
memory twin and its parameter model; its Lua file ``lua/samplers/<name>.lua``; its registry line;
one test) runs on both stores, memory and Redis, with the same leases. Nothing else is touched:
no store, no script argument, no configuration field.

The toy sampler ``toy-tail`` takes the bottom of the heap after skipping ``skip`` problems
(default 1): its parameter reaches Lua only through the sampler's JSON argument (``S.skip``; a
missing one is a Lua error, another value leases other problems than the memory store).
"""

from __future__ import annotations

import shutil
from typing import Literal

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server import samplers
from prioreplay.priority_server.samplers import SAMPLERS, MemorySampler, Pick, SampleRequest, SamplerSpec, SamplerView
from prioreplay.priority_server.samplers.params import SamplerParams
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import client, scripts
from prioreplay.problems import ProblemRecord


# -- 1. its Python module: the memory twin and the parameter model -------------------------------
class ToyTailParams(SamplerParams):
    """Parameters of ``toy-tail``: ``skip``."""

    name: Literal["toy-tail"] = "toy-tail"
    skip: int = 1


class ToyTail(MemorySampler):
    """The heap's bottom after ``skip`` problems (heap order reversed), one at a time."""

    params: ToyTailParams

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        skip = self.params.skip
        picks = []
        for _ in range(request.batch_size):
            if view.heap_size() <= skip:
                break
            picks.append(view.take_heap(view.heap_size() - 1 - skip))
        return picks


# -- 2. its Lua file -------------------------------------------------------------------------------
TOY_LUA = """-- samplers/toy-tail.lua: the heap's bottom after S.skip problems (a test's toy sampler)
branches['toy-tail'] = function()
  local bottom = redis.call('ZRANGE', k.heap, S.skip, S.skip + B - 1, 'WITHSCORES')
  for i = 1, #bottom, 2 do take(bottom[i], 1, bottom[i + 1]) end
end
"""


@pytest.fixture
def toy_sampler(tmp_path, monkeypatch):
    lua = tmp_path / "lua"
    shutil.copytree(scripts.LUA_DIR, lua)
    (lua / "samplers" / "toy-tail.lua").write_text(TOY_LUA, encoding="utf-8")
    monkeypatch.setattr(scripts, "LUA_DIR", lua)
    monkeypatch.setattr(client, "SCRIPTS", scripts.load_scripts())
    # -- 3. its registry line ----------------------------------------------------------------------
    spec = SamplerSpec(
        "toy-tail", ToyTail, uses_rng=False, retests=False, lua_branch="toy-tail", help="the heap's bottom", params=ToyTailParams
    )
    monkeypatch.setitem(SAMPLERS, "toy-tail", spec)
    return spec


# -- 4. one test -----------------------------------------------------------------------------------
async def _run(store) -> list[list[str]]:
    """Register 8 problems, lease 3, report them (mixed), lease 3 twice more: the leased ids."""
    await store.register([ProblemRecord(f"p{i}", f"q{i}", str(i)) for i in range(8)])
    first = await store.sample(3)
    out = [[sp.problem.id for sp in first.problems]]
    await store.report(first.lease_id, [GroupOutcome(i, (1.0, 0.0)) for i in out[0]])
    for _ in range(2):
        out.append([sp.problem.id for sp in (await store.sample(3)).problems])
    return out


@pytest.mark.parametrize("sampler_args", [{}, {"skip": 4}])
async def test_a_sampler_added_by_the_recipe_runs_alike_on_both_stores(
    toy_sampler, memory_store_factory, redis_store_factory, sampler_args
):
    """Configured as an operator would: ``prioreplay server --sampler toy-tail --sampler-args '{"skip": 4}'``."""
    import json

    from prioreplay.apps.cli import parse

    argv = ["--sampler", "toy-tail", "--seed", "3"] + (["--sampler-args", json.dumps(sampler_args)] if sampler_args else [])
    config = parse("server", argv).to_store_config()
    assert config.sampler_params == ToyTailParams(**sampler_args)
    memory = await _run(memory_store_factory(config))
    redis = await _run(redis_store_factory(config))
    assert redis == memory
    skip = config.sampler_params.skip
    assert [len(ids) for ids in memory] == [3, 3, min(3, 8 - 3 - skip)]


async def test_the_parameter_changes_what_is_leased(toy_sampler, memory_store_factory):
    """(So the equality above could fail: a Lua side reading another skip would lease others.)"""
    leases = [
        await _run(memory_store_factory(StoreConfig(sampler="toy-tail", seed=3, sampler_args=a))) for a in ({}, {"skip": 4})
    ]
    assert leases[0] != leases[1]


def test_a_parameter_the_model_lacks_is_refused():
    with pytest.raises(InvalidArgument, match="nope"):
        StoreConfig(sampler="knapsack", sampler_args={"nope": 1})
    with pytest.raises(InvalidArgument, match="mean_group_size"):
        StoreConfig(sampler="knapsack", sampler_args={"mean_group_size": 1})


def test_the_toy_sampler_is_not_registered_outside_its_test():
    assert "toy-tail" not in SAMPLERS and samplers.SAMPLERS is SAMPLERS


def test_docs_name_exactly_the_four_places():
    """docs/SAMPLERS.md's recipe lists the four places this test touches, and no other file."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "SAMPLERS.md").read_text(encoding="utf-8")
    recipe = text.split("## Adding a sampler", 1)[1]
    places = re.findall(r"^\d\. \*\*[^*]+\*\*(?: in)? `([^`]+)`", recipe, re.M)
    assert places == [
        "services/priority_server/samplers/<name>.py",
        "services/priority_server/store/redis/lua/samplers/<name>.lua",
        "services/priority_server/samplers/__init__.py",
        "tests/unit/samplers/test_sampler_<name>.py",
    ]
    root = Path(__file__).resolve().parents[3]
    assert (root / "services/priority_server/store/redis/lua/samplers").is_dir()
    assert (root / "services/priority_server/samplers/__init__.py").is_file()


async def test_a_namespace_remembers_the_sampler_args(toy_sampler, redis_store_factory):
    """sampler_args is a run setting: a restart with other values is refused, naming it."""
    from prioreplay.errors import FailedPrecondition

    await redis_store_factory(StoreConfig(sampler="toy-tail", sampler_args={"skip": 1})).claim_settings()
    with pytest.raises(FailedPrecondition, match="sampler_args"):
        await redis_store_factory(StoreConfig(sampler="toy-tail", sampler_args={"skip": 4})).claim_settings()
