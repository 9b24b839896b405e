"""Typed configuration of the ``server``, ``load`` and ``stats`` commands.

Every field maps onto a ``--kebab-case`` flag, a ``PRIOREPLAY_<FIELD>`` environment variable and
the command's section of a ``--config`` file (see :mod:`prioreplay.config`). Bounds live on the
fields, so a bad value fails at start-up with the field, the value and the allowed range.

Shared settings are declared once and composed, one model per component: the sampler's
(:class:`prioreplay.priority_server.sampler_settings.SamplerSettings`) into :class:`StoreSettings`, :class:`StoreSettings`
into :class:`ServerConfig` and :class:`StoreConfig` (what both stores take), the replication's
(:class:`ReplicationSettings`) into :class:`ServerConfig`, and
:class:`prioreplay.config.ChannelSettings` into :class:`ServerConfig` and every client's settings.

This module imports only pydantic, the standard library, :mod:`prioreplay.config`,
:mod:`prioreplay.errors`, :mod:`prioreplay.rules`, :mod:`prioreplay.problems`,
:mod:`prioreplay.unseen_prior` and :mod:`.sampler_settings` (the sampler registry), so that
``prioreplay server --help`` stays fast.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import CliPositionalArg

from prioreplay.config import ChannelSettings, ClientSettings, LogLevel, PrioreplaySettings, Seed, explain_error
from prioreplay.errors import InvalidArgument
from prioreplay.problems import MAX_NAME_BYTES, VerifierName
from prioreplay.rules import DEFAULT_DECAY, PoolBands, PriorityParams
from prioreplay.unseen_prior import parse_setting

from .sampler_settings import RENAMED_STORE_SETTINGS, SAMPLER_FLAGS, SamplerSettings

__all__ = [
    "RENAMED_STORE_SETTINGS",
    "SAMPLER_FLAGS",
    "LoadConfig",
    "ReplicationSettings",
    "SamplerSettings",
    "ServerConfig",
    "StatsConfig",
    "StoreConfig",
    "StoreSettings",
]

#: Default backpressure bound, trajectory groups (docs/DEPLOY.md, "Bounded memory"): a group on
#: the lean report path is G × T × (4 B token id + 4 B log-prob) + ~8 KiB of prompt, rewards and
#: framing, i.e. 8 × 512 × 8 B = 32 KiB + 8 KiB ≈ 40 KiB, so 1024 groups ≈ 40 MiB (G=16 × 2048
#: tokens: ≈ 264 KiB a group, ≈ 264 MiB), well under the compose Redis's 4 GiB ``maxmemory``;
#: 1024 is 128 steps of the learner's default 8 groups, 4 of 256.
DEFAULT_MAX_QUEUE_DEPTH = 1024

_STORE_RE = re.compile(r"^(memory|(redis|rediss|unix|redis\+sentinel|rediss\+sentinel)://\S+)$")
#: A run namespace (the Redis hash tag of every key of the run): no braces, at most MAX_NAME_BYTES.
NAMESPACE_RE = re.compile(rf"^[A-Za-z0-9_.:-]{{1,{MAX_NAME_BYTES}}}$")

#: ``--unseen-prior``: "off", "fit" or a priority in [0, 0.25], canonical (:func:`prioreplay.unseen_prior.parse_setting`).
UnseenPrior = Annotated[str, BeforeValidator(parse_setting)]


class StoreSettings(SamplerSettings):
    """The settings a store runs by (sampler, retests, seed, leases, limits), declared once.

    Composed into :class:`ServerConfig` (flags, environment, config file) and :class:`StoreConfig`
    (what the stores take), so both have the same bounds, defaults and help. The checks that span
    fields (a lease no longer than the longest lease) live here, once.

    Raises (at construction):
        pydantic.ValidationError: a value out of its bounds or an unregistered sampler name
            (:class:`StoreConfig` turns it into :class:`prioreplay.errors.InvalidArgument`).
    """

    retest_fraction: float = Field(0.1, ge=0, le=1, description="share of each batch reserved for solved/unsolved pool retests")
    pool_evidence: int = Field(
        1,
        ge=0,
        le=64,
        description="zero-variance groups of one kind in a row (all-correct, all-wrong, or the --solved-at / --unsolved-at "
        "bands) before a problem leaves the heap for a pool: 1, one group (the paper); 0, chosen by the group size G, "
        "k = ceil(ln 0.1 / (G ln(1 - 1/G))) (2 for G <= 3, 3 for G >= 4: a problem with success rate 1/G is pooled "
        "with probability <= one in ten); until then it stays at the top of the heap, to be tested again at once "
        "(rules.evidence_groups)",
    )
    age_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="gamma: a report multiplies a problem's old statistics by decay x gamma^a, a = policy versions "
        "published since its previous report (FreshPER: evidence about an older policy counts less); 1: off",
    )
    heap_age_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="gamma_h: between reports a heap problem's priority decays toward the prior's, "
        "prior + (priority - prior) x gamma_h^a, a = policy versions since its latest report (FreshPER; "
        "rules.fresh_priority_now), so stale estimates neither dominate nor starve; 1: off. Sampler heap only",
    )
    unseen_prior: UnseenPrior = Field(
        "off",
        description="the priority problems never tested hold in the heap: 'off', the top (0.25 without a Beta prior: every "
        "unseen problem is served before a seen one is revisited, the paper); 'fit', the mean priority first visits gave "
        "(a Beta fitted by moments, on the heap's scale; prioreplay/unseen_prior.py), so known mixed problems are "
        "revisited from the second batch beside unseen ones; or a number in [0, 0.25]. Sampler heap only; off <-> on "
        "fixed for a namespace's life",
    )
    warm_start: str = Field(
        "",
        description="a warm-start file (`prioreplay export-stats`): a newly registered problem in it starts with the "
        "exported statistics times --warm-start-shrink, in the heap at their priority (prioreplay/warm_start.py); '': cold",
    )
    warm_start_shrink: float = Field(
        0.5,
        ge=0,
        le=1,
        description="rho: a warm-started problem's statistics are rho x the exported ones (its success-rate estimate kept, "
        "its weight cut toward the prior); 0: a cold start, 1: as if the old run went on",
    )
    queue_zero_variance: bool = Field(
        False,
        description="queue zero-variance groups (all rewards equal) for the learner too, as plain GRPO trains on every "
        "group (the `grpo` arm of `prioreplay compare`; the learner needs --train-zero-variance). Off: they are counted, "
        "not queued, and the learner fills its batch with mixed groups, as DAPO's dynamic sampling does",
    )
    retest_interval: int = Field(
        4, ge=0, le=1_000_000_000, description="batches a pooled problem waits before it may be retested"
    )
    retest_versions: int = Field(
        0,
        ge=0,
        le=1_000_000_000,
        description="0: pooled problems are due for a retest --retest-interval batches after their last test (the paper); "
        "k >= 1: the pools keep the policy version of each problem's last test and a problem is due once the published "
        "version is k or more past it, least recent version first (--retest-interval unused; off by default until "
        "the decision rule in docs/METHOD.md says otherwise)",
    )
    # -- pools ---------------------------------------------------------------------------
    solved_at: float = Field(
        1.0,
        gt=0,
        le=1,
        description="a group with pass rate (mean reward) >= this sends its problem to the solved pool; "
        "1: all-correct groups only (the paper)",
    )
    unsolved_at: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="a group with pass rate (mean reward) <= this sends its problem to the unsolved pool; "
        "0: all-wrong groups only (the paper); must be below --solved-at",
    )
    # -- leases and deliveries -----------------------------------------------------------
    lease_timeout_s: float = Field(
        600.0, gt=0, le=7 * 86400, description="default lease length, seconds (a lease not reported by then expires)"
    )
    max_lease_timeout_s: float = Field(86400.0, gt=0, le=7 * 86400, description="longest lease a worker may ask for, seconds")
    redelivery_timeout_s: float = Field(
        300.0,
        gt=0,
        le=365 * 86400,
        description="seconds before a pulled, unacknowledged group is delivered again (at most a year)",
    )
    # -- pacing (services/priority_server/pacing.py) ---------------------------------------
    pace_batches: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="the pace bound K: lease only while groups queued for the learner and not yet delivered, plus "
        "problems leased and not yet reported, plus the new batch stay within K learner batches (a batch is cut to "
        "the room left; with none, SampleProblems waits for the learner: docs/USAGE.md, 'Pacing'); 0: off",
    )
    pace_batch_groups: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="the learner's batch in groups the pace bound counts until a learner declares its own on its "
        "first pull (PullTrajectories learner_batch_groups); 0: each SampleProblems call's batch_size",
    )
    # -- limits --------------------------------------------------------------------------
    max_batch_size: int = Field(
        4096, ge=1, le=1_000_000, description="largest SampleProblems batch_size / PullTrajectories max_groups"
    )
    seed: Seed = Field(0, description="seed of the sampler RNG and the priority tie-break")

    @model_validator(mode="after")
    def _check_lease_timeouts(self) -> StoreSettings:
        if self.lease_timeout_s > self.max_lease_timeout_s:
            raise ValueError(
                f"lease_timeout_s ({self.lease_timeout_s}) must be <= max_lease_timeout_s ({self.max_lease_timeout_s})"
            )
        if self.heap_age_decay < 1 and self.sampler != "heap":
            raise ValueError(
                f"heap_age_decay ({self.heap_age_decay}) ages the heap's order, which only --sampler heap reads "
                f"as an order alone (not {self.sampler!r}); use --sampler heap or --heap-age-decay 1"
            )
        if self.unseen_prior != "off" and self.sampler != "heap":
            raise ValueError(
                f"unseen_prior ({self.unseen_prior!r}) ranks unseen problems beside the heap's top, which only --sampler "
                f"heap reads as an order alone (not {self.sampler!r}); use --sampler heap or --unseen-prior off"
            )
        if self.unseen_prior != "off" and self.heap_age_decay < 1:
            raise ValueError(
                f"unseen_prior ({self.unseen_prior!r}) and heap_age_decay ({self.heap_age_decay}) both key the heap's "
                "scores; use one of them: --heap-age-decay 1 or --unseen-prior off"
            )
        try:
            self.bands  # noqa: B018 - the bands' own check (unsolved_at below solved_at), once
        except InvalidArgument as e:
            raise ValueError(str(e)) from None
        return self

    @property
    def bands(self) -> PoolBands:
        """The pass-rate bands of the pools (:class:`prioreplay.rules.PoolBands`)."""
        return PoolBands(solved_at=self.solved_at, unsolved_at=self.unsolved_at)


#: The most replicas ``--min-replica-acks`` may name (Redis ``WAIT`` takes any number; more is a typo).
MAX_REPLICA_ACKS = 16


def _replica_acks(value: object) -> object:
    """``value`` as an int in [0, MAX_REPLICA_ACKS] or ``"all"`` (any case, from a flag, a variable or a file)."""
    if isinstance(value, str):
        word = value.strip().lower()
        value = word if word == "all" else int(word) if word.isdigit() else value
    if value == "all" or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPLICA_ACKS):
        return value
    raise ValueError(
        f"min_replica_acks ({value!r}) must be 'all' (every replica a failover could promote: the default) "
        f"or a number of replicas from 0 to {MAX_REPLICA_ACKS}"
    )


#: ``--min-replica-acks``: a number of replicas, or ``all``.
ReplicaAcks = Annotated[int | Literal["all"], BeforeValidator(_replica_acks)]


class ReplicationSettings(BaseModel):
    """How many Redis replicas must hold a change before the server acknowledges it, declared once.

    Composed into :class:`ServerConfig`; the Redis store takes it (``RedisStore(replication=...)``).
    Every register, report, publish and acknowledge script is followed by Redis ``WAIT n timeout``
    on the same connection, after a small write (so that a retried change the script answers
    without writing, ``already reported``, still waits for the earlier write to replicate); fewer
    acknowledgements within the timeout answer UNAVAILABLE (kind ``read_only``). ``n`` is
    ``min_replica_acks``: ``"all"`` (the default) counts every replica a failover could promote
    (:mod:`.store.redis.replicas`: the sentinels' list, never fewer than the replicas connected
    now), so an acknowledged change survives the failover to any of them; with no replica ``n`` is
    0 and nothing waits. A number N waits for N replicas only: a failover to another one can lose
    acknowledged changes (measured in docs/GUARANTEES.md). The health probe's write waits too, so
    health is NOT_SERVING while fewer replicas follow.
    """

    min_replica_acks: ReplicaAcks = Field(
        "all",
        description="Redis replicas that must acknowledge each register/report/publish/ack before it is answered "
        "(Redis WAIT); fewer answer UNAVAILABLE. 'all' (default): every replica a failover could promote "
        "(counted from the sentinels and the primary); N: N replicas (a failover to another may lose the last "
        "acknowledged changes); 0: no wait",
    )
    min_replica_acks_timeout_ms: int = Field(
        100, ge=1, le=60_000, description="milliseconds WAIT waits for --min-replica-acks replicas"
    )

    @property
    def fixed_acks(self) -> int:
        """``min_replica_acks`` when it is a number, else 0 (``all`` is counted at run time)."""
        return 0 if self.min_replica_acks == "all" else int(self.min_replica_acks)


def _explain(err: ValidationError) -> str:
    """One line per invalid field: its name, the value given and what is allowed."""
    return "; ".join(explain_error(e) for e in err.errors())


class StoreConfig(StoreSettings):
    """Sampling and bookkeeping parameters both stores take (immutable).

    The fields of :class:`StoreSettings` plus ``params``: the decay and prior of the statistics
    (:class:`prioreplay.rules.PriorityParams`, built from ``--decay``, ``--prior-alpha`` and
    ``--prior-beta`` by :meth:`ServerConfig.to_store_config`).

    Raises:
        InvalidArgument: a value out of its bounds (the message names the field, the value and
            the bound), an unregistered sampler, or a lease timeout above the longest lease.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: InstanceOf[PriorityParams] = Field(
        default_factory=PriorityParams, description="decay and prior of the success statistics"
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise InvalidArgument(_explain(e)) from None


class ServerConfig(PrioreplaySettings, ChannelSettings, ReplicationSettings, StoreSettings):
    """Configuration of ``prioreplay server``: the store, the sampler, leases, limits and security.

    The sampler, retest, seed, lease and batch-size fields come from :class:`StoreSettings`, the
    token and message limit from :class:`prioreplay.config.ChannelSettings` (the clients' too),
    the replica acknowledgements from :class:`ReplicationSettings`.
    """

    renamed: ClassVar[dict[str, str]] = RENAMED_STORE_SETTINGS

    # -- store ---------------------------------------------------------------------------
    store: str = Field(
        "memory",
        description="'memory' (in-process, snapshots to --snapshot-path) or a Redis URL redis://HOST:PORT/DB "
        "(rediss:// for TLS, unix:// for a socket, redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE[/DB] for the "
        "primary Redis Sentinel names: followed through failovers)",
    )
    namespace: str = Field(
        "default",
        description=f"run namespace: every Redis key of this run carries it (1-{MAX_NAME_BYTES} of A-Z a-z 0-9 _ . : -)",
    )
    accept_setting_changes: bool = Field(
        False,
        description="start on a namespace (or snapshot) made with other sampler, retest, decay, prior or band "
        "settings, storing the new ones (without it such a start is refused, naming each change)",
    )
    accept_namespace_loss: bool = Field(
        False,
        description="Redis store: start on a namespace that a server found lost (flushed, an empty replica promoted, "
        "an older snapshot restored), going on from what Redis holds now as the namespace's next generation "
        "(without it such a start is refused; servers still running on the old generation follow). "
        "Remove it once the server runs: restoring the data instead needs no flag",
    )
    snapshot_path: Path | None = Field(
        None, description="memory store: file the state is loaded from at start and snapshotted to (none: not kept)"
    )
    snapshot_interval_s: float = Field(
        60.0, ge=0, le=86400, description="seconds between memory-store snapshots (0: only at shutdown)"
    )
    # -- listening -----------------------------------------------------------------------
    host: str = Field(
        "127.0.0.1", min_length=1, description="interface to listen on (0.0.0.0 for remote workers; set a token then)"
    )
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: an ephemeral port, logged at start)")
    metrics_port: int = Field(9100, ge=0, le=65535, description="Prometheus /metrics port (0 disables it)")
    max_connection_age_s: float = Field(
        30.0,
        ge=0,
        le=86400,
        description="seconds after which the server asks a client connection to close (gRPC GOAWAY), so clients "
        "of a dns:/// name reconnect, resolve it again and reach replicas added since; 0: connections live forever",
    )
    max_connection_age_grace_s: float = Field(
        65.0,
        gt=0,
        le=86400,
        description="seconds the RPCs of a connection asked to close get to finish (above PullTrajectories' longest wait_s, 60)",
    )
    # -- statistics ----------------------------------------------------------------------
    decay: float = Field(
        DEFAULT_DECAY,
        ge=0,
        le=1,
        description="decay λ of the success statistics per report (1: cumulative, the paper; 0: latest group)",
    )
    prior_alpha: float = Field(0.0, ge=0, le=1e6, description="Beta prior α₀: pseudo-observations of reward 1")
    prior_beta: float = Field(0.0, ge=0, le=1e6, description="Beta prior β₀: pseudo-observations of reward 0")
    # -- leases and the trajectory queue -------------------------------------------------
    reaper_interval_s: float = Field(1.0, gt=0, le=3600, description="seconds between sweeps that expire overdue leases")
    stats_interval_s: float = Field(
        5.0, gt=0, le=3600, description="seconds between refreshes of /metrics and of the health status from the store"
    )
    # -- limits --------------------------------------------------------------------------
    max_queue_depth: int = Field(
        DEFAULT_MAX_QUEUE_DEPTH,
        ge=0,
        le=1_000_000_000,
        description="backpressure: refuse leases (empty batch, backpressure=true) while at least this many trajectory "
        "groups wait undelivered to a learner; 0: no bound (the queue then grows while no learner pulls). "
        "1024 groups of G=8 x 512 tokens hold about 40 MiB (docs/DEPLOY.md, 'Bounded memory')",
    )
    backpressure_retry_s: float = Field(
        2.0, gt=0, le=3600, description="retry_after_s of a lease refused by backpressure, seconds"
    )
    pace_wait_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="longest wait of a SampleProblems call held by the pace bound (--pace-batches), seconds; the "
        "server answers paced=true (ask again at once) earlier when the call's deadline comes first",
    )
    # -- security ------------------------------------------------------------------------
    tls_cert_file: Path | None = Field(None, description="server certificate chain (PEM); with --tls-key-file enables TLS")
    tls_key_file: Path | None = Field(None, description="server private key (PEM); with --tls-cert-file enables TLS")
    # -- process -------------------------------------------------------------------------
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="server processes sharing --port (SO_REUSEPORT, each its own event loop; one /metrics for all); "
        "more than 1 needs a Redis --store",
    )
    heartbeat_timeout_s: float = Field(
        10.0,
        ge=2,
        le=3600,
        description="with --processes > 1: seconds a server process may go without a heartbeat (sent every second from "
        "its event loop) before the parent kills and restarts it (stopped, hung, or its event loop blocked)",
    )
    grace_s: float = Field(10.0, ge=0, le=3600, description="on SIGTERM/SIGINT: seconds in-flight RPCs get to finish")
    log_level: LogLevel = "INFO"

    @field_validator("store")
    @classmethod
    def _check_store(cls, v: str) -> str:
        if not _STORE_RE.match(v):
            raise ValueError(f"store ({v!r}) must be 'memory' or a Redis URL like redis://127.0.0.1:6379/0")
        return v

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, v: str) -> str:
        if not NAMESPACE_RE.match(v):
            raise ValueError(f"namespace ({v!r}) must be 1-{MAX_NAME_BYTES} characters of A-Z a-z 0-9 _ . : -")
        return v

    @model_validator(mode="after")
    def _check_consistency(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file (or neither for plaintext)")
        if self.processes > 1 and self.store == "memory":
            raise ValueError(
                f"processes ({self.processes}) > 1 needs a Redis store: the memory store lives inside one process, "
                "so each process would have its own problems, leases and queue. Use --store redis://HOST:PORT/DB "
                "or --processes 1"
            )
        if self.fixed_acks and self.store == "memory":
            raise ValueError(
                f"min_replica_acks ({self.min_replica_acks}) needs a Redis store with replicas: use --store "
                "redis://HOST:PORT/DB or redis+sentinel://..., or --min-replica-acks 0"
            )
        if self.accept_namespace_loss and self.store == "memory":
            raise ValueError(
                "accept_namespace_loss applies to a Redis store only: the memory store's state is its own process's "
                "(and the snapshot it loads at start), which no other server can lose; drop --accept-namespace-loss"
            )
        if self.auth_token is not None and self.auth_token_file is not None:
            raise ValueError("give auth_token or auth_token_file, not both")
        if self.auth_token is not None and not self.auth_token.get_secret_value().strip():
            raise ValueError("auth_token is empty; give a non-empty token or leave it unset")
        return self

    @property
    def tls_enabled(self) -> bool:
        """True when both a certificate and a key are configured."""
        return self.tls_cert_file is not None and self.tls_key_file is not None

    def replication(self) -> ReplicationSettings:
        """The :class:`ReplicationSettings` fields of this configuration (what the Redis store takes)."""
        return ReplicationSettings(**{name: getattr(self, name) for name in ReplicationSettings.model_fields})

    def to_store_config(self) -> StoreConfig:
        """The store's parameters: every :class:`StoreSettings` field, and the statistics' params."""
        shared = {name: getattr(self, name) for name in StoreSettings.model_fields}
        params = PriorityParams(decay=self.decay, prior_alpha=self.prior_alpha, prior_beta=self.prior_beta)
        return StoreConfig(**shared, params=params)


class LoadConfig(ClientSettings):
    """Configuration of ``prioreplay load SOURCE``: which dataset, how to map it, how to send it."""

    source: CliPositionalArg[str] = Field(
        description="a .jsonl/.json/.parquet file (id/prompt/answer, GSM8K question/answer or MATH problem/solution), "
        "a saved `datasets` directory or name, or arithmetic:N[:seed[:level[:style]]]"
    )
    split: str | None = Field(None, description="dataset split (train/test...) for `datasets` names and folders")
    id_column: str | None = Field(None, description="column holding the problem id (default: the loader's)")
    prompt_column: str | None = Field(None, description="column holding the prompt (default: the loader's)")
    answer_column: str | None = Field(None, description="column holding the reference answer (default: the loader's)")
    verifier: VerifierName | None = Field(None, description="verifier for every problem, overriding the loader's choice")
    id_prefix: str = Field("", max_length=64, description="prefix prepended to every problem id (e.g. 'gsm8k-test/')")
    replace: bool = Field(
        False,
        description="let a problem whose id is registered with another prompt or answer replace it "
        "(statistics kept); without it such ids are refused (use --id-prefix for another dataset)",
    )
    chunk_size: int = Field(512, ge=1, le=100_000, description="problems per RegisterProblems message")
    limit: int | None = Field(None, ge=1, description="register at most this many problems")


class StatsConfig(ClientSettings):
    """Configuration of ``prioreplay stats``: histogram resolution and output format."""

    buckets: int = Field(10, ge=1, le=1000, description="equal-width priority histogram buckets over [0, 0.25]")
    as_json: bool = Field(False, description="print the statistics as one JSON object instead of text")
