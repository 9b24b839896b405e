"""The transformers backend never generates past the model's context: max_new_tokens is capped
at the context minus the prompt, and a completion cut there is reported truncated."""

from __future__ import annotations

import pytest

from prioreplay import models
from prioreplay.rollout_worker.backends.base import SamplingParams
from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
from prioreplay.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow


def test_generation_stops_at_the_context_and_says_truncated(tmp_path):
    backend = TransformersBackend(make_tiny_model(tmp_path / "m", seed=0))
    prompt = models.apply_chat_template(backend.tokenizer, "What is 2+3?")
    room = 3
    backend._max_context_tokens = len(prompt) + room  # a model whose context leaves 3 positions
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=7)
    completions = backend.generate([prompt], 8, params)[0]
    assert max(len(c.token_ids) for c in completions) <= room
    assert all(c.truncated for c in completions if len(c.token_ids) == room and c.token_ids[-1] not in backend.eos_token_ids)
    backend._max_context_tokens = None  # no declared context: the setting alone limits
    assert max(len(c.token_ids) for c in backend.generate([prompt], 8, params)[0]) > room
