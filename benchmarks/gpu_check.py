"""GPU check: the whole stack on this machine's GPUs, 5 learner steps, checked and timed.

``make gpu-check`` (``python -m benchmarks.gpu_check``). Not part of CI. Runs in one process:

* an in-process priority server (:class:`BackgroundServer`, the embedded ``memory`` store);
* the learner (:class:`Learner`) on the first visible GPU, claimed as ``learner_gpus`` would be;
* one rollout worker (:class:`RolloutWorker`, vLLM when installed, else transformers on CUDA) per
  other free GPU, each claimed with :func:`prioreplay.devices.claim_devices` in a temporary claims
  directory (on one GPU the single worker shares the learner's GPU, and says so). The vLLM path is
  untested so far (no machine with vLLM and a GPU was at hand); ``--backend transformers`` forces
  the other one;
* ``--steps`` learner steps (default 5), publishing every step.

Checks (exit 1 when one fails): every worker loaded every published version (the learner waits
before each step until all workers run the newest version, at most ``--gate-timeout-s``); the
learner's log-probs of the step-0 completions, recomputed under the initial weights, match the
workers' behaviour log-probs: mean |Δ| ≤ ``--tol-mean`` (default 1e-3 nats) and
max |Δ| ≤ ``--tol-max`` (default 2e-2 nats). Both sides run float32 with the same weights, so
the gap is kernel, cache and padding round-off only (0 on CPU; a learner whose output head is off
by 1 % reads 1.9e-3 / 2.9e-2 on the dry-run). Prints generated tokens/s per worker and the share
of its wall time outside generation (``benchmarks.overhead worker-idle``'s figure), learner
tokens/s, the learner's step time split (wait for groups / compute / publish / checkpoint) and
peak GPU memory per device.

Model: no network and no weights to carry. The model is built from ``--model-dir``'s config.json
(default: the converted ``smollm2-135m`` alias) with random weights and that directory's real
tokenizer; only config and tokenizer files are read. So that groups have mixed rewards and the
learner trains, the random model is made to write only " ", "0", "1" and EOS (a constant feature in
the embeddings, read by an output head that keeps those four tokens) and every problem's answer is
1 under the gsm8k verifier (the last number of the completion): about a third of the completions
score 1. The compute per token is that of the full model.

``--device cpu`` is a plumbing dry-run: tiny sizes (2 layers, width 64), one CPU worker; without a
GPU and without ``--device cpu`` the check exits 2 with one line saying it needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALLOWED_TEXT = (" ", "0", "1")  # the random model's vocabulary, with EOS
REPO = Path(__file__).resolve().parents[1]


def use_source_tree() -> None:
    """Import the roles from ``services/`` when the project is not installed (a GPU machine with
    torch and transformers but no package index): ``prioreplay.<role>`` is ``services/<role>/``."""
    import importlib.util

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import prioreplay

    if importlib.util.find_spec("prioreplay.learner") is None:
        prioreplay.__path__.append(str(REPO / "services"))


def build_model(source: Path, target: Path, tiny: bool, seed: int = 0, head_dim: int = 16) -> Path:
    """A model directory at ``target``: ``source``'s tokenizer and config, random weights (see module doc).
    ``head_dim``: of the tiny model (width 64); vLLM's CPU attention takes 32 and up, not 16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target.mkdir(parents=True)
    for f in source.iterdir():  # config and tokenizer files; never the weights
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".gguf", ".pt")):
            shutil.copy2(f, target / f.name)
    cfg = AutoConfig.from_pretrained(target)
    cfg.tie_word_embeddings = False
    if tiny:
        cfg.update(
            dict(
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=128,
                num_attention_heads=64 // head_dim,
                num_key_value_heads=max(1, 32 // head_dim),
                head_dim=head_dim,
            )
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(target)
    allowed = sorted({i for t in ALLOWED_TEXT for i in tok.encode(t, add_special_tokens=False)})
    eos = int(tok.eos_token_id)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 100.0  # a constant feature the head reads
        h0 = float(model(torch.tensor([tok.encode("Say 0 or 1.")]), output_hidden_states=True).hidden_states[-1][0, :, 0].mean())
        head = model.get_output_embeddings().weight  # (V, H)
        head.zero_()
        head[allowed, 0] = 15.0 / h0  # logit ~15 for the allowed tokens, 0 for the rest of the vocabulary
        head[eos, 0] = 13.0 / h0  # EOS e^-2 as likely as each (~4 % a token): completions of ~25 tokens
    model.save_pretrained(target, safe_serialization=True)
    return target


def assign_devices(device: str, claims_dir: Path) -> tuple[str, list[str], str]:
    """(learner device, worker devices, note): the learner claims the first GPU, workers the rest."""
    if device == "cpu":
        return "cpu", ["cpu"], "CPU dry-run: one worker"
    import torch

    from prioreplay.devices import NoFreeDevice, claim_devices, visible_devices

    ids = visible_devices() or [str(i) for i in range(torch.cuda.device_count())]
    index = {d: i for i, d in enumerate(ids)}
    claim_devices(1, claims_dir, ids[:1], exact=True)  # held until exit, as the learner's claim is
    workers = []
    while True:
        try:
            workers.append(f"cuda:{index[claim_devices(1, claims_dir, ids, exclude=ids[:1]).devices[0]]}")
        except NoFreeDevice:
            break
    if not workers:
        return "cuda:0", ["cuda:0"], "one GPU: the worker shares GPU 0 with the learner"
    return "cuda:0", workers, f"{len(ids)} GPUs: learner on cuda:0, a worker on each of {', '.join(workers)}"


class GatedClient:
    """The learner's client: passes every call through; before each pull it waits until every
    worker runs the newest published version, and at step 0 it records the log-prob gaps."""

    def __init__(self, client, loaded: dict[str, list[int]], gate_timeout_s: float):
        self._client, self.loaded, self.gate_timeout_s = client, loaded, gate_timeout_s
        self.learner: Any = None  # the Learner (torch: imported late), set before its first pull
        self.gaps: list[float] = []
        self.late: list[int] = []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def pull(self, *args, **kwargs):
        v = self.learner.version
        deadline = time.monotonic() + self.gate_timeout_s
        while v > 0 and not all(v in vs for vs in self.loaded.values()):
            if time.monotonic() > deadline:
                self.late.append(v)
                break
            time.sleep(0.05)
        resp = self._client.pull(*args, **kwargs)
        if self.learner.step_count == 0 and resp.groups:
            self.gaps.extend(step0_gaps(self.learner, list(resp.groups)))
        return resp


def step0_gaps(learner, groups) -> list[float]:
    """|learner log-prob − behaviour log-prob| of every completion token of ``groups``."""
    import torch

    from prioreplay.learner.batch import collate, token_logprobs
    from prioreplay.learner.filters import group_problem

    cfg = learner.config
    groups = [g for g in groups if group_problem(g, cfg.max_sequence_tokens) is None]
    if not groups:
        return []
    batch = collate(groups, [torch.zeros(len(g.completions)) for g in groups], learner.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(
            learner.model,
            batch.input_ids.to(learner.device),
            batch.attention_mask.to(learner.device),
            batch.temperature,
            top_p=batch.top_p,
        )  # (B, T-1)
    gap = (lp.float().cpu() - batch.behaviour_logprobs).abs()[batch.completion_mask]  # (tokens,)
    return gap.tolist()


def start_worker(
    i: int, device: str, address: str, model_dir: Path, args, loaded: dict[str, list[int]], idle: dict[str, IdleClock]
):
    """A RolloutWorker thread on ``device``; its loaded versions are appended to ``loaded[name]``,
    its time inside the backend's ``generate`` is kept in ``idle[name]``."""
    from benchmarks.overhead import _timed_generate
    from prioreplay.client import PriorityClient
    from prioreplay.rollout_worker.backends import create_backend
    from prioreplay.rollout_worker.config import WorkerConfig
    from prioreplay.rollout_worker.metrics import WorkerMetrics
    from prioreplay.rollout_worker.worker import RolloutWorker

    # --backend vllm: vLLM on any device (on --device cpu: vLLM's CPU build, make install-vllm)
    vllm = args.backend == "vllm" or (device != "cpu" and args.backend == "auto" and _has("vllm"))
    cfg = WorkerConfig(
        server=address,
        model=str(model_dir),
        backend="vllm" if vllm else "transformers",
        device=device,
        group_size=args.group_size,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        seed=i,
        worker_id=f"gpu-check-{i}",
        metrics_port=0,
        max_retry_sleep_s=0.2,
    )
    if vllm and device == "cpu":
        backend = create_backend("vllm", model_dir, max_model_len=512)
    elif vllm:  # the engine core is a child process: it takes its GPU from the environment it starts with
        from prioreplay.devices import visible_devices

        ids = visible_devices() or [str(k) for k in range(64)]
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[int(device.partition(":")[2] or 0)]
        try:
            backend = create_backend("vllm", model_dir, gpu_memory_utilization=args.gpu_memory_utilization)
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES")
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
    else:
        backend = create_backend("transformers", model_dir, device=device)
    name = f"worker {i} ({cfg.backend}, {device})"
    loaded[name] = [0]
    load = backend.load_weights

    def load_and_record(uri: str, version: int) -> float:
        seconds = load(uri, version)
        loaded[name].append(version)
        return seconds

    backend.load_weights = load_and_record  # type: ignore[method-assign]  # the benchmark wraps the method to time it
    clock = idle[name] = IdleClock(spans=_timed_generate(backend))
    worker = RolloutWorker(cfg, backend, PriorityClient(cfg), WorkerMetrics())
    thread = threading.Thread(target=clock.run, args=(worker.run,), name=name, daemon=True)
    thread.start()
    return name, worker, thread


@dataclass
class IdleClock:
    """A worker thread's wall time and its ``generate`` spans (``perf_counter`` seconds), for the
    share of wall time the engine is not generating (issue 25's figure, as
    ``benchmarks.overhead worker-idle`` measures it on CPU)."""

    spans: list[tuple[float, float]]
    start: float = 0.0
    end: float = 0.0

    def run(self, fn: Any) -> None:
        """Run ``fn()`` (the worker's loop) between the clock's start and end."""
        self.start = time.perf_counter()
        try:
            fn()
        finally:
            self.end = time.perf_counter()

    def share(self) -> float:
        """Share of the thread's wall time (first lease and last report included) outside
        ``generate``; NaN before the thread ran."""
        wall = (self.end or time.perf_counter()) - self.start
        return (wall - sum(b - a for a, b in self.spans)) / wall if self.start and wall > 0 else float("nan")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _tokens_per_s(worker) -> float:
    reg = worker.metrics.registry
    tokens = reg.get_sample_value("prioreplay_worker_tokens_generated_total") or 0.0
    seconds = reg.get_sample_value("prioreplay_worker_generation_seconds_sum") or 0.0
    return tokens / seconds if seconds else 0.0


def _source_or_refusal(args) -> Path | None:
    """The model directory whose config and tokenizer the check builds from, or None after printing
    why the check cannot run (no CUDA GPU for ``--device cuda``; no config.json)."""
    import torch

    from prioreplay.models import default_cache_dir

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: needs a CUDA GPU and torch sees none; run it on a GPU machine, "
            "or pass --device cpu for the plumbing dry-run",
            file=sys.stderr,
        )
        return None
    source = Path(args.model_dir) if args.model_dir else default_cache_dir() / "smollm2-135m"
    if not (source / "config.json").is_file():
        print(
            f"gpu_check: --model-dir ({source}) has no config.json; give a directory with the model's config and "
            "tokenizer files (weights are not read)",
            file=sys.stderr,
        )
        return None
    return source


def _learner_config(args, address: str, model_dir: Path, run_dir: Path, device: str):
    """The check's learner: ``--steps`` steps, publishing every step, one checkpoint at the end."""
    from prioreplay.learner.config import LearnerConfig

    return LearnerConfig(
        server=address,
        model=str(model_dir),
        device=device,
        batch_groups=args.batch_groups,
        micro_batch_size=args.micro_batch_size,
        lr=1e-5,
        max_steps=args.steps,
        publish_every=1,
        checkpoint_every=args.steps,
        checkpoint_dir=run_dir / "checkpoints",
        metrics_port=0,
        log_file=run_dir / "learner.jsonl",
        max_staleness=args.steps,
        pull_wait_s=1.0,
    )


def _stop_workers(args, learner, workers, loaded: dict[str, list[int]]) -> None:
    """Give the workers until ``--gate-timeout-s`` to load the last version, then stop them."""
    deadline = time.monotonic() + args.gate_timeout_s  # the last version: workers load it on their next lease
    while not all(learner.version in vs for vs in loaded.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for _, worker, _ in workers:
        worker.stop_event.set()
    for _, _, thread in workers:
        thread.join(args.gate_timeout_s)


def run(args) -> int:
    """Run the check; returns 0 (passed), 1 (a check failed) or 2 (no GPU)."""
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.convert import problem_to_proto
    from prioreplay.learner.learner import Learner
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.problems import ProblemRecord

    t0 = time.perf_counter()
    source = _source_or_refusal(args)
    if source is None:
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="prioreplay-gpu-check-"))
    tiny = args.device == "cpu"
    model_dir = build_model(source, run_dir / "model", tiny=tiny, head_dim=32 if args.backend == "vllm" else 16)
    learner_device, worker_devices, note = assign_devices(args.device, run_dir / "gpu-claims")
    print(f"gpu_check: {note}; model {'tiny' if tiny else 'full-size'} from {source.name} config, random weights")
    loaded: dict[str, list[int]] = {}
    idle: dict[str, IdleClock] = {}
    with BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
        client = PriorityClient(ClientSettings(server=srv.address))
        client.register(
            problem_to_proto(ProblemRecord(f"gpu-check-{i}", "Say 0 or 1.", "1", "gsm8k")) for i in range(args.problems)
        )
        lcfg = _learner_config(args, srv.address, model_dir, run_dir, learner_device)
        gated = GatedClient(PriorityClient(lcfg), loaded, args.gate_timeout_s)
        learner = Learner(lcfg, client=gated, model_dir=model_dir)
        gated.learner = learner
        workers = [start_worker(i, d, srv.address, model_dir, args, loaded, idle) for i, d in enumerate(worker_devices)]
        t_steps = time.perf_counter()
        learner.run()
        steps_s = time.perf_counter() - t_steps
        _stop_workers(args, learner, workers, loaded)
        client.close()
        learner.client.close()
    return report(args, learner, gated, workers, loaded, idle, run_dir, steps_s, time.perf_counter() - t0)


def report(
    args, learner, gated, workers, loaded, idle: dict[str, IdleClock], run_dir: Path, steps_s: float, total_s: float
) -> int:
    """Print the readings and the checks; returns 0 when every check passed, else 1."""
    import json

    import torch

    records = [json.loads(line) for line in (run_dir / "learner.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if "compute_s" in r]
    published = list(range(1, learner.version + 1))
    print(f"learner: {len(records)} steps in {steps_s:.1f} s (whole check {total_s:.1f} s), version {learner.version}")
    for key in ("wait_s", "compute_s", "publish_s", "checkpoint_s"):
        print(f"  {key:<13} mean {sum(r[key] for r in records) / max(1, len(records)):7.3f} s per step")
    tokens = sum(r["tokens"] for r in records)
    print(f"  tokens/s     {tokens / max(1e-9, sum(r['compute_s'] for r in records)):9.0f} (prompt + completion, compute time)")
    for name, worker, _ in workers:
        print(
            f"{name}: {_tokens_per_s(worker):9.0f} generated tokens/s, loaded versions {loaded[name]}, "
            f"{100 * idle[name].share():.1f}% of its wall time outside generation"
        )
    if torch.cuda.is_available() and args.device == "cuda":
        for i in range(torch.cuda.device_count()):
            print(f"cuda:{i}: peak memory {torch.cuda.max_memory_allocated(i) / 2**30:.2f} GiB (torch allocator)")
    failures = []
    if len(records) < args.steps:
        failures.append(f"the learner trained {len(records)} of {args.steps} steps")
    for name, vs in loaded.items():
        missing = [v for v in published if v not in vs]
        if missing:
            failures.append(f"{name} never loaded version(s) {missing}")
    if not gated.gaps:
        failures.append("no step-0 completions to compare log-probs on")
    else:
        mean, top = sum(gated.gaps) / len(gated.gaps), max(gated.gaps)
        ok = mean <= args.tol_mean and top <= args.tol_max
        print(
            f"step-0 log-probs, learner vs workers over {len(gated.gaps)} tokens: mean |Δ| {mean:.2e}, "
            f"max |Δ| {top:.2e} (tolerance {args.tol_mean:g} / {args.tol_max:g} nats): {'ok' if ok else 'FAILED'}"
        )
        if not ok:
            failures.append("step-0 log-probs differ beyond the tolerance")
    for f in failures:
        print(f"gpu_check: FAILED: {f}", file=sys.stderr)
    print("gpu_check: passed" if not failures else f"gpu_check: {len(failures)} check(s) failed")
    shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags; the defaults fit one GPU in well under 8 minutes."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cuda (the check) or cpu (plumbing dry-run, tiny sizes)"
    )
    p.add_argument(
        "--backend",
        choices=("auto", "transformers", "vllm"),
        default="auto",
        help="auto: vLLM when installed (cuda only), else transformers; vllm: vLLM on any device "
        "(--device cpu --backend vllm: vLLM's CPU build in .venv-vllm, make install-vllm)",
    )
    p.add_argument("--model-dir", help="directory with config.json and tokenizer files (default: the smollm2-135m alias cache)")
    p.add_argument("--steps", type=int, default=5, help="learner steps")
    p.add_argument("--problems", type=int, default=512, help="problems registered")
    p.add_argument("--group-size", type=int, default=None, help="G (default 8 on cuda, 4 on cpu)")
    p.add_argument("--batch-size", type=int, default=None, help="problems per lease (default 16 on cuda, 2 on cpu)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion tokens at most (default 64 on cuda, 8 on cpu)")
    p.add_argument("--batch-groups", type=int, default=None, help="groups per learner step (default 16 on cuda, 2 on cpu)")
    p.add_argument("--micro-batch-size", type=int, default=32, help="sequences per learner forward/backward")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="vLLM's share of its GPU")
    p.add_argument("--gate-timeout-s", type=float, default=120.0, help="longest wait for the workers to load a version")
    p.add_argument("--tol-mean", type=float, default=1e-3, help="largest mean |Δ log-prob| at step 0, nats")
    p.add_argument("--tol-max", type=float, default=2e-2, help="largest max |Δ log-prob| at step 0, nats")
    args = p.parse_args(argv)
    cpu = args.device == "cpu"
    for name, gpu, small in (("group_size", 8, 4), ("batch_size", 16, 2), ("max_new_tokens", 64, 8), ("batch_groups", 16, 2)):
        if getattr(args, name) is None:
            setattr(args, name, small if cpu else gpu)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m benchmarks.gpu_check [--device cpu]``."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    use_source_tree()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
