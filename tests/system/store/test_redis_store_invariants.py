"""The store invariants of ARCHITECTURE.md (tests/support/store_semantics.py) on the Redis store.

The same tests run on the memory store without Redis in tests/unit/store/test_memory_store_invariants.py; the
differential test (test_store_differential.py) checks that both stores agree operation by
operation.
"""

from __future__ import annotations

import pytest

from tests.support.store_semantics import *  # noqa: F401,F403  (the invariant tests, collected here)
from tests.support.store_semantics_run import *  # noqa: F401,F403


@pytest.fixture
def store_factory(redis_store_factory):
    """The invariant tests' store: the Redis store only."""
    return redis_store_factory
