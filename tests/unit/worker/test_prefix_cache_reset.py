"""The vLLM backend's prefix-cache reset after a reload (no vLLM needed: a stand-in engine).

vLLM's ``LLM.reset_prefix_cache()`` answers False, and resets nothing, while requests still hold
KV blocks; the backend asks again a bounded number of times, then stops the worker with the fix
rather than serving KV computed with the old weights. The real engine's reset is checked by
``tests/vllm/test_vllm_engine.py`` (a prompt longer than a KV block, reloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prioreplay.rollout_worker.backends.base import PartialWeightsLoad
from prioreplay.rollout_worker.backends.vllm_backend import reset_prefix_cache


class Engine:
    """Answers ``reset_prefix_cache()`` with the given results in turn, then True."""

    def __init__(self, *answers: bool):
        self.answers, self.calls = list(answers), 0

    def reset_prefix_cache(self) -> bool:
        self.calls += 1
        return self.answers.pop(0) if self.answers else True


def test_a_refused_reset_is_asked_again_until_the_engine_resets():
    engine = Engine(False, False)
    assert reset_prefix_cache(engine, Path("v3"), attempts=5, wait_s=0.0) == 3
    assert engine.calls == 3


def test_a_reset_refused_every_time_stops_the_worker_with_the_fix_after_a_bounded_number_of_tries():
    engine = Engine(*[False] * 100)
    with pytest.raises(PartialWeightsLoad, match="prefix cache") as e:
        reset_prefix_cache(engine, Path("v3"), attempts=4, wait_s=0.0)
    assert engine.calls == 4
    assert "v3" in str(e.value) and "restart the worker" in str(e.value)


def test_a_reset_at_the_first_try_does_not_wait():
    engine = Engine()
    assert reset_prefix_cache(engine, Path("v3"), attempts=3, wait_s=60.0) == 1
