"""Typed configuration of ``prioreplay learner`` (pydantic and the standard library only).

Every field maps onto a ``--kebab-case`` flag, a ``PRIOREPLAY_<FIELD>`` environment variable and
the ``learner`` section of a ``--config`` file (see :mod:`prioreplay.config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from prioreplay.config import ClientSettings, LogLevel, Seed, check_role_settings
from prioreplay.devices import GpuClaimSettings
from prioreplay.reporting import ReportTo

from .loss_settings import Correction, LossSettings

#: The learner's off-policy corrections (docs/OFFPOLICY.md); ``prioreplay compare`` names arms by them.
OffPolicyCorrection = Correction


class LearnerConfig(ClientSettings, GpuClaimSettings):
    """Configuration of the GRPO learner: model, optimizer, loss, staleness, checkpoints, metrics.

    One learner step uses ``batch_groups`` trajectory groups (each a prompt and its G completions),
    so its batch holds Σ G sequences; they are run ``micro_batch_size`` sequences per forward pass
    with gradient accumulation.

    The sampling temperature and top-p are no settings of the learner: each group carries the ones
    its completions were drawn at (``sampling_temperature``, ``sampling_top_p``), and the learner
    computes its log-probs under those (see :mod:`prioreplay.learner.filters`).
    """

    # -- model -------------------------------------------------------------------------------
    model: str = Field(
        "smollm2-135m", description="model alias, local directory or cached Hugging Face id (the same the workers start from)"
    )
    cache_dir: Path | None = Field(
        None, description="where converted/downloaded models are cached (default: the models module's)"
    )
    lora: bool = Field(
        False,
        description="train LoRA adapters instead of all weights (needs the 'lora' extra: pip install 'prioreplay[lora]'); "
        "published checkpoints hold the merged weights",
    )
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank r (alpha = 2r)")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'")
    max_sequence_tokens: int = Field(
        4096,
        ge=2,
        le=1_000_000,
        description="prompt + completion tokens per sequence at most; longer groups are dropped (counted as invalid)",
    )

    # -- batch and optimizer -----------------------------------------------------------------
    batch_groups: int = Field(8, ge=1, le=4096, description="trajectory groups per learner step")
    micro_batch_size: int = Field(8, ge=1, le=4096, description="sequences per forward/backward pass (gradient accumulation)")
    parallelism: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="under torchrun (K ranks): ddp keeps a whole copy of the model per rank and all-reduces "
        "gradients; fsdp shards parameters, gradients and optimizer state over the ranks (FSDP2 fully_shard per "
        "decoder layer, then the root), for a model that does not fit one device. Ignored in one process",
    )
    lr: float = Field(1e-6, gt=0, le=1, description="peak learning rate of AdamW")
    warmup_steps: int = Field(0, ge=0, le=10_000_000, description="steps of linear learning-rate warm-up from 0 (then constant)")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW decoupled weight decay")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="clip the global gradient L2 norm to this")
    seed: Seed = Field(0, description="seeds torch and python RNGs (their states are checkpointed)")

    # -- loss ----------------------------------------------------------------------------------
    advantage: Literal["grpo", "drgrpo"] = Field("grpo", description="grpo: (r − mean)/(std + eps); drgrpo: r − mean (= r − p)")
    advantage_eps: float = Field(1e-6, gt=0, le=1, description="eps added to the group std (grpo mode)")
    aggregation: Literal["token-mean", "seq-mean"] = Field(
        "token-mean", description="token-mean over the batch's valid tokens, or mean per sequence then over sequences"
    )
    eps_low: float = Field(0.2, ge=0, lt=1, description="lower clip: ratio >= 1 − eps_low")
    eps_high: float = Field(0.28, ge=0, le=10, description="upper clip: ratio <= 1 + eps_high (DAPO clip-higher)")
    dual_clip_c: float = Field(
        3.0,
        ge=0,
        le=1e6,
        description="dual-clip cap c on the ratio for negative advantages (Ye et al. 2020, eq. 5; > 1; 0 turns it off)",
    )
    off_policy_correction: OffPolicyCorrection = Field(
        "tis",
        description="off-policy correction (decoupled PPO: the clip acts on π_θ/π_prox, the weight w = π_prox/μ on "
        "the surrogate): 'none' (one ratio π_θ/μ, the loss before this setting), 'tis' (w truncated at "
        "--correction-cap; default, Yao et al. 2025), 'mis-token' / 'mis-sequence' (tokens / sequences with w outside "
        "[1/C, C] masked), 'icepop' (tokens with w outside [--icepop-low, --icepop-high] masked). See docs/OFFPOLICY.md",
    )
    correction_cap: float = Field(
        2.0, gt=1, le=1e6, description="C of the off-policy correction: tis truncates w at C, mis-* mask outside [1/C, C]"
    )
    icepop_low: float = Field(0.5, gt=0, lt=1, description="IcePop band: tokens with w < this are masked (Ring-1T: 0.5)")
    icepop_high: float = Field(5.0, gt=1, le=1e6, description="IcePop band: tokens with w > this are masked (Ring-1T: 5)")
    truncated: Literal["mask", "keep"] = Field(
        "mask",
        description="completions cut at the workers' max_new_tokens: 'mask' (default) keeps their reward in the "
        "group's advantages but leaves their tokens out of the loss; 'keep' trains on them like finished ones. Their "
        "reward is the workers' (--truncated-reward). Counted in prioreplay_learner_truncated_completions_total",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        le=100,
        description="weight of the k3 KL to the initial model --model, "
        "across any number of resumes (0: no reference model is loaded; a frozen copy, or with LoRA the "
        "adapter-free base until the first resume, which loads a frozen copy)",
    )

    # -- trajectories and versions -------------------------------------------------------------
    max_staleness: int = Field(
        4,
        ge=0,
        le=1_000_000,
        description="drop groups generated more than this many steps before "
        "the newest published policy version (counted, acknowledged); a group from the newest "
        "published version is never stale, whatever --publish-every is",
    )
    train_zero_variance: bool = Field(
        False,
        description="train on zero-variance groups too (plain GRPO as TRL runs it: zero advantages, but their tokens "
        "count in the loss normalizer and they fill batch places); needs a server with --queue-zero-variance. "
        "Off: they are dropped, as DAPO's dynamic sampling does",
    )
    pull_wait_s: float = Field(5.0, ge=0, le=60, description="seconds one PullTrajectories call waits for a group")
    batch_timeout_s: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="seconds a step keeps pulling to fill batch_groups; then it trains on what came (>= 1 group)",
    )
    prefetch: bool = Field(
        True,
        description="pull the next step's groups on a background thread while this step computes, "
        "so the wait for groups overlaps training (a prefetched group is trained at most one step later)",
    )
    consumer: str = Field(
        "learner",
        min_length=1,
        max_length=128,
        description="consumer name at the server; keep it stable across restarts so unacknowledged groups come back",
    )

    # -- checkpoints and publishing ------------------------------------------------------------
    checkpoint_dir: Path = Field(
        Path("checkpoints"), description="where step-N/ checkpoints go; the learner resumes from the newest complete one"
    )
    publish_every: int = Field(
        1,
        ge=1,
        le=1_000_000,
        description="learner steps between published policy versions "
        "(the weights only, in --publish-dtype, to --publish-dir, then PublishPolicy)",
    )
    background_publish: bool = Field(
        False,
        description="at a publish step copy the weights to CPU and write + announce them on a background "
        "thread while the next step trains (one publish in flight; a failed one raises at the next step; a "
        "checkpoint and the exit wait for it; a torchrun job stays synchronous). Off by default: with it a "
        "version is announced up to a step later than the step that made it, so a worker leasing meanwhile "
        "still gets the previous one, and a caller reading the server's version right after a step sees that; and on a "
        "CPU-only learner the write takes the step's own cores, so the step is no shorter "
        "(overhead.learner_publish_stall_share* in benchmarks/RESULTS.md)",
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        le=1_000_000,
        description="learner steps between full training checkpoints "
        "(weights, optimizer, scheduler, RNG); groups are acknowledged only once a checkpoint "
        "holds their update, so a crash recomputes at most this many steps",
    )
    publish_dir: Path | None = Field(
        None,
        description="where published versions v-N/ go (default CHECKPOINT_DIR/published; "
        "a memory-backed directory such as /dev/shm/prioreplay when workers share the node)",
    )
    publish_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of published weights; auto: the model's own (config.json torch_dtype), not the training dtype"
    )
    keep_published: int = Field(3, ge=1, le=1_000_000, description="newest published versions always kept")
    publish_grace_s: float = Field(
        300.0,
        ge=0,
        le=7 * 86400,
        description="an older version is deleted only this many seconds "
        "after its successor was published (workers that leased it may still be loading it)",
    )
    serve_weights_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="serve the published versions read-only over HTTP "
        "on this port, for workers without the publish directory (0: off)",
    )
    serve_weights_host: str = Field(
        "127.0.0.1",
        min_length=1,
        max_length=255,
        description="address the weights HTTP server binds (0.0.0.0 for workers on other nodes)",
    )
    weights_base_url: str | None = Field(
        None,
        max_length=2048,
        description="URL at which workers reach the publish "
        "directory: versions are announced as URL/v-N/ (default with --serve-weights-port: "
        "http://HOST:PORT, HOST this machine's name for a wildcard bind); unset: the local path",
    )
    keep_checkpoints: int = Field(3, ge=1, le=1_000_000, description="newest complete checkpoints kept (older ones deleted)")
    max_steps: int = Field(
        0, ge=0, le=1_000_000_000, description="stop after this many optimizer steps in total (0: until stopped)"
    )
    stop_grace_s: float = Field(
        45.0,
        gt=0,
        le=86400,
        description="on SIGTERM/SIGINT the step in progress, the last publish and checkpoint get this many seconds; "
        "then the learner abandons them and exits 0 (the step's groups come back on the next start); keep it below "
        "the supervisor's kill delay (60 s in docker-compose.yml and deploy/k8s)",
    )

    # -- observability -------------------------------------------------------------------------
    max_retry_sleep_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="longest back-off sleep while the priority "
        "server or its store is unavailable (doubling from 0.5 s); the learner waits, never exits",
    )
    metrics_port: int = Field(9102, ge=0, le=65535, description="port of /metrics (0 disables)")
    log_file: Path | None = Field(None, description="append one JSON line of metrics per step to this file")
    report_to: ReportTo = Field(
        default_factory=list,
        description="also write each step's scalars to tensorboard and/or wandb (comma list; none by default); "
        "wandb follows WANDB_MODE, WANDB_PROJECT (set WANDB_MODE=offline without a login)",
    )
    report_dir: Path | None = Field(
        None, description="where --report-to writes: DIR/tensorboard and wandb's run folder (default CHECKPOINT_DIR/reports)"
    )
    log_level: LogLevel = "INFO"

    @model_validator(mode="after")
    def _fsdp_without_lora(self):
        if self.parallelism == "fsdp" and self.lora:
            raise ValueError(
                "parallelism ('fsdp') with lora: the adapters are not sharded here; "
                "train LoRA with --parallelism ddp (its weights fit one device), or all weights with fsdp (--no-lora)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_reward_rule(cls, data):
        if isinstance(data, dict) and data.get("truncated") == "zero":
            raise ValueError(
                "truncated ('zero') is a reward rule, which the learner no longer applies: scored 0 here only, "
                "the server's statistics and priorities kept the verifier's reward. Set --truncated-reward "
                "zero on the workers (they report 0, so both agree) and --truncated mask or keep here"
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_sampling_settings(cls, data):
        for name in ("temperature", "top_p"):
            if isinstance(data, dict) and name in data:
                raise ValueError(
                    f"{name} ({data[name]!r}) is not a learner setting: each trajectory group carries the "
                    f"value its completions were sampled at (sampling_{name}) and the learner reads it "
                    f"from there; set --{name.replace('_', '-')} on the workers only"
                )
        return data

    @property
    def loss_settings(self) -> LossSettings:
        """The loss's settings from the ``-- loss`` fields (checked once when the configuration is
        validated, as TRL checks its ``GRPOConfig`` in ``__post_init__``); ``dual_clip_c`` 0 is off.

        Raises:
            InvalidArgument: a value :class:`LossSettings` refuses (the field bounds above make that
                a configuration built without validation, e.g. ``model_copy(update=...)``).
        """
        return LossSettings(
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            aggregation=self.aggregation,
            kl_coef=self.kl_coef,
            dual_clip_c=self.dual_clip_c or None,
            correction=self.off_policy_correction,
            correction_cap=self.correction_cap,
            icepop_band=(self.icepop_low, self.icepop_high),
        )

    def publish_root(self) -> Path:
        """Where published versions ``v-N/`` go: ``publish_dir``, default ``checkpoint_dir/published``."""
        return self.publish_dir or Path(self.checkpoint_dir) / "published"

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        check_role_settings(self.model, self.device, self.log_level)
        if self.weights_base_url is not None and "://" not in self.weights_base_url:
            raise ValueError(
                f"weights_base_url ({self.weights_base_url!r}) must be a URL with a scheme, "
                "e.g. http://learner-0:8000 or s3://bucket/published"
            )
        if 0 < self.dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c ({self.dual_clip_c}) must be > 1 (Ye et al. 2020 use 3), or 0 to turn dual-clip off")
        _ = self.loss_settings  # the loss's settings as the loss will see them, checked at start (a ValueError)
        return self
