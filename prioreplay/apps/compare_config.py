"""Settings of ``prioreplay compare`` (pydantic and the sampler registry only: ``--help`` stays fast)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from prioreplay.apps.demo_config import DemoRunSettings, worker_seed
from prioreplay.config import SEED_MAX
from prioreplay.priority_server import samplers as _samplers


def default_samplers() -> list[str]:
    """The registry's default sampler, then ``heap`` and ``uniform`` (duplicates dropped), so a
    new default sampler is compared with the paper's and the baseline without a flag."""
    from prioreplay.priority_server.config import ServerConfig

    default = getattr(_samplers, "DEFAULT_SAMPLER", None) or ServerConfig.model_fields["sampler"].default
    return list(dict.fromkeys([default, "heap", "uniform"]))


class CompareConfig(DemoRunSettings):
    """Run ``prioreplay demo`` once per sampler and seed, one after another, with the same model,
    data, seed and rollout budget, then write ``compare.json`` and ``compare.png``.

    Every arm is a normal demo run directory under the compare directory
    (``<sampler>-seed<k>``). ``--runs DIR ...`` compares finished demo runs instead; runs whose
    settings differ in anything but the sampler and the seed are refused.
    """

    samplers: list[str] = Field(
        default_factory=default_samplers,
        description="samplers to compare (comma list or repeated flag; default: the registry's default, heap and uniform)",
    )
    seeds: int = Field(3, ge=1, le=100, description="runs per sampler, seeds seed .. seed+N-1 (intervals across seeds)")
    parallel: int = Field(
        1,
        ge=1,
        le=64,
        description="arms run at once, each as its own `prioreplay demo` process "
        "(1: one after another; more needs cores and about 3.5 GB of memory per arm for SmolLM2)",
    )
    runs: list[Path] = Field(
        default_factory=list, description="compare these finished demo run directories instead of running new arms"
    )
    run_dir: Path | None = Field(None, description="where the comparison goes (default runs/compare-<date>)")

    @model_validator(mode="after")
    def _check_samplers(self) -> CompareConfig:
        from prioreplay.errors import InvalidArgument

        names = [s.strip() for item in self.samplers for s in item.split(",") if s.strip()]
        unknown = [s for s in names if s not in _samplers.SAMPLERS]
        if unknown:
            raise InvalidArgument(f"unknown sampler(s) {', '.join(unknown)}; choose from {', '.join(_samplers.SAMPLERS)}")
        if len(set(names)) < 2 and not self.runs:
            raise InvalidArgument(f"compare needs two or more different samplers (got {names})")
        self.samplers = list(dict.fromkeys(names))
        if worker_seed(self.seed + self.seeds - 1, self.workers - 1) > SEED_MAX:
            raise InvalidArgument(
                f"seed ({self.seed}) with seeds ({self.seeds}) gives the last arm's workers seeds over "
                f"{SEED_MAX}, the largest seed; lower --seed"
            )
        return self
