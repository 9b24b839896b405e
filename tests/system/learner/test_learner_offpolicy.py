"""The learner's off-policy correction end to end on the tiny model: each step's record carries the
mismatch figures (k3 KL(μ‖π_prox) overall and by policy age, |log w| percentiles, truncated and
masked shares), and the Prometheus gauges follow them."""

from __future__ import annotations

import pytest

from tests.system.learner import test_learner as tl


@pytest.mark.parametrize("correction", ["none", "tis", "mis-sequence"])
def test_a_step_records_the_mismatch_by_policy_age(server, client, tiny_dir, tmp_path, correction):  # noqa: F811
    from prioreplay.learner.learner import Learner

    tl.feed(client, tiny_dir, 2, seed=5)  # behaviour log-probs from the same tiny model in fp32
    learner = Learner(tl.make_config(server, tiny_dir, tmp_path, off_policy_correction=correction, prefetch=False))
    result = learner.step()
    rec = result.record
    assert result.trained
    # the workers' engine here is the learner's own model and weights: the gap is rounding only
    assert 0.0 <= rec["mismatch_kl"] < 1e-4
    assert rec["mismatch_kl_age_0"] == pytest.approx(rec["mismatch_kl"], abs=1e-6)
    assert 0.0 <= rec["abs_log_w_p50"] <= rec["abs_log_w_p90"] <= rec["abs_log_w_p99"] < 1e-2
    assert rec["is_truncated_frac"] == 0.0 and rec["is_masked_frac"] == 0.0
    get = learner.metrics.registry.get_sample_value
    assert get("prioreplay_learner_offpolicy_mismatch_kl", {"age": "0"}) == rec["mismatch_kl_age_0"]
    assert get("prioreplay_learner_offpolicy_abs_log_w", {"quantile": "0.99"}) == rec["abs_log_w_p99"]
