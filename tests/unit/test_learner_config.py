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
