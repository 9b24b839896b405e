"""``prioreplay learner``: resume, train until ``max_steps`` or SIGTERM/SIGINT, publish the last step.

Under ``torchrun`` (K ranks) rank 0 is the learner a single process is (feed, /metrics, log
file, publishing, checkpoints); the other ranks train their shard of each batch
(:mod:`prioreplay.learner.distributed`).
"""

from __future__ import annotations

import logging
import os

from prioreplay.process import on_stop_signal, setup_logging

from .config import LearnerConfig

log = logging.getLogger("prioreplay.learner")


def run(config: LearnerConfig) -> int:
    """Run the learner process; returns the exit code (0 after a clean stop).

    SIGTERM and SIGINT ask the learner to stop, at any point from its start: it finishes the step
    in progress (optimizer step, ack, checkpoint), publishes the last step if it was not yet, and
    exits 0. A stop that takes longer than ``stop_grace_s`` (a slow step, a slow disk), or a second
    signal, abandons the step at once and exits 0 as well: its groups were not acknowledged and come
    back on the next start. A signal during the model load stops the learner before its first step.

    An unavailable server or store (UNAVAILABLE after the client's retries, or INTERNAL) is logged
    and waited out with backoff (``max_retry_sleep_s``); the learner does not exit on it.

    Raises:
        InvalidArgument: the model cannot be loaded, or LoRA is asked for without peft.
    """
    setup_logging(config.log_level)
    if _other_rank():  # a rank > 0 of a torchrun job: rank 0 stops the job (_run_rank)
        return _run(config, [], [])
    learners: list = []  # the Learner once built: a stop signal before that is kept in `asked`
    asked: list[int] = []

    def _stop(signum: int) -> None:
        log.info("signal %d: finishing the current step (at most %.0f s), then stopping", signum, config.stop_grace_s)
        asked.append(signum)
        for learner in learners:
            learner.stop_requested = True

    cancel_grace = on_stop_signal(_stop, config.stop_grace_s, "the learner's step in progress")  # before the imports
    try:
        return _run(config, learners, asked)
    except KeyboardInterrupt:
        if not asked:
            raise
        log.warning("stopped without finishing the step in progress; its groups come back on the next start")
        return 0
    finally:
        cancel_grace()


def _other_rank() -> bool:
    """Whether this process is a rank > 0 of a torchrun job (torchrun's ``WORLD_SIZE``, ``RANK``;
    read here without importing torch, as :func:`~.distributed.from_env` does)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and int(os.environ.get("RANK", "0") or 0) > 0


def _run(config: LearnerConfig, learners: list, asked: list[int]) -> int:
    """:func:`run` once its stop signal is installed: build the learner, train, shut down."""
    from prioreplay.devices import claim_for_role

    from . import distributed

    dist = distributed.from_env()  # None outside torchrun
    if dist is not None and not dist.is_main:
        return _run_rank(config, dist)
    # Exactly learner_gpus, before torch touches CUDA; held until the process exits.
    claim_for_role(config, "learner", 0, config.device)
    from .learner import Learner

    metrics = _metrics(config)
    server = _serve_metrics(metrics, config.metrics_port)  # before the model loads: health checks and scrapes answer
    weights_server, config = serve_weights(config)
    try:
        learner = Learner(config, metrics=metrics, dist=dist)
    except BaseException:
        _shutdown(server, weights_server, close=True)
        raise
    learners.append(learner)
    learner.stop_requested = bool(asked)  # a signal while the model loaded: stop before the first step
    log.info(
        "learner: model %s, %d groups per step, checkpoints in %s; waiting for trajectory groups from %s",
        config.model,
        config.batch_groups,
        config.checkpoint_dir,
        config.server,
    )
    if server is not None:
        log.info("metrics on :%d/metrics", config.metrics_port)
    finished = False
    try:
        code = learner.run()
        finished = True
        return code
    finally:
        learner.client.close()
        if dist is not None:
            dist.close(finished)
        _shutdown(server, weights_server)


def _metrics(config: LearnerConfig):
    """The learner's metrics: Prometheus, the JSON lines of ``--log-file`` and the ``--report-to``
    targets (TensorBoard, wandb) under ``--report-dir`` (default CHECKPOINT_DIR/reports)."""
    from prioreplay.reporting import open_reporter

    from .metrics import LearnerMetrics

    report = open_reporter(
        config.report_to,
        config.report_dir or config.checkpoint_dir / "reports",
        "learner",
        config.model_dump(mode="json", exclude={"auth_token"}),
    )
    return LearnerMetrics(config.log_file, reporter=report)


def _serve_metrics(metrics, port: int):
    """Serve ``metrics`` on /metrics at ``port`` (0: not served, None returned); a taken port
    fails at once.

    Raises:
        InvalidArgument: the port is taken.
    """
    from prioreplay.errors import InvalidArgument

    try:
        return metrics.serve(port)
    except OSError as e:
        raise InvalidArgument(
            f"cannot serve /metrics on port {port} ({e.strerror}); choose another --metrics-port, or 0 to disable"
        ) from None


def _shutdown(*servers, close: bool = False) -> None:
    """Stop each HTTP server that is not None (and, with ``close``, release its socket)."""
    for s in servers:
        if s is not None:
            s.shutdown()
            if close:
                s.server_close()


def serve_weights(config: LearnerConfig):
    """With ``serve_weights_port``: serve the publish directory over HTTP
    (:func:`prioreplay.weights_transport.serve_published`) and return (server, the config with
    ``weights_base_url`` set to where it is reached, unless one was given); else (None, config).

    Raises:
        InvalidArgument: the port is taken or the host cannot be bound.
    """
    if not config.serve_weights_port:
        return None, config
    from prioreplay.errors import InvalidArgument
    from prioreplay.weights_transport import advertised_url, serve_published

    try:
        server = serve_published(config.publish_root(), config.serve_weights_host, config.serve_weights_port)
    except OSError as e:
        raise InvalidArgument(
            f"cannot serve weights on {config.serve_weights_host}:{config.serve_weights_port} "
            f"({e.strerror}); choose another --serve-weights-port or --serve-weights-host"
        ) from None
    url = config.weights_base_url or advertised_url(config.serve_weights_host, server.server_address[1])
    log.info("published versions served at %s/v-N/", url)
    return server, config.model_copy(update={"weights_base_url": url})


def _run_rank(config: LearnerConfig, dist) -> int:
    """A rank > 0 of a torchrun job: no feed, no client, no /metrics, no log file; it trains its
    shard of rank 0's groups and stops when rank 0 says so (a signal here only logs a line:
    torchrun signals every rank, and rank 0 finishes the step and stops the others)."""
    from . import distributed
    from .learner import Learner
    from .metrics import LearnerMetrics

    if dist.local_rank > 0:
        distributed.follow_claim(config, config.device)
    else:  # local rank 0 of another node claims that node's learner GPUs
        from prioreplay.devices import claim_for_role

        claim_for_role(config, "learner", 0, config.device)
    learner = Learner(config, metrics=LearnerMetrics(None), dist=dist, feed=None)
    on_stop_signal(lambda signum: log.info("rank %d: signal %d; rank 0 stops the job", dist.rank, signum))
    code = learner.run()  # an error leaves at once: torchrun restarts the job
    dist.close()
    return code
