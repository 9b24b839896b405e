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

from . import policy
from .batch import Batch, token_logprobs

AdvantageMode = Literal["grpo", "drgrpo"]
Aggregation = Literal["token-mean", "seq-mean"]
Correction = Literal["none", "tis", "mis-token", "mis-sequence", "icepop"]

#: The off-policy corrections of :func:`grpo_loss` (``correction``).
CORRECTIONS: tuple[str, ...] = ("none", "tis", "mis-token", "mis-sequence", "icepop")

#: The default correction and cap: token-level truncated importance sampling at C = 2 (Yao et al.
#: 2025 use C = 2; verl's rollout correction, slime's ``--use-tis`` and OpenRLHF's vLLM IS
#: correction default to token-level truncation at 2). It never drops a token (unlike MIS or
#: IcePop) and is the correction the most peers ship on by default.
DEFAULT_CORRECTION: Correction = "tis"
DEFAULT_CORRECTION_CAP = 2.0
#: IcePop's band [a, b] on w (Ring-1T report, 2025, use α = 0.5, β = 5).
DEFAULT_ICEPOP_BAND = (0.5, 5.0)

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


def _correction_weight(
    log_w: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, correction: str, cap: float, band: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The per-token weight ω (B, T) of an off-policy correction (see :func:`grpo_loss`), and the
    (B, T) 0/1 indicators of truncated and masked tokens (None where the correction has none).
    ``log_w`` and ``w`` are detached and 0 / 1 on padding."""
    if correction == "tis":
        truncated = (w > cap).to(w.dtype)  # (B, T)
        return w.clamp(max=cap), truncated, None
    if correction == "mis-sequence":
        seq_log_w = (log_w * mask).sum(dim=1, keepdim=True).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, 1)
        keep = (seq_log_w >= -math.log(cap)) & (seq_log_w <= math.log(cap))  # (B, 1)
        weight = torch.where(keep, torch.exp(seq_log_w), torch.zeros_like(seq_log_w))  # (B, 1)
        return weight.expand_as(w), None, (~keep).to(w.dtype).expand_as(w)
    lo, hi = (1.0 / cap, cap) if correction == "mis-token" else band
    keep = (w >= lo) & (w <= hi)  # (B, T)
    return torch.where(keep, w, torch.zeros_like(w)), None, (~keep).to(w.dtype)


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
    prox_logprobs: torch.Tensor | None = None,
    correction: Correction = DEFAULT_CORRECTION,
    correction_cap: float = DEFAULT_CORRECTION_CAP,
    icepop_band: tuple[float, float] = DEFAULT_ICEPOP_BAND,
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

    Off-policy correction (``correction``; decoupled PPO, Hilton et al. 2021, "Batch size-invariance
    for policy optimization"; AReaL, Fu et al. 2025). With μ the behaviour policy
    (``behaviour_logprobs``, the worker's engine, up to ``max_staleness`` versions old) and π_prox
    the proximal policy (``prox_logprobs``, the learner's weights at the start of the step):

    - r = exp(clamp(logprobs − prox_logprobs, ±MAX_LOG_RATIO)) replaces ρ in the clip and dual-clip
      above (the trust region is around π_prox, not around μ);
    - w = exp(clamp(prox_logprobs − behaviour_logprobs, ±MAX_LOG_RATIO)), detached: staleness and
      engine mismatch together;
    - surrogate_t = ω_t · min(r·A, clip(r)·A) (dual-clipped as above), with the weight ω_t:

      - ``none``: ρ = π_θ/μ in one ratio and ω = 1, the loss before this correction existed (bit
        for bit; ``prox_logprobs`` feeds the mismatch metrics only);
      - ``tis``: ω = min(w, C), truncated importance sampling (Yao et al. 2025, "Your efficient RL
        framework secretly brings you off-policy RL training", C = ``correction_cap``);
      - ``mis-token``: ω = w·1[1/C <= w <= C], masked importance sampling per token (Liu et al.
        2025, "When speed kills stability: demystifying RL collapse from the training-inference
        mismatch"; verl's rollout rejection sampling);
      - ``mis-sequence``: ω = W_b·1[1/C <= W_b <= C] on every token of sequence b, with the
        sequence ratio W_b = exp(Σ_t log w_{b,t}) (same sources, sequence level);
      - ``icepop``: ω = w·1[a <= w <= b], [a, b] = ``icepop_band`` (IcePop, Ring-1T report 2025:
        M(k) = k on [α, β], 0 outside; α = 0.5, β = 5).

    The default is ``tis`` with C = 2 (see ``DEFAULT_CORRECTION``). Without ``prox_logprobs``,
    π_prox = μ: w = 1 and every correction gives the ``none`` loss. The learner does one
    optimizer step per batch, so π_prox at the start of the step has the very weights of the
    forward pass that trains: its log-probs are that forward's, detached (no second pass; r = 1 in
    value and ∇r = ∇log π_θ), see :func:`micro_batch_loss`.

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
    ratio, a staleness/drift diagnostic), ``entropy`` (when ``entropies`` is given). With
    ``prox_logprobs``: ``mismatch_kl`` (k3 of KL(μ‖π_prox) = E_μ[w − 1 − log w]),
    ``abs_log_w`` (mean |log w|), ``is_truncated_frac`` (tis: tokens with w > C),
    ``is_masked_frac`` (mis-*, icepop: tokens with ω = 0 by the mask).

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
        prox_logprobs: (B, T) log-probs under the proximal policy (no grad needed), or None (= μ).
        correction: one of ``CORRECTIONS`` (above).
        correction_cap: C > 1, the truncation (tis) or band [1/C, C] (mis-token, mis-sequence).
        icepop_band: (a, b), 0 < a < 1 < b, IcePop's band on w.

    Returns:
        (loss, metrics): a scalar loss with grad through ``logprobs`` only, and a dict of
        detached scalar tensors.

    Raises:
        InvalidArgument: shapes disagree, unknown aggregation, eps out of range, kl_coef < 0,
            kl_coef > 0 without ref_logprobs, normalizer <= 0, dual_clip_c <= 1, unknown
            correction, correction_cap <= 1, or icepop_band not 0 < a < 1 < b.
    """
    B, T = logprobs.shape if logprobs.dim() == 2 else (None, None)
    if B is None:
        raise InvalidArgument(f"logprobs must have shape (B, T), got {tuple(logprobs.shape)}")
    for name, t in (
        ("behaviour_logprobs", behaviour_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("entropies", entropies),
        ("prox_logprobs", prox_logprobs),
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

    if correction not in CORRECTIONS:
        raise InvalidArgument(f"correction ({correction!r}) must be one of {', '.join(CORRECTIONS)}")
    if not (math.isfinite(correction_cap) and correction_cap > 1.0):
        raise InvalidArgument(f"correction_cap ({correction_cap}) must be a finite number > 1 (Yao et al. 2025 use 2)")
    lo_band, hi_band = icepop_band
    if not (0.0 < lo_band < 1.0 < hi_band and math.isfinite(hi_band)):
        raise InvalidArgument(f"icepop_band ({icepop_band}) must be (a, b) with 0 < a < 1 < b (Ring-1T use (0.5, 5))")

    # --- importance ratio against the behaviour (none) or proximal policy ----------------------
    mask = mask.to(logprobs.dtype)  # (B, T)
    behaviour_logprobs = behaviour_logprobs.to(logprobs.dtype).detach()  # (B, T)
    adv = advantages.to(logprobs.dtype).detach().unsqueeze(1)  # (B, 1)
    decoupled = correction != "none" and prox_logprobs is not None
    prox = prox_logprobs.to(logprobs.dtype).detach() if prox_logprobs is not None else None  # (B, T)
    anchor = prox if decoupled and prox is not None else behaviour_logprobs  # (B, T) the clip's centre
    log_ratio = (logprobs - anchor) * mask  # (B, T) padding: log-ratio 0, ratio 1
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)

    # --- clipped surrogate (PPO min, DAPO clip-higher) ----------------------------------------
    unclipped = ratio * adv  # (B, T)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # (B, T)
    surrogate = torch.minimum(unclipped, clipped)  # (B, T)
    if dual_clip_c is not None:  # Ye et al. 2020, eq. 5: for A < 0, max(surrogate, c·A)
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, dual_clip_c * adv), surrogate)  # (B, T)
    truncated = masked = None
    if prox is not None:
        log_w = ((prox - behaviour_logprobs) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T) padding: 0
        w = torch.exp(log_w)  # (B, T)
    if decoupled:
        weight, truncated, masked = _correction_weight(log_w, w, mask, correction, correction_cap, icepop_band)
        surrogate = weight * surrogate  # (B, T)
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
        if prox is not None:
            metrics["mismatch_kl"] = _aggregate(w - 1.0 - log_w, mask, aggregation, norm)  # k3 of KL(μ‖π_prox)
            metrics["abs_log_w"] = _aggregate(log_w.abs(), mask, aggregation, norm)
            zero = torch.zeros_like(w)
            metrics["is_truncated_frac"] = _aggregate(truncated if truncated is not None else zero, mask, aggregation, norm)
            metrics["is_masked_frac"] = _aggregate(masked if masked is not None else zero, mask, aggregation, norm)
        if entropies is not None:
            metrics["entropy"] = _aggregate(entropies.detach().to(logprobs.dtype), mask, aggregation, norm)
    return loss, metrics


def micro_batch_loss(model, reference, mb: Batch, cfg, device: torch.device, normalizer: float, sink: list | None = None):
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
        sink: a list to which the micro-batch's (n,) log w of its valid tokens and their (n,)
            sequence ages (``mb.ages``, -1 where unknown) are appended as a pair, for the step's
            mismatch percentiles and per-age figures (:func:`mismatch_summary`); None: not kept.

    The proximal log-probs are this forward's, detached: the learner applies one optimizer step per
    batch, so the weights at the start of the step are the weights of this forward (decoupled PPO
    then needs no second pass; a learner with several updates per batch would have to recompute
    them once, with no gradient, before the first).

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
    prox_logprobs = logprobs.detach()  # (b, t-1) π_prox: the step's starting weights (see above)
    behaviour = mb.behaviour_logprobs.to(device)  # (b, t-1)
    if sink is not None:
        with torch.no_grad():
            valid = mb.completion_mask.to(device) > 0  # (b, t-1)
            log_w = (prox_logprobs.float() - behaviour.float()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (b, t-1)
            ages = mb.ages.to(device) if mb.ages is not None else torch.full((len(mb),), -1, device=device)  # (b,)
            sink.append((log_w[valid].cpu(), ages.unsqueeze(1).expand_as(log_w)[valid].cpu()))
    return grpo_loss(
        logprobs,
        behaviour,
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
        prox_logprobs=prox_logprobs,
        correction=cfg.off_policy_correction,
        correction_cap=cfg.correction_cap,
        icepop_band=(cfg.icepop_low, cfg.icepop_high),
    )


#: The percentiles of |log w| in a step's mismatch summary.
MISMATCH_PERCENTILES = (50, 90, 99)


def mismatch_summary(sink: list) -> dict[str, float]:
    """The step's engine/staleness mismatch from :func:`micro_batch_loss`'s ``sink``.

    Returns:
        ``abs_log_w_p50`` / ``_p90`` / ``_p99`` (percentiles of |log w| over the step's valid
        tokens, nats) and, per policy age a present in the batch, ``mismatch_kl_age_<a>``: the k3
        estimate of KL(μ‖π_prox), the mean of w − 1 − log w over that age's tokens (Schulman 2020;
        a = -1 where the batch carries no ages). Empty when no token was valid.
    """
    if not sink:
        return {}
    log_w = torch.cat([lw for lw, _ in sink]).double()  # (n,)
    ages = torch.cat([g for _, g in sink])  # (n,)
    if log_w.numel() == 0:
        return {}
    q = torch.quantile(log_w.abs(), torch.tensor([p / 100 for p in MISMATCH_PERCENTILES], dtype=torch.float64))
    out = {f"abs_log_w_p{p}": float(v) for p, v in zip(MISMATCH_PERCENTILES, q, strict=True)}
    for a in sorted(set(ages.tolist())):
        sel = log_w[ages == a]  # (n_a,)
        out[f"mismatch_kl_age_{int(a)}"] = float((torch.exp(sel) - 1.0 - sel).mean())
    return out
