"""Group-relative advantages and the clipped GRPO policy-gradient loss.

Pure torch, no model: every function takes tensors and returns tensors, so the maths is tested on
hand-computed tiny inputs (``tests/unit/learner/test_grpo_loss.py``).

Notation: N groups of G completions each; B = N·G sequences; T token positions (padded). The
mask marks completion tokens; prompt and padding positions never contribute.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch

from prioreplay import rules
from prioreplay.errors import InvalidArgument

from . import policy
from .batch import Batch, token_logprobs
from .loss_settings import Aggregation, LossSettings

AdvantageMode = Literal["grpo", "drgrpo"]

#: Log-ratios are clamped to ±this before ``exp`` (e^20 ≈ 4.9e8): no overflow to inf, and such a
#: token is far outside the clip range anyway.
MAX_LOG_RATIO = 20.0

#: The loss's settings when none are given: each at its default (:class:`LossSettings`).
DEFAULT_SETTINGS = LossSettings()


def group_advantages(rewards: torch.Tensor, mode: AdvantageMode = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages of N groups of G completions.

    ``grpo``: A_i = (r_i − mean(r)) / (std(r) + eps), GRPO's outcome-supervision advantage
    (Shao et al. 2024, DeepSeekMath, §4.1.2). ``std`` is the population standard deviation
    (divides by G), so for binary rewards std = sqrt(p(1 − p)) and G = 1 is well defined.
    ``drgrpo``: A_i = r_i − mean(r) (Liu et al. 2025, Dr. GRPO, eq. 3), which is the prioritized-
    replay paper's A_i = r_i − p (Fatemi 2026, arXiv 2601.02648): its mean square p(1 − p) is the
    problem's priority.

    A group whose rewards are all equal (or G = 1) gets zero advantages in both modes, never NaN.
    "All equal" is :func:`prioreplay.rules.rewards_equal` (max − min within
    :data:`~prioreplay.rules.EQUAL_REWARDS_TOL`), the test ``classify`` applies, so a constant
    group is zero in float32 too: there the mean of 8 × 0.35 differs from 0.35 by a rounding
    residue that ``/ (std + eps)`` would blow up to ±0.03.

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
    low, high = rewards.amin(dim=1, keepdim=True), rewards.amax(dim=1, keepdim=True)  # (N, 1)
    constant = (high - low) <= rules.EQUAL_REWARDS_TOL * torch.maximum(low.abs(), high.abs()).clamp(min=1.0)  # (N, 1)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (N, G)
    if mode == "grpo":
        centred = centred / (rewards.std(dim=1, keepdim=True, correction=0) + eps)  # (N, G)
    return centred.masked_fill(constant, 0.0)  # (N, G)


def _aggregate(x: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation, normalizer: float) -> torch.Tensor:
    """Sum of masked per-token values ``x`` (B, T), divided by ``normalizer``: ``token-mean`` sums
    every valid token of the batch (DAPO's token-level loss); ``seq-mean`` first averages each
    sequence over its own valid tokens (the original GRPO). Returns a () tensor."""
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


class Ratios(NamedTuple):
    """The importance ratios of one micro-batch, each (B, T) and neutral (log 0, ratio 1) on padding.

    ``log_ratio``/``ratio``: log r and r of the current policy against the clip's anchor, the
    proximal policy π_prox with a decoupled correction, else the behaviour policy μ; ``log_w``/``w``:
    the detached weight w = π_prox/μ (None without proximal log-probs). Each log clamped to
    ±``MAX_LOG_RATIO``.
    """

    log_ratio: torch.Tensor
    ratio: torch.Tensor
    log_w: torch.Tensor | None
    w: torch.Tensor | None


def importance_ratios(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    decoupled: bool,
) -> Ratios:
    """r = exp(clamp(logprobs − anchor)) with the anchor π_prox when ``decoupled`` (the trust region
    around the proximal policy: decoupled PPO, Hilton et al. 2021; AReaL, Fu et al. 2025), else μ
    (plain PPO's token-level importance ratio); and w = exp(clamp(prox − behaviour)), detached:
    staleness and engine mismatch together. All inputs (B, T) log-probs in nats, ``mask`` float."""
    behaviour = behaviour_logprobs.to(logprobs.dtype).detach()  # (B, T)
    prox = prox_logprobs.to(logprobs.dtype).detach() if prox_logprobs is not None else None  # (B, T)
    anchor = prox if decoupled and prox is not None else behaviour  # (B, T) the clip's centre
    log_ratio = (logprobs - anchor) * mask  # (B, T) padding: log-ratio 0, ratio 1
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    if prox is None:
        return Ratios(log_ratio, ratio, None, None)
    log_w = ((prox - behaviour) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T) padding: 0
    return Ratios(log_ratio, ratio, log_w, torch.exp(log_w))  # w: (B, T)


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """The (B, T) clipped surrogate of ``ratio`` (B, T) and advantages ``adv`` (B, 1).

    surrogate = min(r·A, clip(r, 1 − eps_low, 1 + eps_high)·A) (PPO, Schulman et al. 2017, eq. 7)
    with DAPO's decoupled "clip-higher" bounds (Yu et al. 2025, eq. 10); then dual-clip, for A < 0
    only: surrogate = max(surrogate, c·A) (Ye et al. 2020, "Mastering Complex Control in MOBA Games
    with Deep Reinforcement Learning", AAAI, eq. 5). PPO's min keeps r·A unbounded when A < 0 and
    r ≫ 1 (a token the worker found unlikely and the policy now likes: behaviour log-prob −10
    against 0 gives r ≈ 22,026 and a loss of 22,026 for one token); the cap c bounds it at c·|A|
    with no gradient.
    """
    unclipped = ratio * adv  # (B, T)
    clipped = ratio.clamp(1.0 - settings.eps_low, 1.0 + settings.eps_high) * adv  # (B, T)
    surrogate = torch.minimum(unclipped, clipped)  # (B, T)
    if settings.dual_clip_c is not None:  # Ye et al. 2020, eq. 5: for A < 0, max(surrogate, c·A)
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, settings.dual_clip_c * adv), surrogate)  # (B, T)
    return surrogate


def _correction_weight(
    log_w: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The per-token weight ω (B, T) of the off-policy correction on the surrogate, and the (B, T)
    0/1 indicators of truncated and masked tokens (None where the correction has none). ``log_w``
    and ``w`` are detached and 0 / 1 on padding; C = ``correction_cap``:

    - ``tis``: ω = min(w, C), truncated importance sampling (Yao et al. 2025, "Your efficient RL
      framework secretly brings you off-policy RL training");
    - ``mis-token``: ω = w·1[1/C <= w <= C], masked importance sampling per token (Liu et al.
      2025, "When speed kills stability: demystifying RL collapse from the training-inference
      mismatch"; verl's rollout rejection sampling);
    - ``mis-sequence``: ω = W_b·1[1/C <= W_b <= C] on every token of sequence b, with the
      sequence ratio W_b = exp(Σ_t log w_{b,t}) (same sources, sequence level);
    - ``icepop``: ω = w·1[a <= w <= b], [a, b] = ``icepop_band`` (IcePop, Ring-1T report 2025).
    """
    cap = settings.correction_cap
    if settings.correction == "tis":
        truncated = (w > cap).to(w.dtype)  # (B, T)
        return w.clamp(max=cap), truncated, None
    if settings.correction == "mis-sequence":
        seq_log_w = (log_w * mask).sum(dim=1, keepdim=True).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, 1)
        keep = (seq_log_w >= -math.log(cap)) & (seq_log_w <= math.log(cap))  # (B, 1)
        weight = torch.where(keep, torch.exp(seq_log_w), torch.zeros_like(seq_log_w))  # (B, 1)
        return weight.expand_as(w), None, (~keep).to(w.dtype).expand_as(w)
    lo, hi = (1.0 / cap, cap) if settings.correction == "mis-token" else settings.icepop_band
    keep = (w >= lo) & (w <= hi)  # (B, T)
    return torch.where(keep, w, torch.zeros_like(w)), None, (~keep).to(w.dtype)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Per-token kl = exp(ref − lp) − (ref − lp) − 1 (B, T), Schulman's k3 estimator of KL(π‖π_ref)
    (J. Schulman, "Approximating KL divergence", 2020; as in DeepSeekMath eq. 4), the log-ratio
    clamped to ±``MAX_LOG_RATIO`` and 0 on padding; zeros without a reference."""
    if ref_logprobs is None:
        return torch.zeros_like(logprobs)  # (B, T)
    ref_log_ratio = ((ref_logprobs.to(logprobs.dtype).detach() - logprobs) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return torch.exp(ref_log_ratio) - ref_log_ratio - 1.0  # (B, T)


def _check_inputs(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    entropies: torch.Tensor | None,
    prox_logprobs: torch.Tensor | None,
    settings: LossSettings,
    normalizer: float | None,
) -> None:
    """What :func:`grpo_loss` checks on each call (its settings were checked when made): ``logprobs``
    (B, T) and every other per-token tensor (B, T) or None, ``advantages`` (B,), the reference's
    log-probs when ``kl_coef`` > 0, and ``normalizer`` > 0. Raises InvalidArgument naming the value."""
    if logprobs.dim() != 2:
        raise InvalidArgument(f"logprobs must have shape (B, T), got {tuple(logprobs.shape)}")
    B, T = logprobs.shape
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
    if settings.kl_coef > 0 and ref_logprobs is None:
        raise InvalidArgument(
            f"kl_coef ({settings.kl_coef}) > 0 needs ref_logprobs; pass the reference policy's log-probs or set kl_coef=0"
        )
    if normalizer is not None and not normalizer > 0:
        raise InvalidArgument(f"normalizer ({normalizer}) must be > 0")


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings = DEFAULT_SETTINGS,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    prox_logprobs: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's clipped policy-gradient loss: asymmetric clip, dual-clip, off-policy correction, k3 KL.

    Per completion token t of sequence b: −ω_t·surrogate(r_t, A_b) + kl_coef·k3_t, with r the
    importance ratio (:func:`importance_ratios`), PPO's clipped surrogate (:func:`clipped_surrogate`),
    ω the correction's weight (:func:`_correction_weight`; 1 with ``none`` or without
    ``prox_logprobs``, where π_prox = μ) and k3 the KL to the reference (:func:`k3_kl`);
    aggregated over the valid tokens as ``settings.aggregation`` says (:func:`_aggregate`).

    Args:
        logprobs: (B, T) log-probs (nats) of the taken tokens under the current policy (with grad).
        behaviour_logprobs: (B, T) log-probs the worker reported for the same tokens (μ).
        advantages: (B,) one advantage per sequence (broadcast over its tokens).
        mask: (B, T) 1 for completion tokens that count, 0 for prompt and padding (bool or float).
        settings: clip range, aggregation, KL weight, correction (:class:`LossSettings`: checked once).
        ref_logprobs, entropies, prox_logprobs: (B, T) log-probs under the frozen reference, per-token
            entropies (nats, for the metric only), log-probs under the proximal policy π_prox; or None.
        normalizer: the denominator (> 0) instead of this batch's token or sequence count: micro-batches
            dividing by the whole batch's sum exactly to the full batch's loss and metrics.

    Returns:
        (loss, metrics): a scalar with grad through ``logprobs`` only; :func:`loss_metrics`' scalars.

    Raises:
        InvalidArgument: shapes disagree, ``kl_coef`` > 0 without ``ref_logprobs``, ``normalizer`` <= 0.
    """
    _check_inputs(logprobs, behaviour_logprobs, advantages, mask, ref_logprobs, entropies, prox_logprobs, settings, normalizer)
    mask = mask.to(logprobs.dtype)  # (B, T)
    adv = advantages.to(logprobs.dtype).detach().unsqueeze(1)  # (B, 1)

    # --- importance ratio against the behaviour (none) or proximal policy ----------------------
    decoupled = settings.correction != "none" and prox_logprobs is not None
    ratios = importance_ratios(logprobs, behaviour_logprobs, prox_logprobs, mask, decoupled)  # (B, T) each

    # --- clipped surrogate (PPO min, DAPO clip-higher, dual-clip), weighted by the correction ---
    surrogate = clipped_surrogate(ratios.ratio, adv, settings)  # (B, T)
    flags: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # truncated, masked (B, T)
    if decoupled and ratios.log_w is not None and ratios.w is not None:
        weight, truncated, masked = _correction_weight(ratios.log_w, ratios.w, mask, settings)  # (B, T) each
        flags = (truncated, masked)
        surrogate = weight * surrogate  # (B, T)
    pg_per_token = -surrogate  # (B, T)

    # --- KL to the frozen reference (k3) -----------------------------------------------------
    kl_per_token = k3_kl(logprobs, ref_logprobs, mask)  # (B, T)
    loss_per_token = pg_per_token + settings.kl_coef * kl_per_token  # (B, T)

    # --- aggregation over valid tokens, and the metrics ---------------------------------------
    norm = default_normalizer(mask, settings.aggregation) if normalizer is None else float(normalizer)
    loss = _aggregate(loss_per_token, mask, settings.aggregation, norm)  # ()
    return loss, loss_metrics(pg_per_token, kl_per_token, ratios, adv, mask, settings, norm, entropies, flags)


def loss_metrics(
    pg_per_token: torch.Tensor,
    kl_per_token: torch.Tensor,
    ratios: Ratios,
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    norm: float,
    entropies: torch.Tensor | None,
    flags: tuple[torch.Tensor | None, torch.Tensor | None],
) -> dict[str, torch.Tensor]:
    """The loss's detached scalar metrics, aggregated like the loss (so they too sum over
    micro-batches). Inputs (B, T) but ``adv`` (B, 1); ``flags`` the correction's (truncated,
    masked) 0/1 indicators or None.

    ``pg_loss`` (−surrogate), ``kl`` (k3 to the reference, 0 without one), ``clip_frac_low``
    (tokens with A < 0 and r < 1 − eps_low: the clipped branch is taken, no gradient),
    ``clip_frac_high`` (A > 0 and r > 1 + eps_high), ``dual_clip_frac`` (A < 0 and r > c: the
    dual-clip bound is taken), ``approx_kl`` (k3 of KL(anchor‖π) from the ratio, a
    staleness/drift diagnostic), ``entropy`` (when ``entropies`` is given). With proximal
    log-probs: ``mismatch_kl`` (k3 of KL(μ‖π_prox) = E_μ[w − 1 − log w]), ``abs_log_w`` (mean
    |log w|), ``is_truncated_frac`` (tis: tokens with w > C), ``is_masked_frac`` (mis-*, icepop:
    tokens with ω = 0 by the mask).
    """

    def agg(x: torch.Tensor) -> torch.Tensor:
        return _aggregate(x, mask, settings.aggregation, norm)  # ()

    with torch.no_grad():
        lr_d, ratio_d = ratios.log_ratio.detach(), ratios.ratio.detach()  # (B, T)
        dtype, c = lr_d.dtype, settings.dual_clip_c
        clip_low = ((ratio_d < 1.0 - settings.eps_low) & (adv < 0)).to(dtype)  # (B, T)
        clip_high = ((ratio_d > 1.0 + settings.eps_high) & (adv > 0)).to(dtype)  # (B, T)
        dual = ((ratio_d > c) & (adv < 0)).to(dtype) if c is not None else torch.zeros_like(ratio_d)  # (B, T)
        metrics = {
            "pg_loss": agg(pg_per_token.detach()),
            "kl": agg(kl_per_token.detach()),
            "clip_frac_low": agg(clip_low),
            "clip_frac_high": agg(clip_high),
            "dual_clip_frac": agg(dual),
            "approx_kl": agg((ratio_d - 1.0) - lr_d),
        }
        if ratios.log_w is not None and ratios.w is not None:
            log_w, w = ratios.log_w, ratios.w  # (B, T)
            truncated, masked = (f if f is not None else torch.zeros_like(w) for f in flags)  # (B, T)
            metrics["mismatch_kl"] = agg(w - 1.0 - log_w)  # k3 of KL(μ‖π_prox)
            metrics["abs_log_w"] = agg(log_w.abs())
            metrics["is_truncated_frac"] = agg(truncated)
            metrics["is_masked_frac"] = agg(masked)
        if entropies is not None:
            metrics["entropy"] = agg(entropies.detach().to(dtype))
    return metrics


def micro_batch_loss(
    model, reference, mb: Batch, settings: LossSettings, device: torch.device, normalizer: float, sink: list | None = None
):
    """The GRPO loss (:func:`grpo_loss`) of one micro-batch under ``model``, divided by the whole
    batch's ``normalizer``: new log-probs and entropies by teacher forcing (:func:`~.batch.token_logprobs`,
    under bf16 autocast on CUDA), and with ``settings.kl_coef > 0`` the reference's log-probs, with no
    gradient, from ``reference()`` (a context giving the KL reference model).

    Args:
        model: the policy that trains (wrapped for DDP or sharded for FSDP in a distributed job).
        reference: a callable returning a context manager that yields the reference model.
        mb: the micro-batch, b sequences of length t.
        settings: the loss's settings (:attr:`~.config.LearnerConfig.loss_settings`).
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
        if settings.kl_coef > 0:
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
    advantages, mask = mb.advantages.to(device), mb.completion_mask.to(device)  # (b,), (b, t-1)
    return grpo_loss(
        logprobs, behaviour, advantages, mask, settings,
        ref_logprobs=ref_logprobs, entropies=entropy, prox_logprobs=prox_logprobs, normalizer=normalizer,
    )  # fmt: skip


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
