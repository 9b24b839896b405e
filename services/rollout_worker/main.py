"""``prioreplay worker``: load the model, serve /metrics, lease → generate → verify → report until stopped."""

from __future__ import annotations

import _thread
import logging
import threading

from prioreplay.process import on_stop_signal, setup_logging

from .config import WorkerConfig

log = logging.getLogger("prioreplay.worker")


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; other values pass through."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_backend(config: WorkerConfig):
    """Resolve the model and build the configured backend (transformers or vllm).

    Raises:
        InvalidArgument: the model cannot be resolved or loaded; vllm is not installed.
    """
    from prioreplay.models import resolve_model

    from .backends import create_backend

    model_dir = resolve_model(config.model, config.cache_dir)
    if config.backend == "vllm":
        return create_backend(
            "vllm",
            model_dir,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            # the learner's float32 unless asked: vLLM's own "auto" is the checkpoint's dtype (bfloat16 for
            # SmolLM2), which samples from another distribution than the learner's recompute
            dtype="float32" if config.dtype == "auto" else config.dtype,
        )
    import torch

    return create_backend(
        "transformers",
        model_dir,
        device=resolve_device(config.device),
        max_batch_sequences=config.max_batch_sequences,
        dtype=None if config.dtype == "auto" else getattr(torch, config.dtype),
    )


def serve_metrics(config: WorkerConfig):
    """Start the worker's /metrics server; returns (metrics, server or None when the port is 0).

    Raises:
        InvalidArgument: the port is taken.
    """
    from prioreplay.errors import InvalidArgument

    from .metrics import WorkerMetrics

    metrics = WorkerMetrics()
    try:
        return metrics, metrics.serve(config.metrics_port)
    except OSError as e:
        raise InvalidArgument(
            f"cannot serve /metrics on port {config.metrics_port} ({e.strerror}); "
            "give each worker its own --metrics-port, or 0 to disable"
        ) from None


def stop_after_batch_on_signal(worker, grace_s: float) -> list[threading.Timer]:
    """On SIGTERM/SIGINT let ``worker`` finish its batch, interrupting it after ``grace_s`` seconds.

    Returns the list the grace timers are appended to (cancel them when the worker returns).
    """
    timer: list[threading.Timer] = []

    def _give_up() -> None:
        log.warning(
            "the batch did not finish within batch_grace_s=%.1f s; stopping without reporting (the lease expires)", grace_s
        )
        _thread.interrupt_main()

    def _stop(signum: int) -> None:
        log.info("signal %d: finishing the current batch (at most %.1f s), then stopping", signum, grace_s)
        worker.stop_event.set()
        t = threading.Timer(grace_s, _give_up)
        t.daemon = True
        t.start()
        timer.append(t)

    on_stop_signal(_stop)
    return timer


def run(config: WorkerConfig) -> int:
    """Run a rollout worker process; returns the exit code (0 after a clean stop).

    SIGTERM/SIGINT: the batch in progress is finished and reported, then the worker exits 0. If
    it is not done within ``batch_grace_s`` seconds (or on a second signal) the worker stops at once
    without reporting: the lease expires on the server and its problems return unchanged.

    Raises:
        InvalidArgument: bad model, backend or server settings; a ``--reward`` plugin that cannot be imported.
        StoreUnavailable: never at start-up; an unreachable server is retried.
    """
    setup_logging(config.log_level)
    rewards = config.reward_set()
    rewards.check_imports()  # a plugin that cannot be imported stops the worker before the model loads
    if not rewards.only_verifier:
        log.info(
            "rewards: %s (pass threshold %g)", ", ".join(f"{s.name}×{s.weight:g}" for s in rewards.specs), rewards.pass_threshold
        )
    from prioreplay.devices import claim_for_role

    # GPU(s) of this replica, before torch/vLLM touch CUDA; held until the process exits.
    claim_for_role(config, "worker", config.tensor_parallel_size if config.backend == "vllm" else 1, config.device)
    from prioreplay.client import PriorityClient

    from .worker import RolloutWorker

    metrics, server = serve_metrics(config)  # before the model loads, so a taken port fails at once
    backend = build_backend(config)
    log.info(
        "worker %s: %s backend, policy version %d, G=%d, B=%d",
        config.worker_id,
        config.backend,
        backend.policy_version,
        config.group_size,
        config.batch_size,
    )
    if server is not None:
        log.info("metrics on :%d/metrics", config.metrics_port)
    client = PriorityClient(config)
    worker = RolloutWorker(config, backend, client, metrics)
    timer = stop_after_batch_on_signal(worker, config.batch_grace_s)
    metrics.readiness.set()  # the model is loaded (converted): /ready answers 200, the worker leases now
    try:
        return worker.run()
    except KeyboardInterrupt:
        log.warning("stopped during a batch; its lease expires on the server")
        return 0 if worker.stop_event.is_set() else 130
    finally:
        for t in timer:
            t.cancel()
        client.close()
        if server is not None:
            server.shutdown()
