"""The behaviour/proximal mismatch on real engines: the transformers worker in the learner's dtype
(float32) and in bfloat16, against the float32 learner, at staleness 0 and 4.

The worker samples completions with its own engine (``TransformersBackend``, its reported log-probs
are μ); the learner recomputes each completion token's log-prob by teacher forcing
(:func:`prioreplay.learner.batch.token_logprobs`, float32, π_prox). Staleness 4: the learner's
weights after 4 AdamW steps (the learner's optimizer; lr ``--lr``) of the GRPO loss on those very
completions, with ±1 advantages drawn at random, against the μ of the version-0 worker. Per arm:

- ``mismatch_kl``: k3 estimate of KL(μ‖π_prox) = mean of w − 1 − log w (Schulman 2020), nats/token;
- ``abs_log_w_p50`` / ``_p90`` / ``_p99``: percentiles of |log w|, w = π_prox/μ;
- ``tis_truncated_frac`` (w > 2), ``mis_token_masked_frac`` (w outside [1/2, 2]),
  ``icepop_masked_frac`` (w outside [0.5, 5]): what each correction at its default would do.

Figure names: ``offpolicy.<figure>.transformers_<dtype>[_stale4]`` in benchmarks/results.json.

    python -m benchmarks.offpolicy --model smollm2-135m --out benchmarks/results.json --note "..."
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.results import merge_results
from prioreplay import models
from prioreplay.learner.batch import token_logprobs
from prioreplay.learner.loss import LossSettings, grpo_loss

PROMPTS = (
    "What is 17 times 23?",
    "Name three prime numbers larger than 50.",
    "Write one sentence about the sea.",
    "If a train travels 60 km in 45 minutes, what is its speed in km/h?",
    "Explain what a hash table is in one sentence.",
    "What is the capital of Australia?",
    "Solve for x: 3x + 7 = 22.",
    "Give a synonym for 'quick'.",
)


def _model_dir(name: str, workdir: Path) -> Path:
    if name == "tiny":
        from prioreplay.tiny_model import make_tiny_model

        return make_tiny_model(workdir / "tiny", seed=1)
    return models.resolve_model(name)


def _sample(model_dir: Path, dtype: torch.dtype, prompts: list[list[int]], n: int, max_new: int, seed: int):
    """Completions of the transformers worker in ``dtype``: (prompt ids, completion ids, μ) triples."""
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(model_dir, dtype=dtype)
    out = backend.generate(prompts, n, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=seed))
    return [(p, c.token_ids, c.logprobs) for p, group in zip(prompts, out, strict=True) for c in group if c.token_ids]


def _tensors(samples, pad_id: int):
    """Right-padded (B, T) ids and attention mask, (B, T − 1) completion mask and μ."""
    T = max(len(p) + len(c) for p, c, _ in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T - 1)
    mu = torch.zeros(B, T - 1)
    for b, (p, c, lp) in enumerate(samples):
        s = list(p) + list(c)
        ids[b, : len(s)] = torch.tensor(s)
        attn[b, : len(s)] = 1
        mask[b, len(p) - 1 : len(s) - 1] = 1
        mu[b, len(p) - 1 : len(s) - 1] = torch.tensor(lp, dtype=torch.float32)
    return ids, attn, mask, mu


def figures(log_w: torch.Tensor) -> dict[str, float]:
    """The mismatch figures of the (n,) log w of every valid token (see the module docstring)."""
    lw = log_w.double()
    w = torch.exp(lw)
    q = torch.quantile(lw.abs(), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    return {
        "mismatch_kl": float((w - 1 - lw).mean()),
        "abs_log_w_p50": float(q[0]),
        "abs_log_w_p90": float(q[1]),
        "abs_log_w_p99": float(q[2]),
        "tis_truncated_frac": float((w > 2.0).double().mean()),
        "mis_token_masked_frac": float(((w < 0.5) | (w > 2.0)).double().mean()),
        "icepop_masked_frac": float(((w < 0.5) | (w > 5.0)).double().mean()),
        "tokens": float(lw.numel()),
    }


def measure(model: str, n: int, max_new: int, lr: float, seed: int, stale_steps: int = 4) -> dict[str, float]:
    """Figures per arm ``transformers_<dtype>`` (staleness 0) and ``..._stale<k>``."""
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model_dir(model, Path(tmp))
        tok = models.load_tokenizer(model_dir)
        prompts = [models.apply_chat_template(tok, p) for p in PROMPTS]
        learner = models.load_causal_lm(model_dir, dtype=torch.float32)
        learner.eval()  # no dropout: the learner's forward as the loss sees it
        dtypes = (("float32", torch.float32), ("bf16", torch.bfloat16))
        arms = {name: _sample(model_dir, dt, prompts, n, max_new, seed) for name, dt in dtypes}
        batches = {name: _tensors(s, tok.pad_token_id) for name, s in arms.items()}
        out: dict[str, float] = {}

        def record(suffix: str) -> None:
            for name, (ids, attn, mask, mu) in batches.items():
                with torch.no_grad():
                    prox, _ = token_logprobs(learner, ids, attn)  # (B, T-1)
                for k, v in figures((prox - mu)[mask > 0]).items():
                    out[f"{k}.transformers_{name}{suffix}"] = v

        record("")
        # staleness: the learner moves on k AdamW steps (its own loss) while μ stays the version-0 sampler's
        opt = torch.optim.AdamW(learner.parameters(), lr=lr)
        ids, attn, mask, mu = batches["float32"]
        g = torch.Generator().manual_seed(seed)
        for _ in range(stale_steps):
            adv = torch.randint(0, 2, (ids.shape[0],), generator=g).float() * 2 - 1
            lp, _ = token_logprobs(learner, ids, attn)
            loss, _ = grpo_loss(lp, mu, adv, mask, LossSettings(correction="none"))
            opt.zero_grad()
            loss.backward()
            opt.step()
        record(f"_stale{stale_steps}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (built here), or a model alias or directory (smollm2-135m)")
    ap.add_argument("--n", type=int, default=4, help="completions per prompt (8 prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate of the 4 stale steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="measurement conditions, e.g. the load (recorded)")
    ap.add_argument("--out", default=None, help="merge the figures into this results.json (default: print only)")
    a = ap.parse_args(argv)
    load = os.getloadavg()
    t0 = time.perf_counter()
    figs = measure(a.model, a.n, a.max_new_tokens, a.lr, a.seed)
    print(json.dumps(figs, indent=1))
    if a.out:
        command = (
            f"python -m benchmarks.offpolicy --model {a.model} --n {a.n} --max-new-tokens {a.max_new_tokens} "
            f"--lr {a.lr} --seed {a.seed}"
        )
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        note = f"{a.note}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {time.perf_counter() - t0:.0f}s"
        items: list[dict[str, Any]] = [
            {
                "name": f"offpolicy.{k}",
                "value": v,
                "unit": "count" if k.startswith("tokens.") else ("fraction" if "frac" in k else "nats"),
                "command": command,
                "date": now,
                "machine_cores": os.cpu_count(),
                "machine": platform.machine(),
                "torch": torch.__version__,
                "note": note.lstrip("; "),
            }
            for k, v in figs.items()
        ]
        merge_results(Path(a.out), items)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
