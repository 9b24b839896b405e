"""The GRPO loss's settings, checked once when they are made (the standard library only, no torch).

As TRL checks its ``GRPOConfig`` in ``__post_init__``, :class:`LossSettings` refuses a bad value
when it is built, naming the value and the fix: the learner builds it from its configuration at
start (:attr:`~.config.LearnerConfig.loss_settings`), and :func:`~.loss.grpo_loss` then checks only
its tensors' shapes on each micro-batch. The formulas each setting enters are in the docstrings of
:mod:`~.loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from prioreplay.errors import InvalidArgument

Aggregation = Literal["token-mean", "seq-mean"]
Correction = Literal["none", "tis", "mis-token", "mis-sequence", "icepop"]

#: The off-policy corrections (``LossSettings.correction``; docs/OFFPOLICY.md).
CORRECTIONS: tuple[str, ...] = get_args(Correction)

#: The default correction and cap: token-level truncated importance sampling at C = 2 (Yao et al.
#: 2025 use C = 2; verl's rollout correction, slime's ``--use-tis`` and OpenRLHF's vLLM IS
#: correction default to token-level truncation at 2). It never drops a token (unlike MIS or
#: IcePop) and is the correction the most peers ship on by default.
DEFAULT_CORRECTION: Correction = "tis"
DEFAULT_CORRECTION_CAP = 2.0
#: IcePop's band [a, b] on w (Ring-1T report, 2025, use α = 0.5, β = 5).
DEFAULT_ICEPOP_BAND = (0.5, 5.0)

#: The dual-clip cap c on the ratio for negative advantages (Ye et al. 2020 use 3).
DUAL_CLIP_C = 3.0


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """How :func:`~.loss.grpo_loss` turns log-probs and advantages into a loss; frozen, checked when made.

    Attributes:
        eps_low, eps_high: the clip range [1 − eps_low, 1 + eps_high] on the ratio (PPO's clip with
            DAPO's decoupled "clip-higher" bounds); 0 <= eps_low < 1, eps_high >= 0.
        aggregation: ``"token-mean"`` (every valid token of the batch weighs the same, DAPO) or
            ``"seq-mean"`` (each sequence averaged over its tokens, then over sequences, GRPO).
        kl_coef: weight (>= 0) of the k3 KL to the reference policy; > 0 needs the reference's
            log-probs in each call.
        dual_clip_c: the dual-clip cap c (> 1, finite) on the ratio for negative advantages, or
            None for plain PPO clipping (default ``DUAL_CLIP_C`` = 3, Ye et al. 2020).
        correction: the off-policy correction, one of ``CORRECTIONS`` (default ``"tis"``).
        correction_cap: C > 1 (finite): the truncation (``tis``) or the band [1/C, C]
            (``mis-token``, ``mis-sequence``) on the importance weight w.
        icepop_band: (a, b) with 0 < a < 1 < b (finite): IcePop's band on w.

    Raises:
        InvalidArgument: any value out of its range above, naming it and the fix.
    """

    #: Not a configuration users set: a value derived from :class:`~.config.LearnerConfig`'s ``-- loss``
    #: fields (:attr:`~.config.LearnerConfig.loss_settings`), whose bounds are the declared ones.
    derived_from: ClassVar[str] = "LearnerConfig"

    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: Aggregation = "token-mean"
    kl_coef: float = 0.0
    dual_clip_c: float | None = DUAL_CLIP_C
    correction: Correction = DEFAULT_CORRECTION
    correction_cap: float = DEFAULT_CORRECTION_CAP
    icepop_band: tuple[float, float] = DEFAULT_ICEPOP_BAND

    def __post_init__(self) -> None:
        if self.aggregation not in get_args(Aggregation):
            raise InvalidArgument(f"aggregation ({self.aggregation!r}) must be 'token-mean' or 'seq-mean'")
        if not (0.0 <= self.eps_low < 1.0) or not self.eps_high >= 0.0:
            raise InvalidArgument(
                f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got eps_low={self.eps_low}, eps_high={self.eps_high}"
            )
        if not self.kl_coef >= 0.0:
            raise InvalidArgument(f"kl_coef ({self.kl_coef}) must be >= 0")
        c = self.dual_clip_c
        if c is not None and not (math.isfinite(c) and c > 1.0):
            raise InvalidArgument(
                f"dual_clip_c ({c}) must be a finite number > 1 (Ye et al. 2020 use 3), or None to turn dual-clip off"
            )
        if self.correction not in CORRECTIONS:
            raise InvalidArgument(f"correction ({self.correction!r}) must be one of {', '.join(CORRECTIONS)}")
        if not (math.isfinite(self.correction_cap) and self.correction_cap > 1.0):
            raise InvalidArgument(f"correction_cap ({self.correction_cap}) must be a finite number > 1 (Yao et al. 2025 use 2)")
        lo, hi = self.icepop_band
        if not (0.0 < lo < 1.0 < hi and math.isfinite(hi)):
            raise InvalidArgument(f"icepop_band ({self.icepop_band}) must be (a, b) with 0 < a < 1 < b (Ring-1T use (0.5, 5))")
