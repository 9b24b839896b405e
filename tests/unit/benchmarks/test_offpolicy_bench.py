"""benchmarks.offpolicy on the tiny model: the worker in the learner's dtype has (almost) no
mismatch, the bf16 worker has a measurable one, and staleness adds to it."""

from __future__ import annotations

import json

import pytest

from benchmarks import offpolicy


def test_figures_of_known_log_w():
    import torch

    f = offpolicy.figures(torch.tensor([0.0, 0.0, 1.0, -1.0]))  # w = 1, 1, e, 1/e
    assert f["tis_truncated_frac"] == 0.25  # e > 2
    assert f["mis_token_masked_frac"] == 0.5  # e and 1/e outside [1/2, 2]
    assert f["icepop_masked_frac"] == 0.25  # 1/e < 0.5, e < 5
    assert f["mismatch_kl"] == pytest.approx(((2.718281828 - 2) + (0.367879441 + 1 - 1)) / 4)


def test_float32_worker_matches_the_learner_and_bf16_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "results.json"
    out.write_text(json.dumps([{"name": "other.figure", "value": 1}]))
    assert offpolicy.main(["--model", "tiny", "--n", "2", "--max-new-tokens", "6", "--out", str(out)]) == 0
    r = {i["name"]: i for i in json.loads(out.read_text())}
    assert "other.figure" in r  # other entries kept
    fp32, bf16 = r["offpolicy.mismatch_kl.transformers_float32"], r["offpolicy.mismatch_kl.transformers_bf16"]
    assert fp32["value"] < 1e-8 < bf16["value"]
    assert r["offpolicy.mismatch_kl.transformers_float32_stale4"]["value"] > fp32["value"]
    assert fp32["unit"] == "nats" and "load average" in fp32["note"]
