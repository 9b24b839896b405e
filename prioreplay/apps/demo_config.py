"""Settings of ``prioreplay demo`` (pydantic and the roles' settings modules only: ``--help`` stays fast).

The demo passes most of its settings on to the server, the workers and the learner, so it does
not declare them again: each such field is the role's own declaration (bounds and help), taken
with :func:`prioreplay.config.setting`; where the demo's default differs (a small CPU run), the
field and the reason are in :attr:`DemoConfig.own_defaults`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from prioreplay.config import SEED_MAX, LogLevel, PrioreplaySettings, Seed, setting
from prioreplay.learner.config import LearnerConfig, OffPolicyCorrection
from prioreplay.priority_server.config import ServerConfig, UnseenPrior
from prioreplay.priority_server.samplers import SamplerName
from prioreplay.reporting import ReportTo
from prioreplay.rollout_worker.config import StopStrings, WorkerConfig, escape_stop, unescape_stop  # noqa: F401 - demo and compare write --stop

#: Worker w of a run with seed s generates with seed s * WORKER_SEED_STRIDE + w (< 64 workers).
WORKER_SEED_STRIDE = 1000


def worker_list_flags(cfg: DemoRunSettings) -> list[str]:
    """A demo worker's flags beyond ``--name value``: ``--stop`` (escaped) and ``--reward`` repeated,
    ``--reward-weights`` joined, and ``--pass-threshold`` (docs/REWARDS.md)."""
    args = [a for s in cfg.stop for a in ("--stop", escape_stop(s))]
    args += [a for r in cfg.reward for a in ("--reward", r)]
    if cfg.reward_weights:
        args += ["--reward-weights", ",".join(repr(w) for w in cfg.reward_weights)]
    return [*args, "--pass-threshold", repr(cfg.pass_threshold)]


def worker_seed(seed: int, worker: int) -> int:
    """The generation seed of worker ``worker`` (0-based) in a demo run with ``seed``."""
    return seed * WORKER_SEED_STRIDE + worker


def namespace_for(run_dir: Path) -> str:
    """A fresh store namespace for a run in ``run_dir``: ``demo-<dir name>-<8 hex>``, the characters a
    namespace may not hold (the ``+`` of a compare arm ``heap+tis``) as ``_``, at most 114 characters."""
    return f"demo-{re.sub(r'[^A-Za-z0-9_.:-]', '_', run_dir.name)[:100]}-{os.urandom(4).hex()}"


#: The interpreter of vLLM's environment (``make install-vllm``, docs/VLLM.md), relative to the working
#: directory: the demo's workers run there with ``--backend vllm`` unless ``--worker-python`` names another.
VLLM_PYTHON = Path(".venv-vllm/bin/python")


class DemoRunSettings(PrioreplaySettings):
    """The settings of one demo run but the sampler: ``prioreplay demo`` adds one sampler
    (:class:`DemoConfig`), ``prioreplay compare`` a list of them (``CompareConfig``)."""

    #: Settings whose demo default is not the role's, and why (tests/unit/config/test_settings.py reads it).
    own_defaults: ClassVar[dict[str, str]] = {
        "group_size": "G = 4 keeps a CPU run to minutes (demo_defaults.* in benchmarks/RESULTS.md)",
        "batch_groups": "4 groups per step: a learner step every lease of the one default worker",
        "max_new_tokens": "an arithmetic answer is a few tokens; 24 bounds a CPU run's generation",
        "stop": "completions end at a newline, after the 'Answer: N' line",
        "temperature": "0.7: SmolLM2 at 1.0 rarely answers arithmetic, so fewer groups are mixed",
        "lr": "1e-5: a few hundred rollouts must move a 135M model visibly",
        "pace_batches": "1: generation at most one learner batch ahead of the CPU learner, so nothing generated goes "
        "stale and every arm trains what it generates (docs/METHOD.md, 'How the figures are measured')",
    }

    model: str = setting(WorkerConfig, "model")
    dataset: str = Field("arithmetic:64:0:easy", description="any `prioreplay load` source, e.g. a GSM8K .jsonl file")
    eval_dataset: str | None = Field(
        None, description="held-out evaluation source (default: the same kind of data with another seed, or the GSM8K test split)"
    )
    eval_size: int = Field(128, ge=0, le=10_000, description="held-out problems scored before and after training (0 skips)")
    steps: int = Field(1000, ge=1, le=1_000_000, description="learner steps (optimizer updates) at most")
    rollouts: int = Field(
        768,
        ge=0,
        le=10**12,
        description="end the run once this many completions were reported (the rollout budget; 0: learner steps only)",
    )
    completion_tokens: int = Field(
        0,
        ge=0,
        le=10**15,
        description="end the run once the workers generated this many completion tokens (the token budget; 0: none)",
    )
    eval_points: int = Field(
        0,
        ge=0,
        le=64,
        description="held-out evaluations during the run at N evenly spaced marks of the budget, besides before and after "
        "(the report's heldout_curve; compare reads rollouts to target off it with N >= 3: >= 5 points a run)",
    )
    pool_audit: bool = Field(
        True, description="at the end, score every pooled problem with the final policy (G samples) and report the misfiled share"
    )
    keep_trainer_state: bool = Field(
        True,
        description="keep the final checkpoint's optimizer state with its weights (checkpoints/step-N, about 1.6 GB for "
        "SmolLM2-135M: what `prioreplay learner` needs to resume the run); without it only the final published weights "
        "stay (about 0.5 GB)",
    )
    workers: int = Field(1, ge=1, le=64, description="rollout worker processes W")
    # -- the server's settings -----------------------------------------------------------------
    retest_fraction: float = setting(ServerConfig, "retest_fraction")
    retest_interval: int = setting(ServerConfig, "retest_interval")
    retest_versions: int = setting(ServerConfig, "retest_versions")
    queue_zero_variance: bool = setting(ServerConfig, "queue_zero_variance")
    pool_evidence: int = setting(ServerConfig, "pool_evidence")
    warm_start: str = setting(ServerConfig, "warm_start")
    warm_start_shrink: float = setting(ServerConfig, "warm_start_shrink")
    age_decay: float = setting(ServerConfig, "age_decay")
    heap_age_decay: float = setting(ServerConfig, "heap_age_decay")
    unseen_prior: UnseenPrior = setting(ServerConfig, "unseen_prior")
    pace_batches: int = setting(ServerConfig, "pace_batches", 1)
    # -- the workers' settings -----------------------------------------------------------------
    backend: Literal["transformers", "vllm"] = setting(WorkerConfig, "backend")
    worker_python: Path | None = Field(
        None,
        description="the Python that runs the workers (default: this one; with --backend vllm: "
        f"{VLLM_PYTHON}, the environment `make install-vllm` builds, where vLLM's own pins live)",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = setting(WorkerConfig, "dtype")
    group_size: int = setting(WorkerConfig, "group_size", 4)
    batch_size: int = setting(WorkerConfig, "batch_size")
    max_new_tokens: int = setting(WorkerConfig, "max_new_tokens", 24)
    stop: StopStrings = setting(WorkerConfig, "stop", ["\n"])  # pydantic copies a list default per instance
    temperature: float = setting(WorkerConfig, "temperature", 0.7)
    reward: list[str] = setting(WorkerConfig, "reward")
    reward_weights: list[float] = setting(WorkerConfig, "reward_weights")
    pass_threshold: float = setting(WorkerConfig, "pass_threshold")
    # -- the learner's settings ----------------------------------------------------------------
    batch_groups: int = setting(LearnerConfig, "batch_groups", 4)
    lr: float = setting(LearnerConfig, "lr", 1e-5)
    max_staleness: int = setting(LearnerConfig, "max_staleness")
    off_policy_correction: OffPolicyCorrection = setting(LearnerConfig, "off_policy_correction")
    correction_cap: float = setting(LearnerConfig, "correction_cap")
    kl_coef: float = setting(LearnerConfig, "kl_coef")
    train_zero_variance: bool = setting(LearnerConfig, "train_zero_variance")
    publish_every: int = setting(LearnerConfig, "publish_every")
    report_to: ReportTo = setting(LearnerConfig, "report_to")
    # -- the run -------------------------------------------------------------------------------
    seed: Seed = Field(0, description="seeds the sampler, the workers and the learner")
    redis_url: str | None = Field(None, description="use this Redis (redis://HOST:PORT/DB) instead of the embedded memory store")
    run_dir: Path | None = Field(None, description="where the run goes (default runs/<sampler>-<date>)")
    threads: int = Field(0, ge=0, le=256, description="torch threads per child process (0: cores shared out)")
    timeout_s: float = Field(3600.0, gt=0, description="give up (and stop everything) after this many seconds")
    log_level: LogLevel = "INFO"

    @model_validator(mode="after")
    def _check(self) -> DemoRunSettings:
        from prioreplay.errors import InvalidArgument

        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://")):
            raise InvalidArgument(f"redis_url ({self.redis_url!r}) must look like redis://HOST:PORT/DB")
        if any(not s for s in self.stop):
            raise InvalidArgument(f"stop ({self.stop!r}) must hold non-empty strings; write a newline as '\\n'")
        if worker_seed(self.seed, self.workers - 1) > SEED_MAX:
            raise InvalidArgument(
                f"seed ({self.seed}) must be <= {(SEED_MAX - self.workers + 1) // WORKER_SEED_STRIDE}: "
                f"the workers' seeds (seed x {WORKER_SEED_STRIDE} + worker) must stay <= {SEED_MAX}"
            )
        from prioreplay.rewards import RewardSet, parse_specs

        RewardSet(parse_specs(self.reward, self.reward_weights)).check_imports()  # before any process starts
        return self


class DemoConfig(DemoRunSettings):
    """Run the whole system on this machine: a priority server, W rollout workers and a learner as
    separate processes, training a real model with prioritized sampling, then write a run report.

    The defaults train SmolLM2-135M-Instruct on 64 generated easy arithmetic problems (1-2 digit
    sums and differences, 1-digit products: the model is right about a fifth of the time, so
    many groups are mixed) with a budget of 768 rollouts, three passes over the dataset at G = 4,
    so prioritized sampling has revisits to prioritize (``demo_defaults.*`` in
    benchmarks/RESULTS.md). Completions end at a newline.
    """

    sampler: SamplerName = setting(ServerConfig, "sampler")


def resolve_worker_python(cfg: DemoRunSettings) -> str:
    """The interpreter the demo's workers run under: ``--worker-python``, else :data:`VLLM_PYTHON`
    with ``--backend vllm`` (vLLM's CPU build pins another transformers than ours, so it lives in its
    own environment, docs/VLLM.md), else this one.

    Raises:
        InvalidArgument: ``--backend vllm`` and that interpreter is missing or has no ``vllm`` package
            (the message names the path and the fix: ``make install-vllm`` or ``--worker-python``).
    """
    import subprocess
    import sys

    from prioreplay.errors import InvalidArgument

    if cfg.worker_python is None and cfg.backend != "vllm":
        return sys.executable
    python = cfg.worker_python or VLLM_PYTHON
    if cfg.backend == "vllm":
        has_vllm = python.exists() and (
            subprocess.run(
                [str(python), "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                capture_output=True,
                timeout=120,
            ).returncode
            == 0
        )
        if not has_vllm:
            raise InvalidArgument(
                f"--backend vllm: the worker Python {str(python)!r} "
                + ("has no vllm package" if python.exists() else "does not exist")
                + f"; run `make install-vllm` (vLLM's CPU build in {VLLM_PYTHON.parent.parent}), or pass "
                "--worker-python PATH to an interpreter where vllm and prioreplay are installed (docs/VLLM.md)"
            )
    elif not python.exists():
        raise InvalidArgument(f"worker_python ({str(python)!r}) does not exist; give the path of a Python interpreter")
    return str(python)
