"""The GRPO loss and advantages on tiny hand-worked tensors (expected values computed here)."""

from __future__ import annotations

import math

import pytest
import torch

from prioreplay import rules
from prioreplay.errors import InvalidArgument
from prioreplay.learner.loss import MAX_LOG_RATIO, LossSettings, group_advantages, grpo_loss

# --- advantages ------------------------------------------------------------------------------


def test_drgrpo_advantages_are_reward_minus_success_rate():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_advantages(rewards, "drgrpo")
    p = [0.5, 0.75]
    expected = torch.tensor([[1 - p[0], -p[0], -p[0], 1 - p[0]], [1 - p[1], 1 - p[1], 1 - p[1], -p[1]]])
    torch.testing.assert_close(adv, expected)
    # the mean squared advantage is the problem's priority p(1 − p) (Fatemi 2026)
    torch.testing.assert_close((adv**2).mean(dim=1), torch.tensor([p[0] * (1 - p[0]), p[1] * (1 - p[1])]))


def test_grpo_advantages_divide_by_population_std_plus_eps():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    eps = 1e-4
    p = 0.75
    std = math.sqrt(p * (1 - p))  # population std of binary rewards
    expected = torch.tensor([[(1 - p) / (std + eps)] * 3 + [(0 - p) / (std + eps)]])
    torch.testing.assert_close(group_advantages(rewards, "grpo", eps=eps), expected)


@pytest.mark.parametrize("mode", ["grpo", "drgrpo"])
def test_equal_rewards_and_single_completion_give_zero_advantages(mode):
    for rewards in (torch.ones(3, 5), torch.zeros(2, 4), torch.full((1, 3), 0.3), torch.tensor([[1.0], [0.0]])):
        adv = group_advantages(rewards, mode)
        assert torch.isfinite(adv).all()
        assert torch.equal(adv, torch.zeros_like(rewards))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["grpo", "drgrpo"])
def test_a_constant_group_has_zero_advantages_in_float32_and_float64_alike(mode, dtype):
    """8 × 0.35: the float32 mean differs from 0.35 by a rounding residue that ``/ (std + eps)``
    turned into ±0.029; the same rewards as the classifier's constant group 7 × 0.3 + (0.1 + 0.2)."""
    for row in ([0.35] * 8, [0.3] * 7 + [0.1 + 0.2], [0.7] * 7 + [0.7 + 3e-7]):
        rewards = torch.tensor([row, [1.0, 0.0] * 4], dtype=dtype)
        adv = group_advantages(rewards, mode)
        assert torch.equal(adv[0], torch.zeros(8, dtype=dtype)), (row, adv[0])
        assert rules.classify([float(r) for r in rewards[0]]) is rules.GroupKind.CONSTANT  # the same verdict
        assert adv[1].abs().min() > 0.4  # a mixed group keeps its advantages


def test_advantages_reject_bad_input():
    with pytest.raises(InvalidArgument, match=r"\(N, G\)"):
        group_advantages(torch.ones(4), "grpo")
    with pytest.raises(InvalidArgument, match="'ppo'"):
        group_advantages(torch.ones(2, 2), "ppo")
    with pytest.raises(InvalidArgument, match="NaN"):
        group_advantages(torch.tensor([[1.0, float("nan")]]), "grpo")


# --- loss ------------------------------------------------------------------------------------


def _per_token_objective(ratio: float, adv: float, eps_low: float, eps_high: float) -> float:
    """-min(ρA, clip(ρ)A), worked out with plain floats."""
    clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
    return -min(ratio * adv, clipped * adv)


def _case():
    """2 sequences × 3 positions; the first position of each is prompt (masked)."""
    ratios = [[1.0, 1.5, 0.9], [1.0, 0.5, 1.1]]
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    logprobs = behaviour + torch.log(torch.tensor(ratios))
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)  # seq 1: last position is padding
    adv = torch.tensor([0.5, -2.0])
    return ratios, behaviour, logprobs, mask, adv


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_loss_matches_hand_computation_with_asymmetric_clipping(aggregation):
    ratios, behaviour, logprobs, mask, adv = _case()
    eps_low, eps_high = 0.2, 0.3
    loss, m = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(eps_low=eps_low, eps_high=eps_high, aggregation=aggregation))
    # seq 0 (A=0.5): ρ=1.5 is clipped to 1.3, ρ=0.9 is not; seq 1 (A=-2): ρ=0.5 is clipped to 0.8
    t = [[_per_token_objective(ratios[b][j], float(adv[b]), eps_low, eps_high) for j in range(3)] for b in range(2)]
    valid = [[j for j in range(3) if mask[b, j]] for b in range(2)]
    if aggregation == "token-mean":
        expected = sum(t[b][j] for b in range(2) for j in valid[b]) / sum(len(v) for v in valid)
        clip_high = 1 / 3
        clip_low = 1 / 3
    else:
        expected = sum(sum(t[b][j] for j in valid[b]) / len(valid[b]) for b in range(2)) / 2
        clip_high = (1 / 2 + 0) / 2
        clip_low = (0 + 1 / 1) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert m["pg_loss"].item() == pytest.approx(expected, rel=1e-5)
    assert m["clip_frac_high"].item() == pytest.approx(clip_high)
    assert m["clip_frac_low"].item() == pytest.approx(clip_low)
    assert m["kl"].item() == 0.0


def test_token_mean_and_seq_mean_differ_when_lengths_differ():
    ratios, behaviour, logprobs, mask, adv = _case()
    tok, _ = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(aggregation="token-mean"))
    seq, _ = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(aggregation="seq-mean"))
    assert abs(tok.item() - seq.item()) > 1e-3


def test_symmetric_vs_asymmetric_clip_changes_the_high_side_only():
    ratios, behaviour, logprobs, mask, adv = _case()
    _, sym = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(eps_low=0.2, eps_high=0.2))
    _, wide = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(eps_low=0.2, eps_high=0.6))  # 1.5 < 1.6: no longer clipped
    assert sym["clip_frac_high"].item() > 0 and wide["clip_frac_high"].item() == 0.0
    assert sym["clip_frac_low"].item() == wide["clip_frac_low"].item() > 0


def test_masked_positions_do_not_change_the_loss_or_get_gradient():
    ratios, behaviour, logprobs, mask, adv = _case()
    lp = logprobs.clone().requires_grad_(True)
    loss, _ = grpo_loss(lp, behaviour, adv, mask)
    loss.backward()
    assert torch.all(lp.grad[~mask] == 0)
    # unmasked, unclipped tokens do get gradient: d(-ρA)/d lp = -ρA
    assert lp.grad[0, 2].item() == pytest.approx(-0.9 * 0.5 / 3, rel=1e-5)
    # clipped tokens (ρ=1.5 with A>0, ρ=0.5 with A<0) get none
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[1, 1].item() == 0.0
    # garbage in masked positions (huge values, -inf-like behaviour) changes nothing
    lp2 = logprobs.clone()
    beh2 = behaviour.clone()
    lp2[~mask] = 1e4
    beh2[~mask] = -1e4
    loss2, _ = grpo_loss(lp2, beh2, adv, mask)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)


def test_huge_log_ratio_stays_finite():
    behaviour = torch.tensor([[-500.0, -0.1], [-0.1, -0.1]])
    logprobs = torch.tensor([[-0.01, -600.0], [-0.1, -0.1]], requires_grad=True)
    mask = torch.ones(2, 2)
    adv = torch.tensor([-1.0, 1.0])
    loss, m = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(kl_coef=0.1, dual_clip_c=None), ref_logprobs=behaviour)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in m.values())
    assert torch.isfinite(logprobs.grad).all()
    # the first token's ratio saturates at exp(MAX_LOG_RATIO): its unclipped term -(-1)·e^20 dominates
    assert loss.item() >= math.exp(MAX_LOG_RATIO) / 4 * 0.99


def test_k3_kl_term_and_coefficient():
    behaviour = torch.tensor([[-1.0, -1.0]])
    logprobs = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-0.5, -2.0]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([0.0])
    kl_coef = 0.25
    loss, m = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(kl_coef=kl_coef), ref_logprobs=ref)
    k3 = [math.exp(d) - d - 1 for d in (0.5, -1.0)]  # ref − lp per token
    assert m["kl"].item() == pytest.approx(sum(k3) / 2, rel=1e-6)
    assert loss.item() == pytest.approx(kl_coef * sum(k3) / 2, rel=1e-6)


def test_entropy_and_approx_kl_metrics():
    ratios, behaviour, logprobs, mask, adv = _case()
    ent = torch.tensor([[9.0, 1.0, 2.0], [9.0, 3.0, 9.0]])
    _, m = grpo_loss(logprobs, behaviour, adv, mask, entropies=ent)
    assert m["entropy"].item() == pytest.approx((1 + 2 + 3) / 3)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.9, 0.5)]
    assert m["approx_kl"].item() == pytest.approx(sum(k3) / 3, rel=1e-5)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_micro_batches_with_the_batch_normalizer_sum_to_the_full_loss(aggregation):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    behaviour = -torch.rand(B, T, generator=g) * 3
    logprobs = (behaviour + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    mask = torch.rand(B, T, generator=g) > 0.3
    adv = torch.randn(B, generator=g)
    full, fm = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(aggregation=aggregation))
    (full_grad,) = torch.autograd.grad(full, logprobs)
    norm = float(mask.sum()) if aggregation == "token-mean" else float((mask.sum(1) > 0).sum())
    parts, grads = [], []
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, pm = grpo_loss(
            logprobs[sl], behaviour[sl], adv[sl], mask[sl], LossSettings(aggregation=aggregation), normalizer=norm
        )
        parts.append((part, pm))
        grads.append(torch.autograd.grad(part, logprobs)[0])
    assert sum(p.item() for p, _ in parts) == pytest.approx(full.item(), rel=1e-5)
    assert sum(pm["clip_frac_high"].item() for _, pm in parts) == pytest.approx(fm["clip_frac_high"].item(), abs=1e-6)
    torch.testing.assert_close(sum(grads), full_grad)


def test_loss_rejects_bad_input():
    lp = torch.zeros(2, 3)
    with pytest.raises(InvalidArgument, match="advantages"):
        grpo_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(InvalidArgument, match="mask"):
        grpo_loss(lp, lp, torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(InvalidArgument, match="aggregation"):
        grpo_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), LossSettings(aggregation="sum"))
    with pytest.raises(InvalidArgument, match="ref_logprobs"):
        grpo_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), LossSettings(kl_coef=0.1))
    with pytest.raises(InvalidArgument, match="eps_low"):
        grpo_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), LossSettings(eps_low=1.5))


# --------------------------------------------------------------------------- dual-clip (issue 13)


def test_dual_clip_caps_a_negative_advantage_token_far_off_policy():
    """A = −1, behaviour log-prob −10, current 0: ρ = e^10 ≈ 22,026. Without a cap on ρ the
    PPO min keeps ρ·A (the loss is 22,026 for one token); dual-clip (Ye et al. 2020) bounds
    it by c·|A| = 3 and the token gives no gradient."""
    logprobs = torch.zeros(1, 1, requires_grad=True)
    behaviour = torch.full((1, 1), -10.0)
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 1)
    loss, _ = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(dual_clip_c=None))
    assert loss.item() == pytest.approx(math.exp(10.0), rel=1e-5)  # the unbounded loss of today
    loss, metrics = grpo_loss(logprobs, behaviour, adv, mask)  # default: dual-clip with c = 3
    assert loss.item() == pytest.approx(3.0)
    assert metrics["dual_clip_frac"].item() == 1.0
    loss.backward()
    assert logprobs.grad.abs().max().item() == 0.0


def test_dual_clip_leaves_positive_advantages_and_near_ratios_alone():
    torch.manual_seed(0)
    logprobs = (torch.randn(6, 5) * 0.1).requires_grad_(True)
    behaviour = logprobs.detach() + torch.randn(6, 5) * 0.1
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    mask = torch.ones(6, 5)
    a, _ = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(dual_clip_c=3.0))
    b, _ = grpo_loss(logprobs, behaviour, adv, mask, LossSettings(dual_clip_c=None))
    assert a.item() == b.item()  # every ratio is < 3
    big = torch.full((1, 1), 0.0)
    pos, _ = grpo_loss(big, torch.full((1, 1), -10.0), torch.tensor([1.0]), torch.ones(1, 1))
    assert pos.item() == pytest.approx(-1.28)  # positive advantage: the usual clip at 1 + eps_high


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0, float("nan")])
def test_dual_clip_c_must_exceed_one(c):
    with pytest.raises(InvalidArgument, match="dual_clip_c"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), LossSettings(dual_clip_c=c))
