"""The reasoning-gym verifier through verify(): the library's scorer in the killable process pool."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from prioreplay.datasets import iter_problems  # noqa: E402
from prioreplay.verifiers import verify  # noqa: E402


def test_verify_scores_the_answer_tag_with_the_library_scorer():
    p = next(iter(iter_problems("reasoning-gym:basic_arithmetic:1:0")))
    right = json.loads(p.answer)["answer"]
    ok = verify("reasoning-gym", f"step by step...\n<answer>{right}</answer>", p.answer, timeout_s=30)
    assert (ok.reward, ok.error) == (1.0, None)
    assert verify("reasoning-gym", "<answer>nope</answer>", p.answer, timeout_s=30).reward == 0.0
    bad = verify("reasoning-gym", "<answer>1</answer>", "not json", timeout_s=30)
    assert bad.reward == 0.0 and bad.error and "reasoning-gym" in bad.error
