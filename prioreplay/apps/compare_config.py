"""Settings of ``prioreplay compare`` (pydantic and the sampler registry only: ``--help`` stays fast)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from prioreplay.apps.demo_config import DemoRunSettings, worker_seed
from prioreplay.config import SEED_MAX
from prioreplay.priority_server import samplers as _samplers

#: Arms beyond the samplers: a sampler run with other server settings, by name. The rows are the
#: retest settings the decision rule (docs/METHOD.md, "How a default is chosen") judges against the same sampler
#: without them (``heap-version-retests``: the paper's heap with retests due one policy version
#: after a problem's last test, ``--retest-versions 1``).
#: The baselines (docs/METHOD.md, "How the figures are measured"): ``grpo`` is plain GRPO as TRL
#: runs it, uniform problems with every group in the learner's batch, zero-variance ones included
#: (the server queues them, the learner trains on their zero advantages); ``dapo`` is ``uniform`` as
#: every other arm runs, zero-variance groups dropped and the batch filled with further mixed
#: groups (DAPO's dynamic sampling). ``--samplers uniform`` names the ``dapo`` arm.
SETTING_ARMS: dict[str, tuple[str, dict[str, int | bool | float]]] = {
    "heap-version-retests": ("heap", {"retest_versions": 1}),
    "grpo": ("uniform", {"queue_zero_variance": True, "train_zero_variance": True}),
    "dapo": ("uniform", {"queue_zero_variance": False, "train_zero_variance": False}),
    # pools from evidence (rules.evidence_groups: k by G) with retests by policy version, and without
    "heap-evidence": ("heap", {"pool_evidence": 0, "retest_versions": 1}),
}

#: Arm names that mean another arm (``uniform`` run by compare is DAPO-style filtering).
ARM_ALIASES = {"uniform": "dapo"}


def arm_settings(arm: str) -> tuple[str, dict[str, int | bool | float]]:
    """The sampler and the server settings of arm ``arm`` (a sampler name: that sampler, no more)."""
    return SETTING_ARMS.get(arm, (arm, {}))


def arm_name(config: dict) -> str:
    """The arm a demo run's ``config`` belongs to: a :data:`SETTING_ARMS` row whose sampler and
    settings it has, else its sampler (``<sampler>-retest-versions-<k>`` when it ran with retests by
    policy version that no row names, ``-pool-evidence-<k>`` / ``-age-decay-<g>`` likewise). The row
    naming the most settings wins. Runs made before a setting existed lack it: as its default."""
    sampler = config["sampler"]
    for name, (arm_sampler, settings) in sorted(SETTING_ARMS.items(), key=lambda kv: -len(kv[1][1])):
        if sampler == arm_sampler and all(config.get(k) == v for k, v in settings.items()):
            return name
    k = config.get("retest_versions") or 0
    name = f"{sampler}-retest-versions-{k}" if k else sampler
    if config.get("pool_evidence", 1) != 1:
        name += f"-pool-evidence-{config['pool_evidence']}"
    if config.get("age_decay", 1.0) != 1.0:
        name += f"-age-decay-{config['age_decay']:g}"
    if config.get("heap_age_decay", 1.0) != 1.0:
        name += f"-heap-age-decay-{config['heap_age_decay']:g}"
    return name


def default_samplers() -> list[str]:
    """The registry's default sampler, then ``heap``, ``dapo`` and ``grpo`` (duplicates dropped), so
    a new default sampler is compared with the paper's and both baselines without a flag."""
    from prioreplay.priority_server.config import ServerConfig

    default = getattr(_samplers, "DEFAULT_SAMPLER", None) or ServerConfig.model_fields["sampler"].default
    return list(dict.fromkeys([default, "heap", "dapo", "grpo"]))


class CompareConfig(DemoRunSettings):
    """Run ``prioreplay demo`` once per sampler and seed, one after another, with the same model,
    data, seed and rollout budget, then write ``compare.json`` and ``compare.png``.

    Every arm is a normal demo run directory under the compare directory
    (``<sampler>-seed<k>``). ``--runs DIR ...`` compares finished demo runs instead; runs whose
    settings differ in anything but the sampler and the seed are refused.
    """

    samplers: list[str] = Field(
        default_factory=default_samplers,
        description="samplers to compare (comma list or repeated flag; default: the registry's default, heap, dapo and "
        f"grpo); also the arms {', '.join(SETTING_ARMS)} (grpo: plain GRPO, zero-variance groups trained; dapo = uniform: "
        "zero-variance groups dropped; others: a sampler with other retest settings)",
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
        unknown = [s for s in names if s not in _samplers.SAMPLERS and s not in SETTING_ARMS]
        if unknown:
            raise InvalidArgument(
                f"unknown sampler(s) {', '.join(unknown)}; choose from {', '.join([*_samplers.SAMPLERS, *SETTING_ARMS])}"
            )
        if len({ARM_ALIASES.get(n, n) for n in names}) < 2 and not self.runs:
            raise InvalidArgument(f"compare needs two or more different samplers (got {names})")
        self.samplers = list(dict.fromkeys(ARM_ALIASES.get(n, n) for n in names))
        if worker_seed(self.seed + self.seeds - 1, self.workers - 1) > SEED_MAX:
            raise InvalidArgument(
                f"seed ({self.seed}) with seeds ({self.seeds}) gives the last arm's workers seeds over "
                f"{SEED_MAX}, the largest seed; lower --seed"
            )
        return self
