"""Shared by the sampler tests: a memory store of ``n`` unseen problems under one sampler."""

from __future__ import annotations

import pytest

from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.problems import ProblemRecord

#: The seed of every sampler test's store (tie-break keys and the RNG).
SEED = 3


@pytest.fixture
def make_store():
    """``await make_store(sampler, n=10, **config)``: a MemoryStore with problems p0..p{n-1}."""

    async def make(sampler: str, n: int = 10, **kw) -> MemoryStore:
        store = MemoryStore(StoreConfig(sampler=sampler, seed=SEED, **kw), clock=lambda: 1_700_000_000.0)
        await store.register([ProblemRecord(f"p{i}", f"q {i}", "1") for i in range(n)])
        return store

    return make
