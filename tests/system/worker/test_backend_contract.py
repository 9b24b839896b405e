"""The generation backend contract, on the transformers backend with the tiny random model.

Behaviour log-probs must equal a teacher-forced forward pass of the same weights under the same
sampling distribution (logits / temperature, then top-p), because the learner's importance ratio
divides by them.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from prioreplay import models
from prioreplay.errors import InvalidArgument
from prioreplay.rollout_worker.backends.base import GeneratedCompletion, GenerationBackend, SamplingParams
from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
from prioreplay.tiny_model import make_tiny_model

# generation with a model per test: tens of seconds; make test-fast leaves them out
pytestmark = pytest.mark.slow

PROMPTS = ["What is 2+3?", "Compute 17 * 4.", "Hi"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("contract")
    return make_tiny_model(base / "v0", seed=0), make_tiny_model(base / "v1", seed=1)


@pytest.fixture(scope="module")
def backend(dirs):
    return TransformersBackend(dirs[0])


@pytest.fixture(scope="module")
def prompts(backend):
    return [models.apply_chat_template(backend.tokenizer, p) for p in PROMPTS]


def teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float, top_p: float = 1.0
) -> torch.Tensor:
    """log π(token_t | prefix) under logits / T (and top-p), one forward pass; (L,)."""
    from transformers.generation.logits_process import TopPLogitsWarper

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature  # (L, V)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(ids, logits)
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)  # (L,)


def test_backend_satisfies_the_protocol(backend):
    assert isinstance(backend, GenerationBackend)
    assert backend.policy_version == 0


def test_one_group_of_n_per_prompt_with_consistent_shapes(backend, prompts):
    groups = backend.generate(prompts, 4, SamplingParams(max_new_tokens=12, seed=0))
    assert len(groups) == len(prompts) and all(len(g) == 4 for g in groups)
    eos = backend.tokenizer.eos_token_id
    for g in groups:
        for c in g:
            assert isinstance(c, GeneratedCompletion)
            assert 1 <= len(c.token_ids) <= 12 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert eos not in c.token_ids[:-1], "tokens after EOS must be cut"
            assert c.truncated == (len(c.token_ids) == 12 and c.token_ids[-1] != eos)
            assert c.text == backend.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    ended = [c for g in groups for c in g if not c.truncated]
    assert ended and all(c.token_ids[-1] == eos for c in ended)


def test_the_shared_prompt_cache_is_passed_under_the_name_transformers_takes_now(backend, prompts):
    import warnings

    assert backend.share_prompt_cache
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # `past_key_values` to generate() warns in transformers 5.24
        groups = backend.generate(prompts[:1], 2, SamplingParams(max_new_tokens=4, seed=0))
    assert len(groups[0]) == 2


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.5, 1.0), (1.0, 0.8)])
def test_logprobs_equal_a_teacher_forced_forward_pass(backend, prompts, temperature, top_p):
    groups = backend.generate(prompts, 3, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=3))
    for prompt, g in zip(prompts, groups, strict=True):
        for c in g:
            want = teacher_forced_logprobs(backend.model, prompt, c.token_ids, temperature, top_p)
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4), (temperature, top_p)


def test_temperature_changes_the_logprobs_as_scaling_predicts(backend, prompts):
    c = backend.generate(prompts[:1], 1, SamplingParams(temperature=0.5, max_new_tokens=8, seed=1))[0][0]
    at_t1 = teacher_forced_logprobs(backend.model, prompts[0], c.token_ids, 1.0)
    # The behaviour log-probs are those of T = 0.5, not of the raw model.
    assert not torch.allclose(torch.tensor(c.logprobs), at_t1, atol=1e-3)


def test_same_seed_reproduces_other_seed_differs_global_rng_untouched(backend, prompts):
    params = SamplingParams(max_new_tokens=10, seed=42)
    state = torch.random.get_rng_state()
    a = backend.generate(prompts, 2, params)
    assert torch.equal(state, torch.random.get_rng_state())
    b = backend.generate(prompts, 2, params)
    c = backend.generate(prompts, 2, SamplingParams(max_new_tokens=10, seed=43))
    assert a == b
    assert [x.token_ids for g in a for x in g] != [x.token_ids for g in c for x in g]


def test_stop_strings_end_completions_and_cut_the_text(backend, prompts):
    stops = ("a", "e", "7")
    groups = backend.generate(prompts, 4, SamplingParams(max_new_tokens=40, stop=stops, seed=5))
    stopped = 0
    for g in groups:
        for c in g:
            full = backend.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            if c.token_ids[-1] == backend.tokenizer.eos_token_id or c.truncated:
                assert not any(s in full for s in stops)
                continue
            stopped += 1
            assert not c.truncated and c.text.endswith(stops)
            assert sum(full.count(s) for s in stops) == 1, "generation must stop at the first stop string"
            prefix = backend.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
            assert not any(s in prefix for s in stops), "the completing token is the last one kept"
    assert stopped >= 3


def test_chunked_decoding_keeps_the_contract(dirs, prompts):
    small = TransformersBackend(dirs[0], max_batch_sequences=2)
    groups = small.generate(prompts, 3, SamplingParams(max_new_tokens=6, seed=0))
    assert [len(g) for g in groups] == [3, 3, 3]
    for prompt, g in zip(prompts, groups, strict=True):
        for c in g:
            want = teacher_forced_logprobs(small.model, prompt, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)


@pytest.mark.parametrize(
    "prompts_arg, n, match",
    [
        ([], 2, "prompt_token_ids is empty"),
        ([[]], 2, "prompt #0 has no tokens"),
        ([[1, 2, 10_000]], 2, "token id 10000 outside the vocabulary"),
        ([[1, 2]], 0, r"n \(0\) must be"),
    ],
)
def test_bad_requests_are_refused(backend, prompts_arg, n, match):
    with pytest.raises(InvalidArgument, match=match):
        backend.generate(prompts_arg, n, SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(stop=("",)), "stop"),
        (dict(seed=-1), "seed"),
    ],
)
def test_sampling_params_are_validated(kw, match):
    with pytest.raises(InvalidArgument, match=match):
        SamplingParams(**kw)


def test_load_weights_changes_logits_and_refuses_a_tampered_directory(dirs, prompts, tmp_path):
    be = TransformersBackend(dirs[0])
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        before = be.model(ids).logits

    # Tampered directories: refused whole, weights and version unchanged.
    missing = tmp_path / "missing"
    shutil.copytree(dirs[1], missing)
    (missing / "model.safetensors").unlink()
    from safetensors.torch import load_file, save_file

    shaped = tmp_path / "shape"
    shutil.copytree(dirs[1], shaped)
    t = load_file(str(shaped / "model.safetensors"))
    t["model.norm.weight"] = torch.ones(65)
    save_file(t, str(shaped / "model.safetensors"), metadata={"format": "pt"})
    for bad, match in ((missing, "no model.safetensors"), (shaped, r"shape \(65,\)")):
        with pytest.raises(InvalidArgument, match=match):
            be.load_weights(str(bad), 1)
        assert be.policy_version == 0
        with torch.no_grad():
            assert torch.equal(be.model(ids).logits, before)

    seconds = be.load_weights(f"file://{dirs[1]}", 1)
    assert seconds >= 0 and be.policy_version == 1
    with torch.no_grad():
        after = be.model(ids).logits
    assert not torch.allclose(after, before, atol=1e-3)
    with pytest.raises(InvalidArgument, match="version"):
        be.load_weights(str(dirs[1]), -1)


def test_vllm_backend_says_how_to_install_vllm(dirs, monkeypatch):
    import importlib.util
    import sys

    from prioreplay.rollout_worker import backends
    from prioreplay.rollout_worker.backends import vllm_backend  # importing it must not need vllm

    assert "vllm" not in sys.modules or importlib.util.find_spec("vllm") is not None
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(InvalidArgument, match=r"pip install 'prioreplay\[gpu\]'"):
            backends.create_backend("vllm", dirs[0])
    assert vllm_backend.checkpoint_signature(dirs[0])["model.norm.weight"] == ([64], "F32")
    with pytest.raises(InvalidArgument, match="backend"):
        backends.create_backend("onnx", dirs[0])


# --------------------------------------------------------------------------- end-of-turn ids (issue 13)


def test_generation_stops_on_every_eos_id_of_the_generation_config(dirs, prompts, tmp_path):
    """A model whose generation config lists two EOS ids (gemma's <end_of_turn>, Phi's <|end|>)
    stops at either, and such completions are not flagged truncated."""
    import json

    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)
    first = TransformersBackend(dirs[0]).generate(prompts, 4, params)
    tokenizer_eos = models.load_tokenizer(dirs[0]).eos_token_id
    # the second end-of-turn id: the most common token the model samples (so completions hit it)
    counts: dict[int, int] = {}
    for c in (c for g in first for c in g):
        for t in c.token_ids:
            if t != tokenizer_eos:
                counts[t] = counts.get(t, 0) + 1
    second_eos = max(counts, key=counts.get)
    model_dir = tmp_path / "two-eos"
    shutil.copytree(dirs[0], model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config["eos_token_id"] = [tokenizer_eos, second_eos]
    (model_dir / "generation_config.json").write_text(json.dumps(config))

    backend = TransformersBackend(model_dir)
    assert set(backend.eos_token_ids) == {tokenizer_eos, second_eos}
    again = backend.generate(prompts, 4, params)
    cut = 0
    for before, after in zip((c for g in first for c in g), (c for g in again for c in g), strict=True):
        if second_eos in before.token_ids and (
            tokenizer_eos not in before.token_ids or before.token_ids.index(second_eos) < before.token_ids.index(tokenizer_eos)
        ):
            end = before.token_ids.index(second_eos) + 1
            assert after.token_ids == before.token_ids[:end]  # same seed: same tokens up to the stop
            assert not after.truncated
            cut += 1
        assert second_eos not in after.token_ids[:-1] and tokenizer_eos not in after.token_ids[:-1]
    assert cut >= 3


def test_vllm_stop_ids_are_the_generation_config_eos_ids():
    from prioreplay.rollout_worker.backends.base import eos_token_ids
    from prioreplay.rollout_worker.backends.vllm_backend import vllm_stop_token_ids

    assert eos_token_ids(3, {"eos_token_id": [3, 107]}) == (3, 107)
    assert eos_token_ids(3, {"eos_token_id": 107}) == (3, 107)
    assert eos_token_ids(3, {}) == (3,)
    assert eos_token_ids(None, {"eos_token_id": [1, 106, 1]}) == (1, 106)
    assert vllm_stop_token_ids((3, 107)) == [3, 107]
