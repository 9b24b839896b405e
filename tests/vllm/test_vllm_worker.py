"""The engine a ``prioreplay worker --backend vllm`` builds from its settings alone (what the demo's
workers run): the learner's float32 by default, the model's whole context, and it generates. The
module ``test_vllm_engine.py`` builds its engine with ``max_model_len=512``; the worker gives none,
and with float32 (issue 43) the CPU build's default KV cache must hold one request of the model's
8,192 tokens or the engine refuses to start."""

from __future__ import annotations

from prioreplay import models
from prioreplay.rollout_worker.backends.base import SamplingParams
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.main import build_backend


def test_the_workers_own_engine_starts_in_float32_with_the_models_whole_context():
    backend = build_backend(WorkerConfig(model="smollm2-135m", backend="vllm", metrics_port=0))
    try:
        config = backend.llm.llm_engine.model_config
        assert str(config.dtype) == "torch.float32"
        assert config.max_model_len == 8192
        prompt = models.apply_chat_template(backend.tokenizer, "What is 2+3?")
        [group] = backend.generate([prompt], 2, SamplingParams(max_new_tokens=8, seed=0))
        assert len(group) == 2 and all(c.token_ids for c in group)
    finally:
        backend.llm.llm_engine.engine_core.shutdown()
