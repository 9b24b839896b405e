"""Group-relative advantages and the clipped GRPO policy-gradient loss.

Pure torch, no model: every function takes tensors and returns tensors, so the maths is tested on
hand-computed tiny inputs (``tests/unit/test_grpo_loss.py``).

Notation: N groups of G completions each; B = N·G sequences; T token positions (padded). The
mask marks completion tokens; prompt and padding positions never contribute.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from prioreplay.errors import InvalidArgument
from prioreplay.learner import policy
from prioreplay.learner.batch import Batch, token_logprobs

AdvantageMode = Literal["grpo", "drgrpo"]
Aggregation = Literal["token-mean", "seq-mean"]

#: Log-ratios are clamped to ±this before ``exp`` (e^20 ≈ 4.9e8): no overflow to inf, and such a
#: token is far outside the clip range anyway.
MAX_LOG_RATIO = 20.0

#: The dual-clip cap c on the ratio for negative advantages (Ye et al. 2020 use 3).
DUAL_CLIP_C = 3.0


def group_advantages(rewards: torch.Tensor, mode: AdvantageMode = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages of N groups of G completions.

    ``grpo``: A_i = (r_i − mean(r)) / (std(r) + eps), GRPO's outcome-supervision advantage
    (Shao et al. 2024, DeepSeekMath, §4.1.2). ``std`` is the population standard deviation
    (divides by G), so for binary rewards std = sqrt(p(1 − p)) and G = 1 is well defined.
    ``drgrpo``: A_i = r_i − mean(r) (Liu et al. 2025, Dr. GRPO, eq. 3), which is the prioritized-
    replay paper's A_i = r_i − p (Fatemi 2026, arXiv 2601.02648): its mean square p(1 − p) is the
    problem's priority.

    A group whose rewards are all equal (or G = 1) gets zero advantages in both modes, never NaN.

    Args:
        rewards: (N, G) rewards, finite.
        mode: ``"grpo"`` or ``"drgrpo"``.
        eps: added to the std in ``grpo`` mode (> 0).

    Returns:
        (N, G) advantages, same dtype as ``rewards`` (float).

    Raises:
        InvalidArgument: ``rewards`` not 2-D, non-finite, ``mode`` unknown or ``eps`` <= 0.
    """
    if rewards.dim() != 2:
        raise InvalidArgument(f"rewards must have shape (N, G), got {tuple(rewards.shape)}")
    if mode not in ("grpo", "drgrpo"):
        raise InvalidArgument(f"advantage mode ({mode!r}) must be 'grpo' or 'drgrpo'")
    if not eps > 0:
        raise InvalidArgument(f"eps ({eps}) must be > 0")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    if not torch.isfinite(rewards).all():
        raise InvalidArgument("rewards contain NaN or inf; every reward must be a finite number")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (N, G)
    if mode == "drgrpo":
        return centred
    std = rewards.std(dim=1, keepdim=True, correction=0)  # (N, 1)
    return centred / (std + eps)  # (N, G)


def _aggregate(x: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation, normalizer: float) -> torch.Tensor:
    """Sum of masked per-token values ``x`` (B, T), normalized like the loss (see grpo_loss)."""
    if aggregation == "token-mean":
        return (x * mask).sum() / normalizer
    per_seq = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    return per_seq.sum() / normalizer


def default_normalizer(mask: torch.Tensor, aggregation: Aggregation) -> float:
    """The denominator of ``aggregation`` for one batch: valid tokens (token-mean) or sequences
    with at least one valid token (seq-mean); at least 1."""
    if aggregation == "token-mean":
        return max(1.0, float(mask.sum()))
    return max(1.0, float((mask.sum(dim=1) > 0).sum()))


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: Aggregation = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropies: torch.Tensor | None = None,
    normalizer: float | None = None,
    dual_clip_c: float | None = DUAL_CLIP_C,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped policy-gradient loss of GRPO with asymmetric clipping and an optional KL term.

    Per completion token t of sequence b (all log-probs in nats):

    - ratio ρ = exp(clamp(logprobs − behaviour_logprobs, ±MAX_LOG_RATIO)): the token-level
      importance ratio against the worker's sampling (behaviour) distribution;
    - surrogate = min(ρ·A_b, clip(ρ, 1 − eps_low, 1 + eps_high)·A_b) (PPO, Schulman et al. 2017,
      eq. 7) with DAPO's decoupled "clip-higher" bounds (Yu et al. 2025, eq. 10);
    - dual-clip, for A_b < 0 only: surrogate = max(surrogate, c·A_b) (Ye et al. 2020, "Mastering
      Complex Control in MOBA Games with Deep Reinforcement Learning", AAAI, eq. 5). PPO's min
      keeps ρ·A unbounded when A < 0 and ρ ≫ 1 (a token the worker found unlikely and the
      policy now likes: behaviour log-prob −10 against 0 gives ρ ≈ 22,026 and a loss of 22,026
      for one token); the cap c (default 3, > 1) bounds it at c·|A| with no gradient;
    - kl = exp(ref − lp) − (ref − lp) − 1, Schulman's k3 estimator of KL(π‖π_ref) (J. Schulman,
      "Approximating KL divergence", 2020; as in DeepSeekMath eq. 4), log-ratio clamped likewise;
    - per-token loss = −surrogate + kl_coef·kl.

    Aggregation: ``token-mean`` sums over every valid token of the batch and divides by their
    number (DAPO's token-level loss); ``seq-mean`` averages each sequence over its own valid
    tokens, then averages over sequences (the original GRPO). ``normalizer`` replaces the
    denominator (tokens or sequences) so that micro-batches of one batch each divide by the
    *whole* batch's count: their losses (and metrics) then sum exactly to the full-batch values.

    Metrics (detached scalars, aggregated like the loss, so they also sum over micro-batches):
    ``pg_loss`` (−surrogate), ``kl`` (k3 to the reference, 0 without one), ``clip_frac_low``
    (tokens with A < 0 and ρ < 1 − eps_low: the clipped branch is taken, no gradient),
    ``clip_frac_high`` (A > 0 and ρ > 1 + eps_high), ``dual_clip_frac`` (A < 0 and ρ > c: the
    dual-clip bound is taken), ``approx_kl`` (k3 of KL(behaviour‖π) from the
    ratio, a staleness/drift diagnostic), ``entropy`` (when ``entropies`` is given).

    Args:
        logprobs: (B, T) log-probs of the taken tokens under the current policy (with grad).
        behaviour_logprobs: (B, T) log-probs the worker reported for the same tokens.
        advantages: (B,) one advantage per sequence (broadcast over its tokens).
        mask: (B, T) 1 for completion tokens that count, 0 for prompt and padding (bool or float).
        eps_low, eps_high: clip range [1 − eps_low, 1 + eps_high]; 0 <= eps_low < 1, eps_high >= 0.
        aggregation: ``"token-mean"`` or ``"seq-mean"``.
        ref_logprobs: (B, T) log-probs under the frozen reference policy, or None.
        kl_coef: weight of the KL term (>= 0); > 0 requires ``ref_logprobs``.
        entropies: (B, T) per-token entropies of the current policy (nats), for the metric only.
        normalizer: denominator to use instead of this batch's own (> 0), see above.
        dual_clip_c: the dual-clip cap c (> 1) on ρ for negative advantages, or None for plain
            PPO clipping (default ``DUAL_CLIP_C`` = 3, the value of Ye et al. 2020).

    Returns:
        (loss, metrics): a scalar loss with grad through ``logprobs`` only, and a dict of
        detached scalar tensors.

    Raises:
        InvalidArgument: shapes disagree, unknown aggregation, eps out of range, kl_coef < 0,
            kl_coef > 0 without ref_logprobs, normalizer <= 0, or dual_clip_c <= 1.
    """
    B, T = logprobs.shape if logprobs.dim() == 2 else (None, None)
    if B is None:
        raise InvalidArgument(f"logprobs must have shape (B, T), got {tuple(logprobs.shape)}")
    for name, t in (
        ("behaviour_logprobs", behaviour_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("entropies", entropies),
    ):
        if t is not None and tuple(t.shape) != (B, T):
            raise InvalidArgument(f"{name} must have the shape of logprobs {(B, T)}, got {tuple(t.shape)}")
    if tuple(advantages.shape) != (B,):
        raise InvalidArgument(f"advantages must have shape (B,) = ({B},), got {tuple(advantages.shape)}")
    if aggregation not in ("token-mean", "seq-mean"):
        raise InvalidArgument(f"aggregation ({aggregation!r}) must be 'token-mean' or 'seq-mean'")
    if not (0.0 <= eps_low < 1.0) or not eps_high >= 0.0:
        raise InvalidArgument(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if not kl_coef >= 0.0:
        raise InvalidArgument(f"kl_coef ({kl_coef}) must be >= 0")
    if kl_coef > 0 and ref_logprobs is None:
        raise InvalidArgument(
            f"kl_coef ({kl_coef}) > 0 needs ref_logprobs; pass the reference policy's log-probs or set kl_coef=0"
        )
    if normalizer is not None and not normalizer > 0:
        raise InvalidArgument(f"normalizer ({normalizer}) must be > 0")
    if dual_clip_c is not None and not (math.isfinite(dual_clip_c) and dual_clip_c > 1.0):
        raise InvalidArgument(
            f"dual_clip_c ({dual_clip_c}) must be a finite number > 1 (Ye et al. 2020 use 3), or None to turn dual-clip off"
        )

    # --- importance ratio against the behaviour policy --------------------------------------
    mask = mask.to(logprobs.dtype)  # (B, T)
    behaviour_logprobs = behaviour_logprobs.to(logprobs.dtype).detach()  # (B, T)
    adv = advantages.to(logprobs.dtype).detach().unsqueeze(1)  # (B, 1)
    log_ratio = (logprobs - behaviour_logprobs) * mask  # (B, T) padding: log-ratio 0, ratio 1
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)

    # --- clipped surrogate (PPO min, DAPO clip-higher) ----------------------------------------
    unclipped = ratio * adv  # (B, T)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # (B, T)
    surrogate = torch.minimum(unclipped, clipped)  # (B, T)
    if dual_clip_c is not None:  # Ye et al. 2020, eq. 5: for A < 0, max(surrogate, c·A)
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, dual_clip_c * adv), surrogate)  # (B, T)
    pg_per_token = -surrogate  # (B, T)

    # --- KL to the frozen reference (k3) -----------------------------------------------------
    if ref_logprobs is not None:
        ref_log_ratio = ((ref_logprobs.to(logprobs.dtype).detach() - logprobs) * mask).clamp(
            -MAX_LOG_RATIO, MAX_LOG_RATIO
        )  # (B, T)
        kl_per_token = torch.exp(ref_log_ratio) - ref_log_ratio - 1.0  # (B, T)
    else:
        kl_per_token = torch.zeros_like(logprobs)  # (B, T)
    loss_per_token = pg_per_token + kl_coef * kl_per_token  # (B, T)

    # --- aggregation over valid tokens --------------------------------------------------------
    norm = default_normalizer(mask, aggregation) if normalizer is None else float(normalizer)
    loss = _aggregate(loss_per_token, mask, aggregation, norm)  # ()

    # --- metrics (detached, aggregated like the loss) -----------------------------------------
    with torch.no_grad():
        lr_d, ratio_d = log_ratio.detach(), ratio.detach()  # (B, T)
        clip_low = ((ratio_d < 1.0 - eps_low) & (adv < 0)).to(logprobs.dtype)  # (B, T)
        clip_high = ((ratio_d > 1.0 + eps_high) & (adv > 0)).to(logprobs.dtype)  # (B, T)
        dual = (
            ((ratio_d > dual_clip_c) & (adv < 0)).to(logprobs.dtype) if dual_clip_c is not None else torch.zeros_like(ratio_d)
        )  # (B, T)
        metrics = {
            "pg_loss": _aggregate(pg_per_token.detach(), mask, aggregation, norm),
            "kl": _aggregate(kl_per_token.detach(), mask, aggregation, norm),
            "clip_frac_low": _aggregate(clip_low, mask, aggregation, norm),
            "clip_frac_high": _aggregate(clip_high, mask, aggregation, norm),
            "dual_clip_frac": _aggregate(dual, mask, aggregation, norm),
            "approx_kl": _aggregate((ratio_d - 1.0) - lr_d, mask, aggregation, norm),
        }
        if entropies is not None:
            metrics["entropy"] = _aggregate(entropies.detach().to(logprobs.dtype), mask, aggregation, norm)
    return loss, metrics


def micro_batch_loss(model, reference, mb: Batch, cfg, device: torch.device, normalizer: float):
    """The GRPO loss (:func:`grpo_loss`) of one micro-batch under ``model``, divided by the whole
    batch's ``normalizer``: new log-probs and entropies by teacher forcing (:func:`~.batch.token_logprobs`,
    under bf16 autocast on CUDA), and with ``cfg.kl_coef > 0`` the reference's log-probs, with no
    gradient, from ``reference()`` (a context giving the KL reference model).

    Args:
        model: the policy that trains (wrapped for DDP or sharded for FSDP in a distributed job).
        reference: a callable returning a context manager that yields the reference model.
        mb: the micro-batch, b sequences of length t.
        cfg: the :class:`~.config.LearnerConfig` (clipping, aggregation, KL coefficient).
        device: where the tensors go.
        normalizer: the whole batch's token or sequence count (:func:`default_normalizer`).

    Returns:
        (loss, figures) as :func:`grpo_loss` returns them.
    """
    ids, attn = mb.input_ids.to(device), mb.attention_mask.to(device)  # (b, t)
    with policy.autocast(device):
        logprobs, entropy = token_logprobs(model, ids, attn, mb.temperature, with_entropy=True, top_p=mb.top_p)  # (b, t-1)
        ref_logprobs = None
        if cfg.kl_coef > 0:
            with torch.no_grad(), reference() as ref:
                ref_logprobs, _ = token_logprobs(ref, ids, attn, mb.temperature, top_p=mb.top_p)  # (b, t-1)
    return grpo_loss(
        logprobs,
        mb.behaviour_logprobs.to(device),
        mb.advantages.to(device),
        mb.completion_mask.to(device),
        cfg.eps_low,
        cfg.eps_high,
        cfg.aggregation,
        ref_logprobs=ref_logprobs,
        kl_coef=cfg.kl_coef,
        entropies=entropy,
        normalizer=normalizer,
        dual_clip_c=cfg.dual_clip_c or None,
    )
