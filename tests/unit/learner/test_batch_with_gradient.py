"""Zero-advantage sequences carry no gradient without a KL term: the learner leaves them out of the
forward/backward (``Batch.with_gradient``) and the step's gradient is the same."""

from __future__ import annotations

import contextlib

import pytest
import torch

from prioreplay.learner.batch import Batch
from prioreplay.learner.loss import LossSettings, default_normalizer, micro_batch_loss
from prioreplay.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from prioreplay.models import load_causal_lm

    return load_causal_lm(make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3))


def _batch(advantages: list[float], seed: int = 0) -> Batch:
    """B sequences of 6 prompt + 5 completion tokens with random ids and behaviour log-probs."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(advantages), 11
    ids = torch.randint(3, 20, (B, T), generator=g)  # (B, T)
    mask = torch.zeros(B, T - 1, dtype=torch.bool)  # (B, T-1)
    mask[:, 5:] = True
    behaviour = -torch.rand(B, T - 1, generator=g) * mask  # (B, T-1)
    adv = torch.tensor(advantages)  # (B,)
    return Batch(ids, torch.ones(B, T, dtype=torch.long), mask, behaviour, adv, (adv > 0).float(), 1.0, 1.0)


def _grads(model, batch: Batch, norm: float, settings: LossSettings) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss, _ = micro_batch_loss(model, contextlib.nullcontext, batch, settings, torch.device("cpu"), norm)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_leaving_zero_advantage_sequences_out_gives_the_same_gradient(tiny):
    # two mixed groups of 4 and two zero-variance groups (plain GRPO trains them: advantages 0)
    batch = _batch([0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0])
    settings = LossSettings()
    norm = default_normalizer(batch.completion_mask, "token-mean")
    kept = batch.with_gradient(settings.kl_coef)
    assert len(kept) == 8 and bool((kept.advantages != 0).all())
    full, part = _grads(tiny, batch, norm, settings), _grads(tiny, kept, norm, settings)
    assert full.keys() == part.keys()
    for name in full:
        torch.testing.assert_close(part[name], full[name], rtol=1e-5, atol=1e-7, msg=name)
    assert any(float(g.abs().max()) > 0 for g in full.values())  # the comparison is not of zeros


def test_a_kl_term_keeps_every_sequence():
    batch = _batch([0.5, -0.5, 0.0, 0.0])
    assert batch.with_gradient(0.01) is batch
    assert len(batch.with_gradient(0.0)) == 2
    assert len(_batch([0.0, 0.0]).with_gradient(0.0)) == 1  # one kept: its zero gradient is the step's
