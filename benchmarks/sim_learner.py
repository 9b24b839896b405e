"""The simulator's learners: what happens to the groups a run generates.

Two models of the learn side, a setting of the simulation (``run_one(..., system=...)``):

* :class:`SyncLearner` (``system=None``, every figure made before the real learner's model): one
  optimizer step per generation batch that has a mixed group, or, with dynamic sampling (DAPO,
  Yu et al. 2025, arXiv 2503.14476), per B mixed groups gathered over batches; a step's update
  of a group is its ω̂ (an SGD step: a step with more mixed groups moves the policy more).
* :class:`SystemLearner` (``system=SystemModel(...)``), the real system as ``services/learner``
  runs it: reported groups wait in a trajectory queue (the server's stream, oldest first); the
  learner takes ``batch_groups`` of them a step, drops those more than ``max_staleness`` policy
  versions old (counted, not replaced) and trains on the rest; a step lasts ``step_time`` (in
  the time one lease takes to generate), and with ``prefetch`` the next batch is pulled while a
  step computes. Generation runs ahead of it unless paced: with ``pace`` K a lease is cut to
  the room the groups queued and never pulled leave under K learner batches, as the store cuts
  it (:meth:`SystemModel.lease_room`, the store's ``pace_room``). The optimizer is Adam-like (:class:`StepNorm`): the step is
  scaled by the running root mean square of the step sizes, so its size hardly depends on how
  many groups are mixed; updates along a shared skill still add up over a step's groups.

Zero-variance groups are queued and trained (zero advantages, their completions counted in the
step's token mean) only for arms with ``Method.dilute`` (plain GRPO; ``heap-grpo``); every other
arm's server counts them and does not queue them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from benchmarks.sim_population import Population
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.pace import pace_room


def group_updates(
    groups: list[tuple[float, ...]], sizes: np.ndarray, G: int, train_probes: bool, dilute: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Which groups train (mixed, (b,) bool) and each group's update size ((b,), ω̂ · g_j / G)."""
    phat = np.array([sum(g) / len(g) for g in groups])  # (b,)
    omega = phat * (1.0 - phat)  # (b,) empirical priority ω̂
    mixed = omega > 0
    if not train_probes:
        mixed &= sizes == G
    # a group's update scales with its completions (token-mean loss): ω̂ · g_j / G
    update = omega * sizes / G
    if dilute:  # zero-variance groups dilute the step (token mean over the whole batch)
        update = update * (sizes[mixed].sum() / sizes.sum())
    return mixed, update


@dataclass
class SyncLearner:
    """The learn side of one synchronous run: one optimizer step per batch with a mixed group, or
    (dynamic sampling) per ``batch_size`` mixed groups gathered over batches."""

    pop: Population
    batch_size: int
    dynamic_sampling: bool
    steps: int = 0
    trained_rollouts: int = 0
    buf_idx: list[np.ndarray] = field(default_factory=list)  # dynamic sampling: mixed groups waiting
    buf_omega: list[np.ndarray] = field(default_factory=list)

    def learn(self, idx: np.ndarray, sizes: np.ndarray, mixed: np.ndarray, update: np.ndarray) -> None:
        """Train on a batch's mixed groups: problem ids ``idx``, group sizes, mask and updates, each (B,)."""
        if self.dynamic_sampling:
            self.buf_idx.append(idx[mixed])
            self.buf_omega.append(update[mixed])
            self.trained_rollouts += int(sizes[mixed].sum())
            if sum(a.size for a in self.buf_idx) >= self.batch_size:
                B = self.batch_size
                self.pop.train(np.concatenate(self.buf_idx)[:B], np.concatenate(self.buf_omega)[:B])
                self.steps += 1
                self.buf_idx, self.buf_omega = [], []
        elif mixed.any():
            self.pop.train(idx[mixed], update[mixed])
            self.trained_rollouts += int(sizes[mixed].sum())
            self.steps += 1


@dataclass(frozen=True)
class SystemModel:
    """The real learner and its pace, in the simulator's units (time: one lease's generation).

    Attributes:
        batch_groups: groups per learner step (the learner's ``--batch-groups``).
        lease_size: problems per lease (the worker's ``--batch-size`` B); one worker, which leases
            its next batch when it has reported the last.
        step_time: a learner step's duration in lease generation times: the workers generate
            ``step_time · lease_size`` groups per step when nothing holds them back (the first real
            comparison: about 16 groups per step of 4, so 2.0 with leases of 8).
        max_staleness: a group more than this many policy versions older than the learner's is
            dropped when its batch is filtered (the learner's ``--max-staleness``).
        pace: K, the store's pace bound (``--pace-batches``; :meth:`lease_room`): a lease takes at
            most K · batch_groups − (groups queued and never pulled) problems, none when that is
            below 1; None: generation is not paced.
        prefetch: the next batch is pulled while a step computes (the learner's ``--prefetch``).
        adam: γ in [0, 1], how far a step's size is normalised (:class:`StepNorm`): 0 SGD, 1 Adam.
        beta2: the running mean's decay of the squared step sizes (AdamW's β₂).

    Raises:
        ValueError: a count below 1, a time <= 0, ``adam`` outside [0, 1] or ``beta2`` outside [0, 1).
    """

    batch_groups: int = 4
    lease_size: int = 8
    step_time: float = 2.0
    max_staleness: int = 4
    pace: int | None = None
    prefetch: bool = True
    adam: float = 1.0
    beta2: float = 0.999

    def __post_init__(self) -> None:
        if self.batch_groups < 1 or self.lease_size < 1 or (self.pace is not None and self.pace < 1):
            raise ValueError(
                f"batch_groups ({self.batch_groups}), lease_size ({self.lease_size}) and pace ({self.pace}) must be >= 1"
            )
        if not self.step_time > 0 or self.max_staleness < 0:
            raise ValueError(f"step_time ({self.step_time}) must be > 0 and max_staleness ({self.max_staleness}) >= 0")
        if not (0.0 <= self.adam <= 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"adam ({self.adam}) must be in [0, 1] and beta2 ({self.beta2}) in [0, 1)")

    def lease_room(self, undelivered: int) -> int:
        """The problems the next lease may take with ``undelivered`` groups queued and never pulled:
        the store's own rule (``store.pace.pace_room``: min(lease_size, K·b − ahead), ahead =
        undelivered groups + problems in live leases, none here: the one simulated worker asks only
        when its lease is reported); ``lease_size`` without a bound. Below 1: no lease now."""
        if self.pace is None:
            return self.lease_size
        bound = StoreConfig(pace_batches=self.pace, pace_batch_groups=self.batch_groups)
        return pace_room(bound, self.lease_size, lambda: undelivered, self.batch_groups)


class StepNorm:
    """Adam's step-size normalisation reduced to one number per step.

    The step's raw update u (one ω̂-sized entry per group) is scaled by (v̂)^(−γ/2), v̂ the
    bias-corrected running mean (decay β₂) of |u|² / 0.25² (0.25: the largest ω̂). γ = 1: the
    step's size is that of the run's typical step, whatever the gradient's scale (so the token
    mean's dilution by zero-variance groups cancels, and a step with more mixed groups moves the
    policy about as far as one with fewer, its groups sharing it); updates of a shared skill
    still add up within a step. γ = 0: SGD, the update as it is. Per-coordinate Adam and momentum
    are not modelled.
    """

    def __init__(self, power: float, beta2: float) -> None:
        self.power, self.beta2 = power, beta2
        self.v, self.t = 0.0, 0

    def scale(self, update: np.ndarray) -> float:
        """The factor for one step's raw update ``update`` ((b,)); updates the running mean."""
        if self.power == 0.0:
            return 1.0
        self.t += 1
        self.v = self.beta2 * self.v + (1.0 - self.beta2) * float(np.sum(update**2)) / 0.25**2
        vhat = self.v / (1.0 - self.beta2**self.t)
        return vhat ** (-self.power / 2) if vhat > 0 else 0.0


@dataclass(frozen=True)
class QueuedGroup:
    """A reported group waiting for the learner: problem index, completions, ω̂, mixed or not, and
    the policy version it was generated with."""

    idx: int
    size: int
    omega: float
    mixed: bool
    version: int


class SystemLearner:
    """The real learner's queue, pace, staleness and step (the module docstring; :class:`SystemModel`)."""

    def __init__(self, pop: Population, model: SystemModel, group_size: int, keep_zero_variance: bool) -> None:
        self.pop, self.model, self.G, self.keep_zero = pop, model, group_size, keep_zero_variance
        self.queue: deque[QueuedGroup] = deque()  # reported, not pulled (the server's stream)
        self.pulled: list[QueuedGroup] = []  # the next batch, pulled, not yet filtered
        self.norm = StepNorm(model.adam, model.beta2)
        self.busy_until: float | None = None  # the step in progress ends then
        self._step: tuple[np.ndarray, np.ndarray] | None = None  # its problems and updates
        self.version = 0  # optimizer steps done = the policy version published
        self.generated = self.queued = self.trained = self.stale = self.trained_rollouts = 0

    @property
    def backlog(self) -> int:
        """Groups queued or pulled and not yet in a step (what pacing counts)."""
        return len(self.queue) + len(self.pulled)

    def receive(self, idx: np.ndarray, sizes: np.ndarray, groups: list[tuple[float, ...]], version: int) -> None:
        """A lease's report: queue its mixed groups (and its zero-variance ones with ``keep_zero_variance``)."""
        for j, n, g in zip(idx.tolist(), sizes.tolist(), groups, strict=True):
            phat = sum(g) / len(g)
            mixed = 0.0 < phat < 1.0 and n == self.G
            self.generated += 1
            if mixed or self.keep_zero:
                self.queued += 1
                self.queue.append(QueuedGroup(j, n, phat * (1.0 - phat), mixed, version))

    def advance(self, now: float) -> None:
        """Pull, filter and start steps as far as the queue allows at time ``now``."""
        bg = self.model.batch_groups
        while True:
            if not self.pulled and len(self.queue) >= bg and (self.busy_until is None or self.model.prefetch):
                self.pulled = [self.queue.popleft() for _ in range(bg)]
            if self.busy_until is not None or not self.pulled:
                return
            fresh = [g for g in self.pulled if self.version - g.version <= self.model.max_staleness]
            self.stale += len(self.pulled) - len(fresh)
            self.pulled = []
            if fresh:
                self._start(now, fresh)

    def _start(self, now: float, batch: list[QueuedGroup]) -> None:
        sizes = np.array([g.size for g in batch])  # (b,)
        update = np.array([g.omega for g in batch]) * sizes / self.G  # (b,) ω̂ · g_j / G
        mixed = np.array([g.mixed for g in batch])  # (b,)
        if self.keep_zero:  # the token mean over the whole batch, zero-variance completions included
            update = update * (sizes[mixed].sum() / sizes.sum())
        self._step = (np.array([g.idx for g in batch]), update * self.norm.scale(update))
        self.trained += len(batch)
        self.trained_rollouts += int(sizes[mixed].sum())
        self.busy_until = now + self.model.step_time

    def next_event(self) -> float:
        """When the step in progress ends (inf: none)."""
        return math.inf if self.busy_until is None else self.busy_until

    def finish(self) -> int:
        """End the step in progress: apply its update; returns the new policy version."""
        assert self._step is not None, "finish() without a step in progress"
        self.pop.train(*self._step)
        self._step, self.busy_until = None, None
        self.version += 1
        return self.version

    def counts(self) -> dict[str, int]:
        """Groups generated, queued for the learner (the rest: zero-variance groups the arm filters),
        and of those queued: trained, dropped as stale, and left untrained at the end (queued, pulled
        or in the step that had not ended)."""
        in_step = 0 if self._step is None else int(self._step[0].size)
        return {
            "generated": self.generated,
            "queued": self.queued,
            "trained": self.trained - in_step,
            "stale": self.stale,
            "left": self.backlog + in_step,
        }
