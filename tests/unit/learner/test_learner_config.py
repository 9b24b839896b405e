"""The learner's settings: values that travel on the wire are not configured twice."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from prioreplay.learner.config import LearnerConfig
from prioreplay.learner.loss_settings import LossSettings


@pytest.mark.parametrize("name, flag", [("temperature", "--temperature"), ("top_p", "--top-p")])
def test_sampling_settings_are_read_from_the_groups_not_configured(name, flag):
    assert name not in LearnerConfig.model_fields
    with pytest.raises(ValidationError, match=rf"{name} \(0.7\) is not a learner setting.*{flag} on the workers"):
        LearnerConfig(server="127.0.0.1:1", **{name: 0.7})


def test_scoring_truncated_completions_zero_is_refused_and_points_to_the_workers():
    """The learner's --truncated zero scored 0 where the server's statistics kept the verifier's reward."""
    with pytest.raises(ValidationError, match=r"truncated \('zero'\).*--truncated-reward zero on the workers"):
        LearnerConfig(server="127.0.0.1:1", truncated="zero")
    assert LearnerConfig(server="127.0.0.1:1", truncated="keep").truncated == "keep"


def test_fsdp_is_opt_in_and_refuses_lora_naming_the_way_out():
    """FSDP shards all weights; LoRA adapters are not sharded here, so the pair is refused at start."""
    assert LearnerConfig(server="127.0.0.1:1").parallelism == "ddp"
    with pytest.raises(ValidationError, match=r"parallelism \('fsdp'\) with lora.*--parallelism ddp"):
        LearnerConfig(server="127.0.0.1:1", parallelism="fsdp", lora=True)
    assert LearnerConfig(server="127.0.0.1:1", parallelism="fsdp").parallelism == "fsdp"


def test_fsdp_refuses_a_model_without_decoder_layers_before_sharding_anything():
    import torch

    from prioreplay.errors import InvalidArgument
    from prioreplay.learner.distributed import fully_shard_layers, tied_aliases

    with pytest.raises(InvalidArgument, match=r"Linear has no \*DecoderLayer modules.*--parallelism ddp"):
        fully_shard_layers(torch.nn.Linear(2, 2))
    tied = torch.nn.Sequential(torch.nn.Embedding(3, 2), torch.nn.Linear(2, 3, bias=False))
    tied[1].weight = tied[0].weight
    assert tied_aliases(tied) == {"1.weight": "0.weight"}  # the first name kept, as save_weights keeps it


def test_the_loss_settings_are_built_from_the_loss_fields_once_checked():
    """The learner hands the loss one frozen LossSettings; dual_clip_c 0 (off) is None there."""
    cfg = LearnerConfig(
        server="127.0.0.1:1", eps_low=0.1, eps_high=0.5, aggregation="seq-mean", kl_coef=0.01, dual_clip_c=0,
        off_policy_correction="icepop", correction_cap=3.0, icepop_low=0.4, icepop_high=4.0,
    )  # fmt: skip
    assert cfg.loss_settings == LossSettings(
        eps_low=0.1, eps_high=0.5, aggregation="seq-mean", kl_coef=0.01, dual_clip_c=None,
        correction="icepop", correction_cap=3.0, icepop_band=(0.4, 4.0),
    )  # fmt: skip
    assert LearnerConfig(server="127.0.0.1:1").loss_settings == LossSettings()  # the same defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loss_settings.kl_coef = 1.0  # type: ignore[misc]
