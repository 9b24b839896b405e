"""Settings of ``prioreplay compare`` (pydantic and the sampler registry only: ``--help`` stays fast)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from prioreplay.apps.demo_config import DemoRunSettings, worker_seed
from prioreplay.config import SEED_MAX, setting
from prioreplay.priority_server import samplers as _samplers

#: Arms beyond the samplers: a sampler run with other server settings, by name. The rows are the
#: retest settings the decision rule (docs/METHOD.md, "How a default is chosen") judges against the same sampler
#: without them (``heap-version-retests``: the paper's heap with retests due one policy version
#: after a problem's last test, ``--retest-versions 1``).
#: The baselines as the literature runs them (docs/METHOD.md, "How the figures are measured"), each
#: under the pace bound every compared run has (``--pace-batches``, 1 by default: nothing generated
#: goes stale): ``grpo`` is plain GRPO as TRL runs it: uniform problems, every generated group
#: queued and trained once, in report order, zero-variance ones included (their advantages are zero);
#: ``dapo`` is DAPO's dynamic sampling: uniform problems, zero-variance groups filtered at
#: generation (the server does not queue them, their place in the bound is leased again at once) until
#: a learner batch of mixed groups is queued, then one step. ``heap-grpo`` is the paper's heap with
#: GRPO's training rule (zero-variance groups queued and trained), so that prioritization is
#: measured apart from filtering; ``heap-prior`` is the heap with unseen problems at the fitted
#: population prior (``--unseen-prior fit``, prioreplay/unseen_prior.py). ``--samplers uniform``
#: names the ``dapo`` arm.
SETTING_ARMS: dict[str, tuple[str, dict[str, int | bool | float | str]]] = {
    "heap-version-retests": ("heap", {"retest_versions": 1}),
    "grpo": ("uniform", {"queue_zero_variance": True, "train_zero_variance": True}),
    "dapo": ("uniform", {"queue_zero_variance": False, "train_zero_variance": False}),
    "heap-grpo": ("heap", {"queue_zero_variance": True, "train_zero_variance": True}),
    # pools from evidence (rules.evidence_groups: k by G) with retests by policy version, and without
    "heap-evidence": ("heap", {"pool_evidence": 0, "retest_versions": 1}),
    # unseen problems at the fitted population prior (prioreplay/unseen_prior.py), not at the top
    "heap-prior": ("heap", {"unseen_prior": "fit"}),
}

#: Arm names that mean another arm (``uniform`` run by compare is DAPO-style filtering).
ARM_ALIASES = {"uniform": "dapo"}


#: Separates an arm from the learner's off-policy correction it runs with: ``heap+icepop`` is the arm
#: ``heap`` with ``--off-policy-correction icepop`` (docs/OFFPOLICY.md, "Does it pay?").
CORRECTION_SEP = "+"


def default_correction() -> str:
    """The learner's default ``--off-policy-correction`` (an arm running it carries no suffix)."""
    from prioreplay.learner.config import LearnerConfig

    return LearnerConfig.model_fields["off_policy_correction"].default


def corrections() -> tuple[str, ...]:
    """The learner's off-policy corrections, as ``--off-policy-correction`` spells them."""
    from typing import get_args

    from prioreplay.learner.config import OffPolicyCorrection

    return get_args(OffPolicyCorrection)


def arm_settings(arm: str) -> tuple[str, dict[str, int | bool | float | str]]:
    """The sampler and the settings of arm ``arm``: a sampler name (that sampler, no more), a row of
    :data:`SETTING_ARMS`, either with ``+<correction>`` (``heap+icepop``: also that learner correction)."""
    base, sep, correction = arm.partition(CORRECTION_SEP)
    sampler, settings = SETTING_ARMS.get(base, (base, {}))
    return sampler, {**settings, "off_policy_correction": correction} if sep else dict(settings)


def canonical_arm(arm: str, correction: str) -> str:
    """The name :func:`arm_name` gives the runs of ``arm`` in a comparison run with ``--off-policy-correction
    correction``: the correction suffix is kept only where it is not the learner's default
    (``heap+tis`` is ``heap``; ``heap`` under ``--off-policy-correction none`` is ``heap+none``)."""
    base, _, own = arm.partition(CORRECTION_SEP)
    base = ARM_ALIASES.get(base, base)
    chosen = own or correction
    return base if chosen == default_correction() else f"{base}{CORRECTION_SEP}{chosen}"


def arm_name(config: dict) -> str:
    """The arm a demo run's ``config`` belongs to: a :data:`SETTING_ARMS` row whose sampler and
    settings it has, else its sampler (``<sampler>-retest-versions-<k>`` when it ran with retests by
    policy version that no row names, ``-pool-evidence-<k>`` / ``-age-decay-<g>`` / ``-unseen-prior-<v>`` likewise). The row
    naming the most settings wins. A learner correction other than the default adds
    ``+<correction>``. Runs made before a setting existed lack it: as its default."""
    correction = config.get("off_policy_correction") or default_correction()
    suffix = "" if correction == default_correction() else f"{CORRECTION_SEP}{correction}"
    return _server_arm_name(config) + suffix


def _server_arm_name(config: dict) -> str:
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
    if config.get("unseen_prior", "off") != "off":
        name += f"-unseen-prior-{config['unseen_prior']}"
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
    (``<sampler>-seed<k>``). ``--runs DIR,DIR,...`` (or the flag repeated) compares finished demo runs instead; runs whose
    settings differ in anything but the sampler and the seed are refused.
    """

    #: Settings whose compare default is not a demo run's, and why (tests/unit/config/test_settings.py reads it).
    own_defaults: ClassVar[dict[str, str]] = {
        **DemoRunSettings.own_defaults,
        "keep_trainer_state": "a comparison reads its arms' reports and never resumes them: each keeps its final "
        "weights (0.5 GB for SmolLM2) and drops the optimizer state (1.6 GB)",
    }

    samplers: list[str] = Field(
        default_factory=default_samplers,
        description="samplers to compare (comma list or repeated flag; default: the registry's default, heap, dapo and "
        f"grpo); also the arms {', '.join(SETTING_ARMS)} (grpo: plain GRPO, zero-variance groups trained; dapo = uniform: "
        "zero-variance groups dropped; others: a sampler with other retest settings); any of them with "
        f"{CORRECTION_SEP}<correction> runs the learner with that --off-policy-correction (heap{CORRECTION_SEP}none, "
        f"heap{CORRECTION_SEP}icepop)",
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
        default_factory=list,
        description="compare these finished demo run directories instead of running new arms (comma list or repeated flag)",
    )
    target_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="rollouts to target without --target-accuracy: the target is grpo's held-out accuracy at this "
        "fraction of the rollout budget, averaged over grpo's other seeds (0.5: the budget is 2R and the target is read "
        "at R, so the second half of every curve shows a plateau; 1: at the full budget)",
    )
    target_accuracy: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="rollouts to target: the held-out accuracy every arm's rollouts are counted to, fixed before the runs "
        "(write it in the plan). Unset: each seed's target is grpo's mean accuracy at --target-fraction of the budget over "
        "its other seeds (needs grpo runs of >= 2 seeds), never the arms' own curves",
    )
    run_dir: Path | None = Field(None, description="where the comparison goes (default runs/compare-<date>)")
    keep_trainer_state: bool = setting(DemoRunSettings, "keep_trainer_state", False)

    @model_validator(mode="after")
    def _check_samplers(self) -> CompareConfig:
        from prioreplay.errors import InvalidArgument

        names = [s.strip() for item in self.samplers for s in item.split(",") if s.strip()]
        unknown = [s for s in names if (b := s.partition(CORRECTION_SEP)[0]) not in _samplers.SAMPLERS and b not in SETTING_ARMS]
        if unknown:
            raise InvalidArgument(
                f"unknown sampler(s) {', '.join(unknown)}; choose from {', '.join([*_samplers.SAMPLERS, *SETTING_ARMS])}"
                f", each optionally with {CORRECTION_SEP}<correction>"
            )
        bad = [s for s in names if CORRECTION_SEP in s and s.partition(CORRECTION_SEP)[2] not in corrections()]
        if bad:
            raise InvalidArgument(
                f"arm(s) {', '.join(bad)}: the part after {CORRECTION_SEP!r} must be an off-policy correction, one of "
                f"{', '.join(corrections())} (e.g. heap{CORRECTION_SEP}icepop)"
            )
        arms = list(dict.fromkeys(canonical_arm(n, self.off_policy_correction) for n in names))
        if len(arms) < len(names) and len(arms) < 2 and not self.runs:  # names that are one arm: a slip
            raise InvalidArgument(f"compare needs two or more different samplers (got {names}, one arm)")
        # one name alone runs that arm: a plan's missing (seed, arm), put beside the rest with --runs
        self.samplers = arms
        if worker_seed(self.seed + self.seeds - 1, self.workers - 1) > SEED_MAX:
            raise InvalidArgument(
                f"seed ({self.seed}) with seeds ({self.seeds}) gives the last arm's workers seeds over "
                f"{SEED_MAX}, the largest seed; lower --seed"
            )
        return self
