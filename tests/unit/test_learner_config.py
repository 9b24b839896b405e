"""The learner's settings: values that travel on the wire are not configured twice."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prioreplay.learner.config import LearnerConfig


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
