"""Typed configuration of the ``server``, ``load`` and ``stats`` commands.

Every field maps onto a ``--kebab-case`` flag, a ``PRIOREPLAY_<FIELD>`` environment variable and
the command's section of a ``--config`` file (see :mod:`prioreplay.config`). Bounds live on the
fields, so a bad value fails at start-up with the field, the value and the allowed range.

This module imports only pydantic, the standard library, :mod:`prioreplay.config`,
:mod:`prioreplay.problems` and the sampler registry (:mod:`.samplers`), so that
``prioreplay server --help`` stays fast; :meth:`ServerConfig.to_store_config` imports the store
module when called.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from prioreplay.config import MAX_MESSAGE_MB_DEFAULT, ClientSettings, LogLevel, PrioreplaySettings, Seed, read_token
from prioreplay.priority_server.samplers import DEFAULT_DECAY, DEFAULT_SAMPLER, SAMPLER_HELP, SamplerName
from prioreplay.problems import MAX_NAME_BYTES, VerifierName

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.priority_server.store import StoreConfig

_STORE_RE = re.compile(r"^(memory|(redis|rediss|unix)://\S+)$")
#: A run namespace (the Redis hash tag of every key of the run): no braces, at most MAX_NAME_BYTES.
NAMESPACE_RE = re.compile(rf"^[A-Za-z0-9_.:-]{{1,{MAX_NAME_BYTES}}}$")


class ServerConfig(PrioreplaySettings):
    """Configuration of ``prioreplay server``: the store, the sampler, leases, limits and security."""

    # -- store ---------------------------------------------------------------------------
    store: str = Field(
        "memory",
        description="'memory' (in-process, snapshots to --snapshot-path) or a Redis URL redis://HOST:PORT/DB "
        "(rediss:// for TLS, unix:// for a socket)",
    )
    namespace: str = Field(
        "default", description=f"run namespace: every Redis key of this run carries it (1-{MAX_NAME_BYTES} of A-Z a-z 0-9 _ . : -)"
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
    # -- sampler -------------------------------------------------------------------------
    sampler: SamplerName = Field(DEFAULT_SAMPLER, description=SAMPLER_HELP)
    alpha: float = Field(1.0, gt=0, le=100, description="exponent of the weighted sampler (priority^alpha)")
    temperature: float = Field(1.0, gt=0, le=100, description="temperature T of the gumbel sampler")
    probe_size: int = Field(2, ge=1, le=1024, description="completions of a screening probe (screened samplers)")
    posterior_decay: float = Field(
        1.0, gt=0, le=1, description="per-step evidence decay of the posterior retests (1: none)")
    posterior_prior: float = Field(1.0, gt=0, le=1e6, description="symmetric Beta prior α₀ = β₀ of the posterior retests")
    retest_fraction: float = Field(
        0.1, ge=0, le=1, description="share of each batch reserved for solved/unsolved pool retests"
    )
    retest_interval: int = Field(
        4, ge=0, le=1_000_000_000, description="batches a pooled problem waits before it may be retested"
    )
    decay: float = Field(
        DEFAULT_DECAY, ge=0, le=1,
        description="decay λ of the success statistics per report (1: cumulative, the paper; 0: latest group)"
    )
    prior_alpha: float = Field(0.0, ge=0, le=1e6, description="Beta prior α₀: pseudo-observations of reward 1")
    prior_beta: float = Field(0.0, ge=0, le=1e6, description="Beta prior β₀: pseudo-observations of reward 0")
    seed: Seed = Field(0, description="seed of the sampler RNG and the priority tie-break")
    # -- leases and the trajectory queue -------------------------------------------------
    lease_timeout_s: float = Field(
        600.0, gt=0, le=7 * 86400, description="default lease length, seconds (a lease not reported by then expires)"
    )
    max_lease_timeout_s: float = Field(
        86400.0, gt=0, le=7 * 86400, description="longest lease a worker may ask for, seconds"
    )
    redelivery_timeout_s: float = Field(
        300.0, gt=0, le=7 * 86400, description="seconds before a pulled, unacknowledged group is delivered again"
    )
    reaper_interval_s: float = Field(
        1.0, gt=0, le=3600, description="seconds between sweeps that expire overdue leases"
    )
    stats_interval_s: float = Field(
        5.0, gt=0, le=3600, description="seconds between refreshes of /metrics and of the health status from the store"
    )
    # -- limits --------------------------------------------------------------------------
    max_batch_size: int = Field(
        4096, ge=1, le=1_000_000, description="largest SampleProblems batch_size / PullTrajectories max_groups"
    )
    max_queue_depth: int = Field(
        0, ge=0, le=1_000_000_000,
        description="backpressure: refuse leases (empty batch, backpressure=true) while at least this many trajectory "
                    "groups wait undelivered to a learner; 0: no bound. Set it to a few learner steps' worth of groups",
    )
    backpressure_retry_s: float = Field(
        2.0, gt=0, le=3600, description="retry_after_s of a lease refused by backpressure, seconds"
    )
    max_message_mb: int = Field(
        MAX_MESSAGE_MB_DEFAULT, ge=1, le=2000, description="largest gRPC message received or sent, MiB"
    )
    # -- security ------------------------------------------------------------------------
    auth_token: SecretStr | None = Field(
        None, description="bearer token every RPC but health must carry (env PRIOREPLAY_AUTH_TOKEN); never logged"
    )
    auth_token_file: Path | None = Field(None, description="file holding the bearer token (alternative to --auth-token)")
    tls_cert_file: Path | None = Field(None, description="server certificate chain (PEM); with --tls-key-file enables TLS")
    tls_key_file: Path | None = Field(None, description="server private key (PEM); with --tls-cert-file enables TLS")
    # -- process -------------------------------------------------------------------------
    processes: int = Field(
        1, ge=1, le=64,
        description="server processes sharing --port (SO_REUSEPORT, each its own event loop; one /metrics for all); "
        "more than 1 needs a Redis --store",
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
    def _check_consistency(self) -> "ServerConfig":
        if self.lease_timeout_s > self.max_lease_timeout_s:
            raise ValueError(
                f"lease_timeout_s ({self.lease_timeout_s}) must be <= max_lease_timeout_s ({self.max_lease_timeout_s})"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file (or neither for plaintext)")
        if self.processes > 1 and self.store == "memory":
            raise ValueError(
                f"processes ({self.processes}) > 1 needs a Redis store: the memory store lives inside one process, "
                "so each process would have its own problems, leases and queue. Use --store redis://HOST:PORT/DB "
                "or --processes 1"
            )
        if self.auth_token is not None and self.auth_token_file is not None:
            raise ValueError("give auth_token or auth_token_file, not both")
        if self.auth_token is not None and not self.auth_token.get_secret_value().strip():
            raise ValueError("auth_token is empty; give a non-empty token or leave it unset")
        return self

    def token(self) -> str | None:
        """The bearer token clients must send, or None when auth is off.

        Raises:
            InvalidArgument: the token file cannot be read or is empty.
        """
        return read_token(self.auth_token, self.auth_token_file)

    @property
    def tls_enabled(self) -> bool:
        """True when both a certificate and a key are configured."""
        return self.tls_cert_file is not None and self.tls_key_file is not None

    def to_store_config(self) -> "StoreConfig":
        """The store's parameters (sampler, statistics, leases, limits) from this configuration."""
        from prioreplay.priority_server.store import StoreConfig
        from prioreplay.rules import PriorityParams

        return StoreConfig(
            sampler=self.sampler,
            alpha=self.alpha,
            temperature=self.temperature,
            probe_size=self.probe_size,
            posterior_decay=self.posterior_decay,
            posterior_prior=self.posterior_prior,
            retest_fraction=self.retest_fraction,
            retest_interval=self.retest_interval,
            params=PriorityParams(decay=self.decay, prior_alpha=self.prior_alpha, prior_beta=self.prior_beta),
            seed=self.seed,
            lease_timeout_s=self.lease_timeout_s,
            max_lease_timeout_s=self.max_lease_timeout_s,
            redelivery_timeout_s=self.redelivery_timeout_s,
            max_batch_size=self.max_batch_size,
        )


class LoadConfig(ClientSettings):
    """Configuration of ``prioreplay load SOURCE``: which dataset, how to map it, how to send it."""

    source: CliPositionalArg[str] = Field(
        description="a .jsonl/.json/.parquet file (id/prompt/answer, GSM8K question/answer or MATH problem/solution), a saved `datasets` directory or name, or arithmetic:N[:seed[:level[:style]]]"
    )
    split: str | None = Field(None, description="dataset split (train/test...) for `datasets` names and folders")
    id_column: str | None = Field(None, description="column holding the problem id (default: the loader's)")
    prompt_column: str | None = Field(None, description="column holding the prompt (default: the loader's)")
    answer_column: str | None = Field(None, description="column holding the reference answer (default: the loader's)")
    verifier: VerifierName | None = Field(
        None, description="verifier for every problem, overriding the loader's choice"
    )
    id_prefix: str = Field("", max_length=64, description="prefix prepended to every problem id (e.g. 'gsm8k-test/')")
    chunk_size: int = Field(512, ge=1, le=100_000, description="problems per RegisterProblems message")
    limit: int | None = Field(None, ge=1, description="register at most this many problems")


class StatsConfig(ClientSettings):
    """Configuration of ``prioreplay stats``: histogram resolution and output format."""

    buckets: int = Field(10, ge=1, le=1000, description="equal-width priority histogram buckets over [0, 0.25]")
    as_json: bool = Field(False, description="print the statistics as one JSON object instead of text")
