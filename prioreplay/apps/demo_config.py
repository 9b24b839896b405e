"""Settings of ``prioreplay demo`` (pydantic and the sampler registry only: ``--help`` stays fast)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from prioreplay.config import PrioreplaySettings
from prioreplay.priority_server.samplers import DEFAULT_SAMPLER, SAMPLER_HELP, SamplerName


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def escape_stop(s: str) -> str:
    """A stop string as a ``--stop`` flag writes it (``\\n``, ``\\t``, ``\\\\``)."""
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unescape_stop(s: str) -> str:
    """The inverse of :func:`escape_stop` (the worker's ``--stop`` reads the same escapes)."""
    chars, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in _ESCAPES:
            chars.append(_ESCAPES[s[i + 1]])
            i += 2
        else:
            chars.append(s[i])
            i += 1
    return "".join(chars)


class DemoConfig(PrioreplaySettings):
    """Run the whole system on this machine: a priority server, W rollout workers and a learner as
    separate processes, training a real model with prioritized sampling, then write a run report.

    The defaults train SmolLM2-135M-Instruct on 64 generated easy arithmetic problems (1-2 digit
    sums and differences, 1-digit products: the model is right about a fifth of the time, so
    many groups are mixed) with a budget of 768 rollouts, three passes over the dataset at G = 4,
    so prioritized sampling has revisits to prioritize (docs/BENCHMARKS.md, "Choosing the demo's
    defaults"). Completions end at a newline.
    """

    model: str = Field("smollm2-135m", description="model alias, local directory or cached Hugging Face id")
    dataset: str = Field("arithmetic:64:0:easy", description="any `prioreplay load` source, e.g. a GSM8K .jsonl file")
    eval_dataset: str | None = Field(
        None, description="held-out evaluation source (default: the same kind of data with another seed, or the GSM8K test split)"
    )
    eval_size: int = Field(128, ge=0, le=10_000, description="held-out problems scored before and after training (0 skips)")
    steps: int = Field(1000, ge=1, le=1_000_000, description="learner steps (optimizer updates) at most")
    rollouts: int = Field(768, ge=0, le=10**12, description="end the run once this many completions were "
                          "reported (the rollout budget; 0: learner steps only)")
    workers: int = Field(1, ge=1, le=64, description="rollout worker processes W")
    sampler: SamplerName = Field(DEFAULT_SAMPLER, description=SAMPLER_HELP)
    group_size: int = Field(4, ge=1, le=64, description="completions per problem G")
    batch_size: int = Field(8, ge=1, le=4096, description="problems per worker lease B")
    batch_groups: int = Field(4, ge=1, le=4096, description="groups per learner step")
    max_new_tokens: int = Field(24, ge=1, le=4096, description="tokens generated per completion at most")
    stop: list[str] = Field(["\n"], description="strings that end a completion, for the workers and "
                            "the held-out scoring (e.g. a newline after an 'Answer: N' line)")
    temperature: float = Field(0.7, gt=0, le=10, description="sampling temperature (workers and learner)")
    lr: float = Field(1e-5, gt=0, le=1, description="learning rate (AdamW)")
    max_staleness: int = Field(4, ge=0, le=1000, description="drop groups more than this many policy versions old")
    publish_every: int = Field(1, ge=1, le=1_000_000, description="learner steps between published policy versions")
    retest_fraction: float = Field(0.1, ge=0, le=1, description="share of each batch retesting the solved/unsolved pools")
    retest_interval: int = Field(4, ge=0, le=1_000_000, description="batches a pooled problem waits before a retest")
    seed: int = Field(0, description="seeds the sampler, the workers and the learner")
    redis_url: str | None = Field(None, description="use this Redis (redis://HOST:PORT/DB) instead of the embedded memory store")
    run_dir: Path | None = Field(None, description="where the run goes (default runs/<sampler>-<date>)")
    threads: int = Field(0, ge=0, le=256, description="torch threads per child process (0: cores shared out)")
    timeout_s: float = Field(3600.0, gt=0, description="give up (and stop everything) after this many seconds")
    log_level: str = Field("INFO", description="log level of the child processes")

    @field_validator("stop")
    @classmethod
    def _unescape(cls, v: list[str]) -> list[str]:
        return [unescape_stop(s) for s in v]

    @model_validator(mode="after")
    def _check(self) -> "DemoConfig":
        from prioreplay.errors import InvalidArgument

        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://")):
            raise InvalidArgument(f"redis_url ({self.redis_url!r}) must look like redis://HOST:PORT/DB")
        if any(not s for s in self.stop):
            raise InvalidArgument(f"stop ({self.stop!r}) must hold non-empty strings; write a newline as '\\n'")
        return self
