"""The rollout worker loop: lease → (reload weights) → generate G per problem → verify → report.

One :meth:`RolloutWorker.run_once` is one lease, its steps in turn. :meth:`RolloutWorker.run`
pipelines them by default (``--pipeline``, :mod:`~prioreplay.rollout_worker.pipeline`): the next
lease is asked for, and the last batch verified and reported, while the backend generates, so the
engine does not wait on the service; ``--no-pipeline`` runs one lease after another. The steps:

1. ``SampleProblems(batch_size)``. An empty answer (nothing leasable) is returned as such; the
   loop sleeps ``retry_after_s`` (capped) before asking again.
2. If the lease names a policy version newer than the loaded one and a ``weights_uri``, the
   backend loads those weights first (seconds measured); a remote URI (``http(s)://``, ``s3://``)
   is fetched into the weights cache and checked against its manifest before. A checkpoint that cannot be loaded is
   logged and the batch is generated with the weights already loaded, reported under their
   (older) version, which the learner's staleness rule handles.
3. Each problem's prompt goes through the chat template; the backend samples G completions per
   problem from that problem's own seed, a hash of (``--seed``, worker id, lease id, problem id)
   (:mod:`~prioreplay.rollout_worker.seeds`): distinct across problems, leases, replicas and
   restarts; the same four values reproduce the same seed.
4. Every completion is scored by its problem's verifier, or by the ``--reward`` plugins
   (:mod:`prioreplay.rewards`, docs/REWARDS.md; their pass flags are reported too). Errors count
   as reward 0 and in ``prioreplay_worker_verifier_errors_total`` / ``..._reward_errors_total``;
   with ``--truncated-reward zero`` a completion cut at ``max_new_tokens`` is reported with
   reward 0 unverified, so the server and the learner see the same reward.
5. ``ReportOutcomes`` with rewards, the prompt's token ids, each completion's token ids and
   behaviour log-probs, and the policy version that generated the group. A report larger than the
   message limit (``--max-message-mb``, this worker's or, when the server refuses it, the
   server's) is sent in parts (``more_parts``), halved until each fits, so no generated group is
   thrown away; only a single group larger than the limit is left out (logged, naming the setting).
   The client does the splitting (:meth:`prioreplay.client.PriorityClient.report_lease`).

Only leases returned by ``SampleProblems`` are reported, each at most once.

This module is the loop (lease, reload, generate, report); step 4's scoring is
:mod:`.scoring`, the records one lease passes between threads are :mod:`.batch`, and the
``--outcomes-file`` writer is :mod:`.outcomes_file`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prioreplay import models
from prioreplay.channel import timed_call
from prioreplay.convert import leased_problems
from prioreplay.errors import InvalidArgument, PrioreplayError
from prioreplay.problems import ProblemRecord, problem_task
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.weights_transport import WeightsFetcher, WeightsFetchError

from .backends.base import GeneratedCompletion, GenerationBackend, PartialWeightsLoad, SamplingParams
from .batch import BatchResult, GeneratedBatch
from .config import WorkerConfig
from .interfaces import WorkerClient
from .metrics import WorkerMetrics
from .outcomes_file import append_outcomes
from .pipeline import PipelinedLoop
from .scoring import GroupScorer
from .seeds import problem_seed

log = logging.getLogger("prioreplay.worker")

T = TypeVar("T")


class RolloutWorker:
    """Leases problems from the priority server and reports scored groups of completions.

    Args:
        config: the worker configuration (group size, batch size, sampling, loop limits).
        backend: a loaded generation backend.
        client: a :class:`~prioreplay.rollout_worker.interfaces.WorkerClient`, e.g. a
            :class:`prioreplay.client.PriorityClient` (it retries UNAVAILABLE with backoff and
            splits reports too large for one message).
        metrics: where to count (default: a fresh registry).
        sleep: ``sleep(seconds)`` used between empty leases (tests pass a fake).
        fetcher: brings a remote ``weights_uri`` into the local cache (default: from the config's
            ``weights_cache_dir``, ``weights_cache_keep``, ``weights_fetch_timeout_s``).

    Attributes:
        stop_event: set it to end :meth:`run` after the current batch (the SIGTERM handler does).
        batches_done: leases generated and reported so far.
    """

    def __init__(
        self,
        config: WorkerConfig,
        backend: GenerationBackend,
        client: WorkerClient,
        metrics: WorkerMetrics | None = None,
        sleep: Callable[[float], None] | None = None,
        fetcher: WeightsFetcher | None = None,
    ):
        self.config = config
        self.backend = backend
        self.client = client
        self.metrics = metrics or WorkerMetrics()
        self.stop_event = threading.Event()
        self._sleep = sleep or (lambda s: self.stop_event.wait(s))
        self.batches_done = 0
        self.metrics.policy_version.set(backend.policy_version)
        self.fetcher = fetcher or weights_fetcher(config)
        self.scorer = GroupScorer(config, self.metrics)

    # -- plumbing -------------------------------------------------------------------------------
    def _rpc(self, method: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        out = timed_call(self._observe_rpc, method, fn, *args, **kwargs)
        self.metrics.pace_wait_seconds.inc(getattr(out, "pace_wait_s", 0.0))  # a lease the pace bound held
        return out

    def _observe_rpc(self, method: str, seconds: float) -> None:
        self.metrics.rpc_seconds.labels(method).observe(seconds)

    def sampling_params(self, prompt_seeds: Sequence[int] = ()) -> SamplingParams:
        """Sampling parameters of a ``generate`` call: the configured temperature, top-p, length
        and stop strings, with ``prompt_seeds`` (one per prompt; empty: the backend's own RNG)."""
        c = self.config
        return SamplingParams(c.temperature, c.top_p, c.max_new_tokens, tuple(c.stop), prompt_seeds=tuple(prompt_seeds))

    def problem_seeds(self, lease_id: str, problems: Sequence[ProblemRecord]) -> list[int]:
        """The generation seed of each problem of lease ``lease_id`` (:func:`~.seeds.problem_seed`)."""
        return [problem_seed(self.config.seed, self.config.worker_id, lease_id, p.id) for p in problems]

    def maybe_reload(self, version: int, weights_uri: str) -> float:
        """Load ``weights_uri`` if ``version`` is newer than the loaded one; returns seconds (0.0: none).

        A remote URI (``http(s)://``, ``s3://``, ...) is first fetched into the weights cache and
        checked against its manifest (:class:`~prioreplay.weights_transport.WeightsFetcher`); the
        seconds include the fetch. A checkpoint that cannot be fetched or loaded (unreachable,
        missing or pruned, partial, altered, mismatched) is logged; the loaded weights stay, 0.0 is
        returned, and the next lease naming a newer version tries again.

        Raises:
            PartialWeightsLoad: the backend applied only part of the version (the worker stops).
        """
        if version <= self.backend.policy_version or not weights_uri:
            return 0.0
        t0 = time.perf_counter()
        try:
            local = self.fetcher.local_uri(weights_uri, version)
            fetch_s = time.perf_counter() - t0
            seconds = fetch_s + self.backend.load_weights(local, version)
        except PartialWeightsLoad:
            raise  # mixed weights: never generate with them (run() stops the worker)
        except (InvalidArgument, WeightsFetchError) as e:
            log.error(
                "cannot load policy version %d from %s (%s); generating with version %d",
                version,
                weights_uri,
                e,
                self.backend.policy_version,
            )
            return 0.0
        self.metrics.weight_reload_seconds.observe(seconds)
        self.metrics.policy_version.set(version)
        log.info("loaded policy version %d from %s in %.2f s (fetch %.2f s)", version, weights_uri, seconds, fetch_s)
        return seconds

    # -- one lease ------------------------------------------------------------------------------
    def run_once(self) -> BatchResult:
        """Lease one batch, generate, verify and report it. See the module docstring.

        Raises:
            StoreUnavailable: the server could not be reached for the lease (after the client's
                retries); nothing is held. A report that cannot be delivered is logged and its
                lease left to expire (the result has ``reported=False``).
        """
        lease = self.lease()
        if not lease.problems:
            return self.empty_result(lease)
        reload_s = self.maybe_reload(lease.policy_version, lease.weights_uri)
        return self.finish(self.generate_lease(lease, reload_s))

    def lease(self) -> pb.SampleProblemsResponse:
        """``SampleProblems(batch_size)`` for this worker (step 1), timed in ``rpc_seconds``.

        Raises:
            StoreUnavailable: the server could not be reached (after the client's retries).
        """
        c = self.config
        return self._rpc(
            "SampleProblems",
            self.client.sample,
            c.batch_size,
            worker_id=c.worker_id,
            lease_timeout_s=c.requested_lease_s,
            client_source=pb.CLIENT_SOURCE_WORKER,
            accepts_group_size=True,
        )

    def empty_result(self, lease: pb.SampleProblemsResponse) -> BatchResult:
        """The result of an empty lease: its retry hint (1 s when none; ``paced``: 0, at once); backpressure logged."""
        if lease.backpressure:
            self.metrics.backpressure_waits.inc()
            log.info(
                "the server applies backpressure (its trajectory queue is full: the learner is behind); waiting %.1f s",
                lease.retry_after_s,
            )
        retry = lease.retry_after_s if lease.paced else lease.retry_after_s or 1.0  # paced: 0, ask again at once
        return BatchResult(retry_after_s=retry, backpressure=lease.backpressure)

    def release(self, lease: pb.SampleProblemsResponse) -> None:
        """Hand an unused lease back at once: a report with no outcomes ends it, and its problems
        return to where they were with unchanged statistics (as on expiry, without the wait).
        A release that cannot be delivered is logged; the lease then expires on the server."""
        try:
            self.report(lease.lease_id, [])
        except PrioreplayError as e:
            log.warning("lease %s could not be released (%s); it expires on the server", lease.lease_id[:8], e)

    def generate_lease(self, lease: pb.SampleProblemsResponse, reload_s: float = 0.0) -> GeneratedBatch:
        """Generate a lease's groups with the loaded weights (step 3; the caller reloads first).

        Args:
            lease: a non-empty ``SampleProblems`` answer.
            reload_s: seconds the caller spent loading this lease's weights (recorded).
        """
        batch = self._generate(leased_problems(lease, self.config.group_size), lease.lease_id)
        batch.lease, batch.reload_s = lease, reload_s
        return batch

    def finish(self, batch: GeneratedBatch) -> BatchResult:
        """Verify, convert and report a generated lease (steps 4-5); safe on another thread than
        the one that generates (it does not touch the backend's model).

        A report that cannot be delivered is logged and its lease left to expire (``reported=False``).
        """
        lease = batch.lease
        outcomes, result = self.scorer.score_batch(batch)
        result.update(lease_id=lease.lease_id, problems=len(lease.problems), retry_after_s=lease.retry_after_s)
        try:
            resp = self.report(lease.lease_id, outcomes, batch.unservable)
        except PrioreplayError as e:
            log.error("report of lease %s failed (%s); its problems return when the lease expires", lease.lease_id, e)
            return BatchResult(**result)
        self.metrics.batches.inc()
        self._log_report(lease.lease_id, resp, len(outcomes), result)
        if resp.accepted and self.config.outcomes_file is not None:
            tasks = [problem_task(p) for p, _ in batch.leased]
            append_outcomes(self.config.outcomes_file, self.config.worker_id, lease.lease_id, outcomes, tasks)
        return BatchResult(
            reported=True,
            accepted=resp.accepted,
            reason=resp.reason,
            groups_queued=resp.groups_queued,
            groups_filtered=resp.groups_filtered,
            **result,
        )

    def _log_report(self, lease_id: str, resp: pb.ReportOutcomesResponse, groups: int, result: dict[str, Any]) -> None:
        if not resp.accepted:
            log.warning(
                "lease %s not accepted (%s): generation took %.1f s; consider a longer --requested-lease-s",
                lease_id,
                resp.reason,
                result["generation_s"],
            )
        log.info(
            "lease %s: %d problems × G≤%d, %d tokens in %.2f s (%.0f tok/s), mean reward %.3f, queued %d, v%d",
            lease_id[:8],
            groups,
            self.config.group_size,
            result["tokens"],
            result["generation_s"],
            result["tokens"] / max(result["generation_s"], 1e-9),
            result["reward_mean"],
            resp.groups_queued,
            result["policy_version"],
        )

    def generate_batch(
        self, leased: list[tuple[ProblemRecord, int]], lease_id: str
    ) -> tuple[list[pb.ProblemOutcome], list[str], dict[str, Any]]:
        """Generate, verify and convert one lease's groups (steps 3-4 of the module docstring).

        Args:
            leased: each leased problem with its group size (:func:`prioreplay.convert.leased_problems`).
            lease_id: the lease's id, mixed into each problem's seed (:meth:`problem_seeds`).

        Returns:
            (outcomes to report, ids of unservable problems, the :class:`BatchResult` fields
            ``completions``, ``tokens``, ``reward_mean``, ``policy_version``, ``generation_s``,
            ``verification_s``, ``unservable``). Advances :attr:`batches_done`.
        """
        batch = self._generate(leased, lease_id)
        outcomes, result = self.scorer.score_batch(batch)
        return outcomes, batch.unservable, result

    def _generate(self, leased: list[tuple[ProblemRecord, int]], lease_id: str) -> GeneratedBatch:
        """Chat template, context check and generation of one lease (advances :attr:`batches_done`)."""
        version = self.backend.policy_version
        prompts = [models.apply_chat_template(self.backend.tokenizer, p.prompt) for p, _ in leased]
        leased, prompts, unservable = self._servable(leased, prompts)
        t0 = time.perf_counter()
        seeds = self.problem_seeds(lease_id, [p for p, _ in leased])
        groups = self.generate_groups(prompts, [size for _, size in leased], seeds) if prompts else []
        generation_s = time.perf_counter() - t0
        self.batches_done += 1
        return GeneratedBatch(leased, prompts, groups, unservable, version, generation_s)

    def report(
        self, lease_id: str, outcomes: Sequence[pb.ProblemOutcome], unservable: Sequence[str] = ()
    ) -> pb.ReportOutcomesResponse:
        """Report a lease's outcomes (:meth:`WorkerClient.report_lease`: in parts when one message
        would be too large), each part timed in ``prioreplay_worker_rpc_seconds{method="ReportOutcomes"}``.

        Raises:
            PrioreplayError: a part could not be delivered (after the client's retries).
        """
        return self.client.report_lease(
            lease_id,
            outcomes,
            worker_id=self.config.worker_id,
            client_source=pb.CLIENT_SOURCE_WORKER,
            unservable=unservable,
            observe=self._observe_rpc,
        )

    def _servable(
        self, leased: list[tuple[ProblemRecord, int]], prompts: list[list[int]]
    ) -> tuple[list[tuple[ProblemRecord, int]], list[list[int]], list[str]]:
        """Split a lease into the problems the model can serve and the ids of those it cannot: a
        prompt (after the chat template) of at least the backend's ``max_context_tokens`` leaves no
        room for one generated token (vLLM refuses it and the worker would die on it). Those are
        logged, counted and reported unservable, so the server quarantines them."""
        limit = self.backend.max_context_tokens
        if not limit:
            return leased, prompts, []
        keep, keep_prompts, unservable = [], [], []
        for item, ids in zip(leased, prompts, strict=True):
            if len(ids) >= limit:
                log.warning(
                    "problem %s: its prompt is %d tokens, the model's context %d; reported unservable "
                    "(quarantined until registered again with a shorter prompt)",
                    item[0].id,
                    len(ids),
                    limit,
                )
                self.metrics.unservable_problems.inc()
                unservable.append(item[0].id)
            else:
                keep.append(item)
                keep_prompts.append(ids)
        return keep, keep_prompts, unservable

    def generate_groups(
        self, prompts: list[list[int]], sizes: list[int], seeds: Sequence[int] = ()
    ) -> list[list[GeneratedCompletion]]:
        """One group per prompt, of ``sizes[i]`` completions (the lease's ``group_size``, else G):
        one ``backend.generate`` call per distinct size, results back in lease order.

        Args:
            prompts: the B prompts as token ids (after the chat template).
            sizes: completions per prompt, each >= 1.
            seeds: each prompt's seed (:meth:`problem_seeds`); empty: the backend's own RNG.
        """
        groups: list[list[GeneratedCompletion]] = [[] for _ in prompts]
        for size in sorted(set(sizes), reverse=True):
            where = [i for i, s in enumerate(sizes) if s == size]
            params = self.sampling_params([seeds[i] for i in where] if seeds else ())
            for i, group in zip(where, self.backend.generate([prompts[i] for i in where], size, params), strict=True):
                groups[i] = group
        probes = sum(1 for s in sizes if s < self.config.group_size)
        if probes:
            self.metrics.probes.inc(probes)
        return groups

    # -- the loop -------------------------------------------------------------------------------
    def wait_out(self, e: PrioreplayError) -> None:
        """A lease or report failed: INVALID_ARGUMENT (our request is wrong: retrying cannot help) is
        raised again; anything else (an unreachable server after the client's retries) is logged
        and waited out for ``max_retry_sleep_s`` seconds. Both loops (sequential, pipelined) use it."""
        if isinstance(e, InvalidArgument):
            raise e
        log.warning("priority server: %s; retrying in %.1f s", e, self.config.max_retry_sleep_s)
        self._sleep(self.config.max_retry_sleep_s)

    def run(self) -> int:
        """Lease and report until ``max_batches`` reports or :attr:`stop_event`; returns exit code 0.

        An unreachable server (after the client's retries) is logged and retried after
        ``max_retry_sleep_s``; empty leases sleep the server's ``retry_after_s`` (capped).
        With ``pipeline`` (the default) the next lease is asked for, and each batch verified and
        reported, while the next one generates (:class:`~prioreplay.rollout_worker.pipeline.PipelinedLoop`);
        without it, :meth:`run_once` follows :meth:`run_once`.
        """
        if self.config.pipeline:
            return PipelinedLoop(self).run()
        c = self.config
        while not self.stop_event.is_set():
            if c.max_batches and self.batches_done >= c.max_batches:
                break
            try:
                res = self.run_once()
            except PrioreplayError as e:
                self.wait_out(e)
                continue
            if not res.lease_id:
                self._sleep(min(res.retry_after_s, c.max_retry_sleep_s))
        log.info("stopping after %d batches", self.batches_done)
        return 0


def weights_fetcher(config: WorkerConfig) -> WeightsFetcher:
    """The fetcher of remote weights a worker with ``config`` uses (cache: ``weights_cache_dir``,
    default ``CACHE_DIR/weights`` under the model cache)."""
    cache = config.weights_cache_dir or (config.cache_dir or models.default_cache_dir()) / "weights"
    return WeightsFetcher(cache, keep=config.weights_cache_keep, timeout_s=config.weights_fetch_timeout_s)
