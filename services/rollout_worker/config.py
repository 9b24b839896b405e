"""Typed configuration of ``prioreplay worker`` (pydantic and the standard library only).

Every field maps onto a ``--kebab-case`` flag, a ``PRIOREPLAY_<FIELD>`` environment variable and
the ``worker`` section of a ``--config`` file (see :mod:`prioreplay.config`).
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from prioreplay.config import ClientSettings, LogLevel, Seed, check_role_settings
from prioreplay.devices import GpuClaimSettings

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def escape_stop(s: str) -> str:
    """A stop string as a ``--stop`` flag writes it (``\\n``, ``\\t``, ``\\\\``): the inverse of
    :func:`unescape_stop` (the demo and ``compare`` pass their stop strings to workers this way)."""
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unescape_stop(s: str) -> str:
    """A ``--stop`` value with its escapes decoded: ``\\n`` newline, ``\\t`` tab, ``\\\\`` backslash;
    any other backslash stays as written."""
    chars, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in _ESCAPES:
            chars.append(_ESCAPES[s[i + 1]])
            i += 2
        else:
            chars.append(s[i])
            i += 1
    return "".join(chars)


#: ``--stop`` values with their escapes decoded (:func:`unescape_stop`); every command that takes
#: stop strings declares them with this type.
StopStrings = Annotated[list[str], AfterValidator(lambda v: [unescape_stop(s) for s in v])]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerConfig(ClientSettings, GpuClaimSettings):
    """Configuration of a rollout worker: model, backend, group size G, batch size B, sampling.

    Each loop iteration leases ``batch_size`` problems, generates ``group_size`` completions per
    problem (B × G sequences), verifies them and reports the lease.
    """

    #: The worker's own names for what the server calls lease_timeout_s (its default lease) and
    #: grace_s (its RPC drain on SIGTERM): the old flags still work, with a warning.
    renamed: ClassVar[dict[str, str]] = {"lease_timeout_s": "requested_lease_s", "grace_s": "batch_grace_s"}

    # -- model and backend ---------------------------------------------------------------------
    model: str = Field(
        "smollm2-135m", description="model alias, local model directory or cached Hugging Face id (the learner's starting model)"
    )
    cache_dir: Path | None = Field(
        None, description="where converted models are cached (default: $PRIOREPLAY_CACHE_DIR or ~/.cache/prioreplay/models)"
    )
    backend: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="transformers (CPU, GPU) or vllm (GPU: pip install 'prioreplay[gpu]'; CPU: make install-vllm, docs/VLLM.md)",
    )
    device: str = Field(
        "auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N' (transformers backend)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the engine's parameter dtype: 'auto' (float32, the learner's, on either backend), 'float32' or "
        "'bfloat16' (a lower-precision engine than the learner's float32 samples from a slightly other distribution; "
        "the learner's --off-policy-correction weighs that gap, docs/OFFPOLICY.md; on a GPU, bfloat16 halves vLLM's memory)",
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="share of GPU memory vLLM may use")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs one vllm replica shards the model over (claimed together under --gpu-claims-dir)"
    )
    weights_cache_dir: Path | None = Field(
        None,
        description="where versions fetched from a remote weights_uri (http(s)://, "
        "s3://, ...: no shared volume) are kept, verified (default CACHE_DIR/weights)",
    )
    weights_cache_keep: int = Field(2, ge=1, le=1000, description="newest fetched versions kept in --weights-cache-dir")
    weights_fetch_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="bound on connecting and on each read "
        "while fetching remote weights, seconds; a stalled fetch is refused and retried",
    )
    max_batch_sequences: int = Field(
        256,
        ge=1,
        le=65536,
        description="sequences decoded together by the transformers backend (B × G is split into chunks of this size)",
    )

    # -- batch and sampling --------------------------------------------------------------------
    group_size: int = Field(8, ge=1, le=1024, description="completions per problem G (the GRPO group)")
    batch_size: int = Field(8, ge=1, le=4096, description="problems per lease B")
    temperature: float = Field(1.0, gt=0, le=10, description="sampling temperature (> 0; the learner must use the same)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1 disables)")
    max_new_tokens: int = Field(512, ge=1, le=1_000_000, description="completion length limit, tokens")
    stop: StopStrings = Field(
        default_factory=list,
        description="strings that end a completion (EOS always does); "
        "the escapes \\n, \\t and \\\\ are decoded, so --stop '\\n\\n' stops at a blank line",
    )
    seed: Seed = Field(
        0,
        description="seeds generation: each problem of a lease is sampled from a hash of (seed, worker id, "
        "lease id, problem id), distinct across leases, replicas and restarts for any seed; the same four "
        "values reproduce the same completions",
    )
    truncated_reward: Literal["verifier", "zero"] = Field(
        "verifier",
        description="reward of a completion cut at max_new_tokens: 'verifier' (default) scores it like any "
        "other; 'zero' reports 0 without verifying it (a cut answer is not an answer). Applied before reporting, so the "
        "server's statistics and priorities and the learner's advantages see the same reward",
    )
    verify_timeout_s: float = Field(5.0, gt=0, le=600, description="bound on one verification or reward plugin call, seconds")
    reward: list[str] = Field(
        default_factory=list,
        description="reward functions that score completions, replacing the problem's verifier (docs/REWARDS.md): "
        "'verifier' (the problem's own), 'package.module:function', 'path/file.py:function' or an entry point "
        "of group prioreplay.rewards; repeat the flag for several (empty: 'verifier')",
    )
    reward_weights: list[float] = Field(
        default_factory=list,
        description="one weight > 0 per --reward, as TRL's reward_weights, e.g. 1,0.5; the reported reward is "
        "the weighted mean (empty: all 1)",
    )
    pass_threshold: float = Field(
        1.0,
        gt=0,
        le=1,
        description="a reward function's number passes at >= this (a function returning (reward, passed) decides "
        "itself); a completion passes when every reward passes. 1.0: exactly the correct answers of the built-in verifiers",
    )

    # -- loop ----------------------------------------------------------------------------------
    max_batches: int = Field(0, ge=0, le=10**12, description="stop after this many reported batches (0: until stopped)")
    pipeline: bool = Field(
        True,
        description="lease the next batch and verify and report the last one while generating, so the backend "
        "does not wait on the service; --no-pipeline runs lease, generate, verify, report in turn",
    )
    worker_id: str = Field(
        default_factory=_default_worker_id,
        min_length=1,
        max_length=128,
        description="name sent with leases and reports (default HOST-PID)",
    )
    requested_lease_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="lease length asked for, seconds (0: the server's --lease-timeout-s); make it longer than one "
        "batch's generation (formerly --lease-timeout-s, deprecated)",
    )
    batch_grace_s: float = Field(
        30.0,
        ge=0,
        le=86400,
        description="on SIGTERM, seconds the current batch may still take; past that the worker exits and the lease "
        "expires (formerly --grace-s, deprecated)",
    )
    max_retry_sleep_s: float = Field(5.0, gt=0, le=3600, description="longest sleep when the server has nothing to lease")

    # -- observability -------------------------------------------------------------------------
    outcomes_file: Path | None = Field(
        None,
        description="append one JSON line per group of an accepted report to this file: problem_id, task, "
        "policy_version, rewards, passed (with --reward plugins), lease_id, worker_id, time_unix_s "
        "(per-problem outcome histories, e.g. to calibrate benchmarks/simulate.py; None: no file)",
    )
    metrics_port: int = Field(9101, ge=0, le=65535, description="port of /metrics (0 disables)")
    log_level: LogLevel = "INFO"

    @model_validator(mode="after")
    def _check(self) -> WorkerConfig:
        from prioreplay.errors import InvalidArgument

        check_role_settings(self.model, self.device, self.log_level)
        if not math.isfinite(self.temperature):
            raise InvalidArgument(f"temperature ({self.temperature}) must be a finite number > 0")
        if any(not s for s in self.stop):
            raise InvalidArgument(f"stop ({self.stop!r}) must hold non-empty strings")
        from prioreplay.rewards import parse_specs

        parse_specs(self.reward, self.reward_weights)  # names, counts and weights; imports are checked at start
        return self

    def reward_set(self, verify=None):
        """The worker's :class:`prioreplay.rewards.RewardSet` (``--reward``, ``--reward-weights``,
        ``--pass-threshold``, ``--verify-timeout-s``; ``verify``: the ``verifier`` reward's scorer,
        default :func:`prioreplay.verifiers.verify`); plugins are not imported yet."""
        from prioreplay.rewards import RewardSet, parse_specs

        specs = parse_specs(self.reward, self.reward_weights)
        return RewardSet(specs, self.pass_threshold, self.verify_timeout_s, verify=verify)
