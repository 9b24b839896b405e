"""The worker's seam to the priority server: what :class:`~prioreplay.rollout_worker.worker.RolloutWorker`
calls on its client.

:class:`prioreplay.client.PriorityClient` is one; tests and other schedulers can pass anything with
these two methods (the learner's counterpart is :class:`prioreplay.learner.interfaces.LearnerClient`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.v1 import priority_service_pb2 as pb


class WorkerClient(Protocol):
    """Leases problems and takes their scored groups back."""

    def sample(
        self,
        batch_size: int,
        worker_id: str = "",
        lease_timeout_s: float = 0.0,
        client_source: int = 0,
        request_id: str | None = None,
        accepts_group_size: bool = False,
    ) -> pb.SampleProblemsResponse:
        """Lease up to ``batch_size`` problems for ``lease_timeout_s`` seconds (0: the server's
        default). An empty answer carries ``retry_after_s`` (and ``backpressure`` when the
        trajectory queue is full). ``accepts_group_size``: the caller generates
        ``LeasedProblem.group_size`` completions where it is set.

        Raises:
            StoreUnavailable: the server cannot be reached (after retries).
            FailedPrecondition: the server's sampler probes and ``accepts_group_size`` is False.
        """

    def report_lease(
        self,
        lease_id: str,
        outcomes: Sequence[pb.ProblemOutcome],
        worker_id: str = "",
        client_source: int = 0,
        rewards_only: bool = False,
        unservable: Sequence[str] = (),
        observe: Callable[[str, float], None] | None = None,
    ) -> pb.ReportOutcomesResponse:
        """Report a whole lease once, in parts when it does not fit one message; ``unservable``:
        ids of leased problems the model cannot serve; ``observe(method, seconds)`` after each RPC.
        Returns the answer summed over the parts (``accepted`` False: the lease had expired).

        Raises:
            PrioreplayError: a part could not be delivered (after retries).
        """
