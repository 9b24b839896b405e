"""The vLLM backend on the real engine (vLLM's CPU build), SmolLM2-135M-Instruct converted to a model
directory: behaviour log-probs against the learner's recompute, seeds, stops, limits, in-place reload
through ``collective_rpc`` and the checkpoints it refuses. One engine for the module (start-up is the
cost: about 35 s on 2 cores)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.vllm_gap import recompute_log_w
from prioreplay import models
from prioreplay.errors import InvalidArgument
from prioreplay.rollout_worker.backends.base import SamplingParams, model_eos_token_ids
from prioreplay.rollout_worker.backends.vllm_backend import TIED_HEAD, VLLMBackend, vllm_stop_token_ids

#: learner recompute vs behaviour log-probs, float32 on both sides, nats (mean, max |Δ|)
TOL_MEAN, TOL_MAX = 1e-3, 2e-2
PROMPTS = ["What is 2+3?", "Name a colour.", "Compute 17 * 4."]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """v0: the converted model; v1: the same with the last layer's MLP scaled (stored once, tied)."""
    v0 = models.resolve_model("smollm2-135m")
    base = tmp_path_factory.mktemp("vllm")
    v1 = base / "v1"
    shutil.copytree(v0, v1)
    t = load_file(str(v1 / models.WEIGHTS_FILE))
    name = next(k for k in sorted(t) if k.endswith("mlp.down_proj.weight"))
    t[name] = t[name] * 1.5
    save_file(t, str(v1 / models.WEIGHTS_FILE), metadata={"format": "pt"})
    return v0, v1, base


@pytest.fixture(scope="module")
def backend(dirs):
    b = VLLMBackend(dirs[0], max_model_len=512, dtype="float32")
    yield b
    b.llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def prompts(backend):
    return [models.apply_chat_template(backend.tokenizer, p) for p in PROMPTS]


def gaps(model_dir, prompts, groups, temperature: float) -> torch.Tensor:
    """|behaviour − learner recompute| of every completion token, nats (N,)."""
    return recompute_log_w(model_dir, prompts, groups, temperature).abs()


def test_behaviour_logprobs_match_the_learners_recompute(backend, dirs, prompts):
    groups = backend.generate(prompts, 4, SamplingParams(temperature=0.8, max_new_tokens=16, seed=3))
    gap = gaps(dirs[0], prompts, groups, 0.8)
    print(f"float32 behaviour vs learner recompute: mean |Δ| {gap.mean():.2e}, max |Δ| {gap.max():.2e} over {gap.numel()} tokens")
    assert gap.numel() > 20
    assert gap.mean() <= TOL_MEAN and gap.max() <= TOL_MAX


def test_distinct_in_a_group_and_across_replicas_reproducible_for_equal_seeds(backend, prompts):
    def run(seeds):
        g = backend.generate(prompts, 4, SamplingParams(max_new_tokens=12, prompt_seeds=seeds))
        return [[tuple(c.token_ids) for c in grp] for grp in g]

    a, again, other = run((1, 2, 3)), run((1, 2, 3)), run((101, 102, 103))
    assert a == again
    assert all(len(set(grp)) > 1 for grp in a), "a group's completions must differ"
    assert a != other, "another replica's seeds must give other completions"


def test_stop_strings_eos_ids_and_truncated_flag(backend, prompts):
    gen = model_eos_token_ids(backend.model_dir, backend.tokenizer)
    assert vllm_stop_token_ids(backend.eos_token_ids) == list(gen) and gen
    groups = backend.generate(prompts, 4, SamplingParams(max_new_tokens=3, seed=0))
    for c in (c for g in groups for c in g):
        assert c.truncated == (len(c.token_ids) == 3 and c.token_ids[-1] not in gen)
    assert any(c.truncated for g in groups for c in g)
    long = backend.generate(prompts, 4, SamplingParams(max_new_tokens=200, seed=0))
    ended = [c for g in long for c in g if not c.truncated]
    assert ended and all(c.token_ids[-1] in gen for c in ended)
    stopped = backend.generate(prompts, 4, SamplingParams(max_new_tokens=40, stop=(" ",), seed=0))
    for c in (c for g in stopped for c in g):
        assert c.text.count(" ") <= 1 and (c.truncated or c.text.endswith(" ") or c.token_ids[-1] in gen)


def test_an_over_long_prompt_is_refused_and_the_engine_still_serves(backend, prompts):
    with pytest.raises(InvalidArgument, match="max_model_len"):
        backend.generate([prompts[0] * 100], 2, SamplingParams(max_new_tokens=4))
    assert len(backend.generate(prompts[:1], 2, SamplingParams(max_new_tokens=4, seed=0))[0]) == 2


def test_bad_checkpoints_are_refused_and_the_old_weights_kept(backend, dirs, prompts):
    v0, _, base = dirs
    before = backend.generate(prompts, 2, SamplingParams(max_new_tokens=8, seed=5))
    t = load_file(str(v0 / models.WEIGHTS_FILE))
    cases = {"missing": None}
    partial = dict(t)
    partial.pop(sorted(partial)[-1])
    cases["partial"] = partial
    cases["mismatched"] = {**t, "model.norm.weight": torch.ones(7)}
    nan = dict(t)
    name = sorted(nan)[0]
    nan[name] = nan[name].clone()
    nan[name].view(-1)[0] = float("nan")
    cases["non-finite"] = nan
    for kind, tensors in cases.items():
        d = base / f"bad-{kind}"
        if tensors is not None:
            shutil.copytree(v0, d)
            save_file(tensors, str(d / models.WEIGHTS_FILE), metadata={"format": "pt"})
        with pytest.raises(InvalidArgument):
            backend.load_weights(str(d), 9)
        assert backend.policy_version == 0, kind
    after = backend.generate(prompts, 2, SamplingParams(max_new_tokens=8, seed=5))
    assert [[c.token_ids for c in g] for g in after] == [[c.token_ids for c in g] for g in before]


def test_reload_in_place_then_either_tied_form_of_the_checkpoint(backend, dirs, prompts):
    v0, v1, base = dirs
    assert backend.tied_embeddings
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    old = backend.generate(prompts, 2, params)
    backend.load_weights(str(v1), 1)  # the head stored once (save_weights' form)
    assert backend.policy_version == 1
    new = backend.generate(prompts, 2, params)
    gap = gaps(v1, prompts, new, 1.0)
    print(f"after reload (prefix cache reset): mean |Δ| {gap.mean():.2e}, max |Δ| {gap.max():.2e} vs a fresh load of v1")
    assert gap.mean() <= TOL_MEAN and gap.max() <= TOL_MAX
    assert [c.logprobs for g in new for c in g] != [c.logprobs for g in old for c in g]
    # the other form: lm_head.weight stored beside the embeddings (other writers, HF's original files)
    both = base / "v2-both"
    shutil.copytree(v0, both)
    t = load_file(str(both / models.WEIGHTS_FILE))
    assert TIED_HEAD not in t
    t[TIED_HEAD] = t["model.embed_tokens.weight"].clone()
    save_file(t, str(both / models.WEIGHTS_FILE), metadata={"format": "pt"})
    backend.load_weights(str(both), 2)
    assert backend.policy_version == 2
    back = backend.generate(prompts, 2, params)
    assert [c.token_ids for g in back for c in g] == [c.token_ids for g in old for c in g]
    backend.load_weights(str(v1), 3)  # and back to the single form after it
    assert backend.policy_version == 3


def test_after_a_reload_tokens_and_logprobs_equal_a_fresh_engines(backend, dirs, prompts):
    """In place (``collective_rpc``, then the prefix cache reset) vs an engine started on the new
    weights: the same seeded samples (per-completion seeds: the same tokens wherever the two
    distributions agree, a stricter check than greedy, which the backend refuses as temperature 0)
    and log-probs within float32 kernel noise. Runs after the reload test
    (file order), so the module's engine has loaded v1 twice and v0's tied form in between."""
    v0, v1, _ = dirs
    backend.load_weights(str(v1), 4)
    seeded = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
    reloaded = backend.generate(prompts, 2, seeded)
    fresh_engine = VLLMBackend(v1, max_model_len=512, dtype="float32")
    try:
        fresh = fresh_engine.generate(prompts, 2, seeded)
    finally:
        fresh_engine.llm.llm_engine.engine_core.shutdown()
    assert [c.token_ids for g in reloaded for c in g] == [c.token_ids for g in fresh for c in g]
    delta = torch.tensor(
        [
            abs(a - b)
            for g, h in zip(reloaded, fresh, strict=True)
            for c, d in zip(g, h, strict=True)
            for a, b in zip(c.logprobs, d.logprobs, strict=True)
        ]
    )
    print(f"reloaded vs fresh engine on v1: {delta.numel()} seeded tokens, max |Δ logprob| {delta.max():.2e} nats")
    assert delta.max() <= 1e-4


#: a word problem of about 370 tokens with the chat template: longer than two of the CPU engine's 128-token KV blocks
LONG_PROBLEM = (
    "A farm keeps a ledger. "
    + " ".join(f"On day {k} it sold {3 * k + 1} eggs and {k + 2} jars of honey." for k in range(1, 18))
    + " How many eggs did it sell over these days? Give the number."
)


def test_a_prompt_longer_than_a_kv_block_is_not_continued_from_the_old_weights(backend, dirs):
    """The prefix cache is reset on every reload: a prompt that filled whole KV blocks under the old
    weights is recomputed under the new ones. The new version changes the first layer, so every
    layer's keys and values differ (a change to the last layer's MLP would leave all KV equal and
    prove nothing). Without the reset the cached prefix gives log-prob gaps of about 1 nat against
    the learner's recompute; with it they are float32 noise."""
    v0, _, base = dirs
    early = base / "v-first-layer"
    if not early.exists():
        shutil.copytree(v0, early)
        t = load_file(str(early / models.WEIGHTS_FILE))
        name = next(k for k in sorted(t) if k.startswith("model.layers.0.") and k.endswith("mlp.down_proj.weight"))
        t[name] = t[name] * 1.5
        save_file(t, str(early / models.WEIGHTS_FILE), metadata={"format": "pt"})
    prompt = models.apply_chat_template(backend.tokenizer, LONG_PROBLEM)
    block = backend.llm.llm_engine.vllm_config.cache_config.block_size
    assert len(prompt) > 2 * block, f"the prompt ({len(prompt)} tokens) must fill whole KV blocks ({block} tokens)"
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=13)
    backend.load_weights(str(v0), 10)
    backend.generate([prompt], 2, params)  # caches the prompt's full blocks, computed with v0
    backend.load_weights(str(early), 11)
    after = backend.generate([prompt], 2, params)
    gap = gaps(early, [prompt], after, 1.0)
    print(f"{len(prompt)}-token prompt after a reload: mean |Δ| {gap.mean():.2e}, max |Δ| {gap.max():.2e} vs a fresh recompute")
    assert gap.mean() <= TOL_MEAN and gap.max() <= TOL_MAX


def test_a_reload_that_changes_the_tied_embeddings_changes_the_output_head_too(backend, dirs, prompts):
    """SmolLM2's head is its embedding matrix. The learner trains it, so every published version
    changes it; vLLM's CPU build computed the logits with a copy of the head packed when the model
    loaded, and an in-place reload left that copy at the first version's weights: log-prob gaps of
    9 nats against the learner's recompute. The backend processes a tied head again after a reload."""
    v0, _, base = dirs
    embeddings = base / "v-embeddings"
    if not embeddings.exists():
        shutil.copytree(v0, embeddings)
        t = load_file(str(embeddings / models.WEIGHTS_FILE))
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"] * 1.3
        save_file(t, str(embeddings / models.WEIGHTS_FILE), metadata={"format": "pt"})
    backend.load_weights(str(embeddings), 20)
    after = backend.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=12, seed=17))
    gap = gaps(embeddings, prompts, after, 1.0)
    print(f"after a reload that changed the tied embeddings: mean |Δ| {gap.mean():.2e}, max |Δ| {gap.max():.2e}")
    assert gap.mean() <= TOL_MEAN and gap.max() <= TOL_MAX
