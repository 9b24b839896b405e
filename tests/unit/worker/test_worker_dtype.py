"""``--dtype``: the worker's engine precision, set once on the worker and passed on by the demo and
``compare`` (a bf16 worker against the float32 learner is the engine gap of docs/OFFPOLICY.md)."""

from __future__ import annotations

import pytest
import torch

from prioreplay.apps.cli import parse
from prioreplay.errors import InvalidArgument
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.main import build_backend
from prioreplay.tiny_model import make_tiny_model


@pytest.mark.parametrize(
    ("dtype", "expected"), [("auto", torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16)]
)
def test_the_transformers_worker_loads_its_model_in_the_dtype_set(tmp_path, dtype, expected):
    model_dir = make_tiny_model(tmp_path / "m")
    backend = build_backend(WorkerConfig(model=str(model_dir), device="cpu", dtype=dtype, metrics_port=0))
    assert {p.dtype for p in backend.model.parameters()} == {expected}
    # a published version (float32 on disk) is loaded into the worker's dtype, not the file's
    version = tmp_path / "v1"
    backend.model.to(torch.float32).save_pretrained(version)
    backend.model.to(expected)
    backend.load_weights(str(version), 1)
    assert {p.dtype for p in backend.model.parameters()} == {expected}


def test_an_unknown_dtype_is_refused_naming_the_choices():
    with pytest.raises(InvalidArgument, match=r"dtype.*'float16'.*auto.*float32.*bfloat16"):
        parse("worker", ["--dtype", "float16", "--metrics-port", "0"])


def test_the_demo_passes_its_dtype_to_every_worker(tmp_path):
    from prioreplay.apps.compare import _arm_config
    from prioreplay.apps.demo import _worker_args

    demo = parse("demo", ["--dtype", "bfloat16"])
    args = _worker_args(demo, 0, "a:1", tmp_path, 1, tmp_path)
    assert parse(args[0], args[1:]).dtype == "bfloat16"
    assert parse("demo", []).dtype == "auto"
    compare = parse("compare", ["--samplers", "heap,dapo", "--dtype", "bfloat16"])
    assert _arm_config(compare, "dapo", 0, tmp_path).dtype == "bfloat16"


@pytest.mark.parametrize(("dtype", "engine"), [("auto", "float32"), ("float32", "float32"), ("bfloat16", "bfloat16")])
def test_a_vllm_worker_runs_the_learners_float32_unless_asked(tmp_path, monkeypatch, dtype, engine):
    """vLLM's own "auto" is the checkpoint's dtype (bfloat16 for SmolLM2): a demo on vLLM sampled in
    bfloat16 against the float32 learner, and logged dtype warnings at every reload (issue 43)."""
    from prioreplay.rollout_worker import backends

    seen = {}
    monkeypatch.setattr(backends, "create_backend", lambda name, model_dir, **kw: seen.update(name=name, **kw))
    model_dir = make_tiny_model(tmp_path / "m")
    build_backend(WorkerConfig(model=str(model_dir), backend="vllm", dtype=dtype, metrics_port=0))
    assert seen["name"] == "vllm" and seen["dtype"] == engine
