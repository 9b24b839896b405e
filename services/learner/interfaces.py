"""The learner's two seams: where trajectory groups come from and where new policy versions are announced.

:class:`prioreplay.client.PriorityClient` is both (the priority server's trajectory queue and its
policy pointer); tests and other trainers can pass anything with these methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.v1 import priority_service_pb2 as pb


class TrajectorySource(Protocol):
    """Trajectory groups with at-least-once delivery: pull, train, then acknowledge."""

    def pull(
        self,
        max_groups: int,
        wait_s: float = 0.0,
        consumer: str = "learner",
        include_own_pending: bool = False,
        batch_groups: int = 0,
    ) -> pb.PullTrajectoriesResponse:
        """Up to ``max_groups`` groups, waiting up to ``wait_s`` seconds for the first; with
        ``include_own_pending`` this consumer's unacknowledged groups come back first.
        ``batch_groups``: the learner's batch in groups (the server's pace bound counts it)."""

    def ack(self, group_ids: Sequence[str]) -> pb.AckTrajectoriesResponse:
        """Acknowledge groups after the optimizer step that used them (never delivered again)."""


class WeightPublisher(Protocol):
    """Announces the weights of a new policy version, written where workers can read them."""

    def publish(self, version: int, weights_uri: str) -> pb.PublishPolicyResponse:
        """Make ``version`` (weights at ``weights_uri``) current; versions never go backwards.

        Raises:
            FailedPrecondition: ``version`` is older than the current one.
        """

    def stats(self, histogram_buckets: int = 10) -> pb.GetStatsResponse:
        """The server's statistics; the learner reads ``policy_version``, the newest published."""


class LearnerClient(TrajectorySource, WeightPublisher, Protocol):
    """Both seams in one object, as :class:`prioreplay.client.PriorityClient` provides them."""

    def close(self) -> None:
        """Release the channel (``prioreplay learner`` calls it on the way out)."""
