"""The simulator's calibration (benchmarks/calibrate.py): the covariates of an outcome history
follow the model's training rule, and the maximum-likelihood fit recovers the parameters of
histories the simulator generated with known ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import calibrate, simulate


def _row(pid: str, version: int, rewards: list[float], sampler: str = "heap") -> dict:
    return {"problem_id": pid, "policy_version": version, "rewards": rewards, "sampler": sampler, "seed": 0}


def test_groups_of_earlier_versions_count_as_trained_and_only_mixed_ones():
    rows = [
        _row("a", 0, [1, 0, 0, 0]),  # mixed: ω̂ = 3/16, trained in step 1
        _row("b", 0, [1, 1, 1, 1]),  # all right: trains nothing
        _row("a", 0, [1, 1, 0, 0]),  # same version: not yet trained when generated
        _row("a", 2, [1, 1, 0, 0]),
        _row("b", 2, [0, 0, 0, 0]),
        _row("a", 0, [0, 0, 0, 0], sampler="uniform"),  # another run: its own history, same problem
    ]
    h = calibrate.build_histories(rows)
    assert h.problem_ids == ("a", "b") and h.runs == ("heap-seed0", "uniform-seed0")
    got = [
        (h.problem_ids[p], h.runs[r], v, o, n, s, vis)
        for p, r, v, o, n, s, vis in zip(
            h.problem, h.run, h.version, h.own_omega, h.own_trained, h.all_omega, h.visit, strict=True
        )
    ]
    both = 3 / 16 + 1 / 4
    assert got == [
        ("a", "heap-seed0", 0, 0.0, 0, 0.0, 1),
        ("a", "heap-seed0", 0, 0.0, 0, 0.0, 2),
        ("a", "heap-seed0", 2, both, 2, both, 3),
        ("a", "uniform-seed0", 0, 0.0, 0, 0.0, 1),
        ("b", "heap-seed0", 0, 0.0, 0, 0.0, 1),
        ("b", "heap-seed0", 2, 0.0, 0, both, 2),
    ]


def test_non_binary_rewards_and_empty_histories_are_refused():
    with pytest.raises(ValueError, match="not all 0 or 1"):
        calibrate.build_histories([_row("a", 0, [0.5, 1.0])])
    with pytest.raises(ValueError, match="no outcome rows"):
        calibrate.build_histories([])


#: Known parameters of the synthetic histories: one skill (the fit's K = 1), no skill offset.
TRUE = simulate.SimParams(
    n_problems=200,
    n_skills=1,
    skill_sd=0.0,
    logit_mean=-0.5,
    problem_sd=1.5,
    group_size=8,
    batch_size=16,
    budget_rollouts=16 * 8 * 150,
    lr_problem=1.0,
    lr_skill=0.02,
    forget_drift=0.01,
)
UNIFORM = next(m for m in simulate.METHODS if m.name == "uniform")


@pytest.mark.parametrize("seed", [0, 1])
def test_fit_recovers_the_simulators_parameters(seed):
    """Tolerances: the logit mean and spread within 0.3 of the population's realised ones (200
    problems), η_b within 25%, η_z within 0.01 and δ within 0.006 of the truth (12 visits a problem)."""
    h = calibrate.build_histories(calibrate.synthetic_rows(TRUE, UNIFORM, seed))
    theta = calibrate.fit(calibrate.Likelihood(h, nodes=20), restarts=0)
    base = simulate.Population(TRUE, seed).base
    mu, sd, eta_b, eta_z, delta = theta
    assert abs(mu - base.mean()) < 0.3 and abs(sd - base.std()) < 0.3
    assert abs(eta_b - TRUE.lr_problem) < 0.25
    assert abs(eta_z - TRUE.lr_skill) < 0.01 and abs(delta - TRUE.forget_drift) < 0.006
    # the defaults (η_b 1, η_z 0.02 but a wider spread and little forgetting) fit these histories worse
    lik = calibrate.Likelihood(h, nodes=20)
    assert lik.loglik(theta) > lik.loglik(calibrate.default_theta(groups_per_step=TRUE.batch_size))


def test_predictive_check_tracks_the_rise_by_visit():
    h = calibrate.build_histories(calibrate.synthetic_rows(TRUE, UNIFORM, 0))
    lik = calibrate.Likelihood(h, nodes=20)
    check = calibrate.predictive_check(lik, calibrate.default_theta(TRUE, TRUE.batch_size))
    assert check[0]["groups"] == TRUE.n_problems
    check = calibrate.predictive_check(lik, np.array([-0.5, 1.5, 1.0, 0.02, 0.01]))  # the true θ
    assert [c["visit"] for c in check] == ["1", "2", "3", "4", "5+"]
    observed = [c["observed"] for c in check]
    assert observed == sorted(observed)  # training raises the pass rate visit after visit
    assert all(abs(c["predicted"] - c["observed"]) < 0.05 for c in check)


def test_calibrated_params_scale_forgetting_and_make_skills_of_the_runs_size():
    theta = {"logit_mean": -1.0, "logit_sd": 2.0, "lr_problem": 0.8, "lr_skill": 0.01, "forget_drift": 0.001}
    p = calibrate.calibrated_params(theta, 10_000, skill_size=64, batch_size=64, forget_scale=16)  # 200 skills of 50
    assert p.n_skills == 200 and p.skill_sd == 0.0 and p.problem_sd == 2.0 and p.group_size == 4
    assert p.forget_drift == pytest.approx(0.016) and p.lr_skill == 0.01
    assert np.allclose(calibrate.default_theta(simulate.SimParams(), 4)[[1, 4]], [np.hypot(2.0, 1.0), 0.002 / 16])


def test_the_learners_trained_groups_replace_the_next_step_rule(tmp_path):
    """With learner.jsonl's trained_groups, a group counts from the version its step published."""
    rows = [_row("a", 0, [1, 0, 0, 0]), _row("b", 0, [1, 1, 0, 0]), _row("a", 1, [1, 1, 0, 0]), _row("a", 3, [0, 0, 0, 0])]
    (tmp_path / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = [{"policy_version": 1, "trained_groups": []}, {"policy_version": 2, "trained_groups": [["a", 0, 0.25]]}]
    (tmp_path / "learner.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
    trained = calibrate.read_trained([tmp_path])
    assert trained == {"heap-seed0": [("a", 3 / 16, 2)]}  # b's mixed group was never trained
    h = calibrate.build_histories(calibrate.read_outcomes([tmp_path]), trained)
    a = h.problem == 0
    assert h.own_trained[a].tolist() == [0, 0, 1] and h.all_omega[a].tolist() == [0.0, 0.0, 3 / 16]
    assert h.all_omega[h.problem == 1].tolist() == [0.0]
