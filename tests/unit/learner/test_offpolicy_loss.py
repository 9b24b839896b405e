"""Off-policy corrections of the GRPO loss (none, tis, mis-token, mis-sequence, icepop) against
values and gradients worked by hand from the published formulas (see the grpo_loss docstring), the
mismatch metrics, and ``none`` reproducing the loss before the corrections bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from prioreplay.errors import InvalidArgument
from prioreplay.learner.loss import MAX_LOG_RATIO, LossSettings, grpo_loss, mismatch_summary
from prioreplay.learner.metrics import LearnerMetrics

# One sequence of 3 tokens, π_θ = π_prox (the learner's case: r = 1 in value), advantage +1, and
# behaviour log-probs chosen so that w = π_prox / μ = (3, 0.25, 1.5).
PROX = torch.tensor([[-1.0, -2.0, -0.5]])
W = torch.tensor([[3.0, 0.25, 1.5]])
BEHAVIOUR = PROX - torch.log(W)
MASK = torch.ones(1, 3)
ADV = torch.tensor([1.0])


def _loss(correction, logprobs=None, adv=ADV, **kw):
    lp = (PROX.clone() if logprobs is None else logprobs.clone()).requires_grad_(True)
    loss, m = grpo_loss(lp, BEHAVIOUR, adv, MASK, LossSettings(correction=correction, **kw), prox_logprobs=PROX)
    loss.backward()
    return loss.detach(), lp.grad, m


def test_tis_truncates_w_at_c_and_weights_the_gradient():
    # Yao et al. 2025: ω = min(w, C); r = 1 so the surrogate is ω·A, dL/dlogπ = −ω·r·A / 3 tokens.
    loss, grad, m = _loss("tis", correction_cap=2.0)
    omega = torch.tensor([[2.0, 0.25, 1.5]])
    torch.testing.assert_close(loss, -omega.sum() / 3)
    torch.testing.assert_close(grad, -omega / 3)
    assert m["is_truncated_frac"].item() == pytest.approx(1 / 3)
    assert m["is_masked_frac"].item() == 0.0


def test_mis_token_masks_tokens_with_w_outside_the_band():
    # band [1/2, 2]: w = 3 and 0.25 leave it, 1.5 stays with weight 1.5
    loss, grad, m = _loss("mis-token", correction_cap=2.0)
    torch.testing.assert_close(loss, torch.tensor(-1.5 / 3))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -0.5]]))
    assert m["is_masked_frac"].item() == pytest.approx(2 / 3)
    assert m["is_truncated_frac"].item() == 0.0


def test_icepop_masks_outside_its_own_band_and_keeps_w_inside():
    # band [0.5, 5]: w = 0.25 masked; w = 3 and 1.5 kept as weights (M(k) = k on [α, β])
    loss, grad, m = _loss("icepop", icepop_band=(0.5, 5.0))
    torch.testing.assert_close(loss, torch.tensor(-(3.0 + 1.5) / 3))
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.5]]))
    assert m["is_masked_frac"].item() == pytest.approx(1 / 3)


def test_mis_sequence_weights_by_the_sequence_ratio_and_masks_whole_sequences():
    # seq 0: W = 3·0.25·1.5 = 1.125 ∈ [1/2, 2], every token weighted 1.125; seq 1: W = 3 > 2, masked.
    prox = torch.cat([PROX, PROX])  # (2, 3)
    behaviour = torch.cat([BEHAVIOUR, PROX - torch.log(torch.tensor([[3.0, 1.0, 1.0]]))])
    lp = prox.clone().requires_grad_(True)
    loss, m = grpo_loss(
        lp, behaviour, torch.tensor([1.0, 1.0]), torch.ones(2, 3), LossSettings(correction="mis-sequence"), prox_logprobs=prox
    )
    loss.backward()
    torch.testing.assert_close(loss.detach(), torch.tensor(-3 * 1.125 / 6))
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.125 / 6] * 3, [0.0] * 3]))
    assert m["is_masked_frac"].item() == pytest.approx(0.5)


def test_the_clip_acts_on_pi_over_prox_and_w_multiplies_it():
    # π_θ = π_prox·e^0.5 on every token, A = −1: r = e^0.5 > 1 + eps_high, PPO's min takes the
    # unclipped r·A (below −1.28), dual-clip c = 3 leaves it; tis ω = (2, 0.25, 1.5).
    r = math.exp(0.5)
    loss, grad, m = _loss("tis", logprobs=PROX + 0.5, adv=torch.tensor([-1.0]))
    omega = torch.tensor([[2.0, 0.25, 1.5]])
    torch.testing.assert_close(loss, omega.sum() * r / 3)
    torch.testing.assert_close(grad, omega * r / 3)  # d(−ω·r·A)/dlogπ = −ω·r·A
    assert m["clip_frac_low"].item() == 0.0  # the clip sees r > 1, not ρ = π_θ/μ (0.41 on token 1)


def test_the_mismatch_kl_is_k3_of_behaviour_to_proximal():
    _, _, m = _loss("none")
    expected = (W - 1 - torch.log(W)).mean()
    torch.testing.assert_close(m["mismatch_kl"], expected)
    torch.testing.assert_close(m["abs_log_w"], torch.log(W).abs().mean())


def _old_loss(logprobs, behaviour, adv, mask, eps_low=0.2, eps_high=0.28, c=3.0):
    """The loss before the corrections existed (token-mean, no KL), written out again."""
    mask = mask.to(logprobs.dtype)
    adv = adv.unsqueeze(1)
    log_ratio = ((logprobs - behaviour.detach()) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    surrogate = torch.where(adv < 0, torch.maximum(surrogate, c * adv), surrogate)
    return (-surrogate * mask).sum() / max(1.0, float(mask.sum()))


@pytest.mark.parametrize("with_prox", [False, True])
def test_none_reproduces_the_old_loss_bit_for_bit(with_prox):
    g = torch.Generator().manual_seed(7)
    lp = -torch.rand(4, 9, generator=g) * 3
    behaviour = lp + torch.randn(4, 9, generator=g) * 0.7
    prox = lp + torch.randn(4, 9, generator=g) * 0.1
    adv = torch.randn(4, generator=g)
    mask = (torch.rand(4, 9, generator=g) > 0.2).float()
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    old = _old_loss(a, behaviour, adv, mask)
    old.backward()
    new, _ = grpo_loss(b, behaviour, adv, mask, LossSettings(correction="none"), prox_logprobs=prox if with_prox else None)
    new.backward()
    assert torch.equal(old.detach(), new.detach())
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("correction", ["tis", "mis-token", "mis-sequence", "icepop"])
def test_every_correction_without_proximal_log_probs_is_the_old_loss(correction):
    lp = torch.tensor([[-1.0, -0.3], [-2.0, -0.1]])
    behaviour = torch.tensor([[-0.5, -0.9], [-2.5, -0.2]])
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    a, _ = grpo_loss(lp, behaviour, adv, mask, LossSettings(correction="none"))
    b, _ = grpo_loss(lp, behaviour, adv, mask, LossSettings(correction=correction))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"correction": "is"}, "correction"),
        ({"correction_cap": 1.0}, "correction_cap"),
        ({"correction_cap": float("inf")}, "correction_cap"),
        ({"icepop_band": (1.2, 5.0)}, "icepop_band"),
        ({"icepop_band": (0.5, 0.9)}, "icepop_band"),
        ({"prox_logprobs": torch.zeros(1, 2)}, "prox_logprobs"),
    ],
)
def test_bad_correction_settings_are_refused_by_name(kw, match):
    settings = {k: v for k, v in kw.items() if k != "prox_logprobs"}
    tensors = {k: v for k, v in kw.items() if k == "prox_logprobs"}
    with pytest.raises(InvalidArgument, match=match):
        grpo_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), LossSettings(**settings), **tensors
        )


def test_mismatch_summary_gives_percentiles_and_k3_by_age():
    log_w = torch.tensor([0.0, 0.1, -0.2, 0.4])
    ages = torch.tensor([0, 0, 4, 4])
    out = mismatch_summary([(log_w[:2], ages[:2]), (log_w[2:], ages[2:])])
    q = torch.quantile(log_w.abs().double(), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    assert out["abs_log_w_p50"] == pytest.approx(float(q[0]))
    assert out["abs_log_w_p99"] == pytest.approx(float(q[2]))

    def k3(x):
        return math.exp(x) - 1 - x

    assert out["mismatch_kl_age_0"] == pytest.approx((k3(0.0) + k3(0.1)) / 2)
    assert out["mismatch_kl_age_4"] == pytest.approx((k3(-0.2) + k3(0.4)) / 2)
    assert mismatch_summary([]) == {}


def test_the_mismatch_gauges_follow_the_step_record():
    m = LearnerMetrics()
    m.record({"mismatch_kl": 0.02, "mismatch_kl_age_3": 0.05, "abs_log_w_p90": 0.4, "is_masked_frac": 0.1, "step": 1})
    get = m.registry.get_sample_value
    assert get("prioreplay_learner_offpolicy_mismatch_kl", {"age": "all"}) == 0.02
    assert get("prioreplay_learner_offpolicy_mismatch_kl", {"age": "3"}) == 0.05
    assert get("prioreplay_learner_offpolicy_abs_log_w", {"quantile": "0.9"}) == 0.4
    assert get("prioreplay_learner_offpolicy_correction_fraction", {"kind": "masked"}) == 0.1
    assert get("prioreplay_learner_offpolicy_correction_fraction", {"kind": "truncated"}) == 0.0


@pytest.mark.parametrize("correction", ["none", "tis", "mis-token", "mis-sequence", "icepop"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_every_correction_sums_over_sequence_shards_as_the_distributed_learner_needs(correction, aggregation):
    """The distributed learner runs the same micro_batch_loss on each rank's contiguous shard of
    sequences with the whole batch's normaliser and sums the gradients: that is the one-process loss
    only if each correction (mis-sequence included) is additive over sequence shards."""
    g = torch.Generator().manual_seed(3)
    prox = -torch.rand(4, 5, generator=g) * 3  # (B, T) π_prox log-probs
    log_w = torch.rand(4, 5, generator=g) * 3 - 1.5  # (B, T) in [−1.5, 1.5]: the token bands are crossed
    log_w[0] = log_w[0] / 20  # sequence 0 stays inside mis-sequence's band (its sum of log w is small)
    behaviour = prox - log_w
    logprobs = prox + torch.randn(4, 5, generator=g) * 0.2  # (B, T) π_θ, some ratios clipped
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0.0
    mask[3, 1:] = 0.0
    norm = float(mask.sum()) if aggregation == "token-mean" else 4.0

    def loss(rows):
        lp = logprobs[rows].clone().requires_grad_(True)
        out, _ = grpo_loss(
            lp, behaviour[rows], adv[rows], mask[rows], LossSettings(aggregation=aggregation, correction=correction),
            normalizer=norm, prox_logprobs=prox[rows],
        )  # fmt: skip
        out.backward()
        return out.detach(), lp.grad

    whole, whole_grad = loss(slice(0, 4))
    (a, grad_a), (b, grad_b) = loss(slice(0, 2)), loss(slice(2, 4))
    torch.testing.assert_close(a + b, whole)
    torch.testing.assert_close(torch.cat([grad_a, grad_b]), whole_grad)
    assert whole.abs().item() > 0
