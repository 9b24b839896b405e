"""The leases a :class:`~prioreplay.integrations.torch.PrioritySampler` holds, and its saved state.

A :class:`Lease` buffers the rewards of its problems until every group is complete (a lease is
reported once, whole). :func:`leases_from_state` checks a saved ``state_dict()`` against the
sampler that loads it and returns its leases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prioreplay.errors import InvalidArgument

#: Version of the :meth:`PrioritySampler.state_dict` layout.
STATE_VERSION = 1
#: The batch geometry a saved state must share with the sampler that loads it.
GEOMETRY = ("batch_size", "group_size", "repeat_each", "repeat_batch")


@dataclass
class Lease:
    """A lease this sampler holds: its problems, and the rewards received so far per problem."""

    lease_id: str
    problem_ids: list[str]
    policy_version: int = 0
    rewards: dict[str, list[float]] = field(default_factory=dict)  # finite rewards, in arrival order
    slots: dict[str, int] = field(default_factory=dict)  # completions seen (None rewards included)
    sizes: dict[str, int] = field(default_factory=dict)  # LeasedProblem.group_size where the server set it
    passed: dict[str, list[bool]] = field(default_factory=dict)  # pass flags, one per reward, where the caller gave them

    def size(self, pid: str, group_size: int) -> int:
        """Completions that complete ``pid``'s group: the server's per-problem size, else ``group_size``."""
        return self.sizes.get(pid, group_size)

    def complete(self, group_size: int) -> bool:
        return all(self.slots.get(p, 0) >= self.size(p, group_size) for p in self.problem_ids)

    def to_state(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "problem_ids": list(self.problem_ids),
            "policy_version": self.policy_version,
            "rewards": {k: list(v) for k, v in self.rewards.items()},
            "slots": dict(self.slots),
            "sizes": dict(self.sizes),
            "passed": {k: list(v) for k, v in self.passed.items()},
        }

    @classmethod
    def from_state(cls, d: Mapping) -> Lease:
        return cls(
            lease_id=str(d["lease_id"]),
            problem_ids=[str(p) for p in d["problem_ids"]],
            policy_version=int(d.get("policy_version", 0)),
            rewards={str(k): [float(x) for x in v] for k, v in d.get("rewards", {}).items()},
            slots={str(k): int(v) for k, v in d.get("slots", {}).items()},
            sizes={str(k): int(v) for k, v in d.get("sizes", {}).items()},
            passed={str(k): [bool(x) for x in v] for k, v in d.get("passed", {}).items()},
        )


def leases_from_state(
    state: Mapping[str, Any], fingerprint: str, geometry: Mapping[str, int], index_of: Mapping[str, int]
) -> list[Lease]:
    """The leases of a saved sampler ``state``, after checking it fits the sampler loading it.

    Args:
        state: a ``PrioritySampler.state_dict()``.
        fingerprint: the loading sampler's ``ProblemTable.fingerprint``.
        geometry: its value of each :data:`GEOMETRY` key.
        index_of: its problem id -> dataset index.

    Raises:
        InvalidArgument: the state is of another layout version, dataset (fingerprint) or batch
            geometry, or names a problem that is not in the dataset.
    """
    if state.get("version") != STATE_VERSION:
        raise InvalidArgument(f"sampler state version {state.get('version')!r} is not {STATE_VERSION}")
    if state.get("fingerprint") != fingerprint:
        raise InvalidArgument(
            f"the sampler state is for dataset {state.get('fingerprint')!r}, this sampler's "
            f"dataset is {fingerprint!r}: resume with the same data and ids"
        )
    for key in GEOMETRY:
        if state.get(key) != geometry[key]:
            raise InvalidArgument(
                f"the sampler state has {key}={state.get(key)!r}, this sampler "
                f"{geometry[key]!r}: resume with the same batch geometry"
            )
    leases = [Lease.from_state(d) for d in state.get("leases", [])]
    unknown = [p for lease in leases for p in lease.problem_ids if p not in index_of]
    if unknown:
        raise InvalidArgument(f"the sampler state names problem {unknown[0]!r}, which is not in this dataset")
    return leases
