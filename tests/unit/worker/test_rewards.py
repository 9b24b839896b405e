"""Reward plugins (prioreplay.rewards, docs/REWARDS.md): naming, loading, the pool calls, the
weighted combination, the pass rule, and what a failing plugin does to a worker's group."""

from __future__ import annotations

import logging
import math
import textwrap

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.rewards import (
    ENTRY_POINT_GROUP,
    InvalidReward,
    PluginReward,
    RewardSet,
    RewardSpec,
    check_value,
    parse_specs,
)

PLUGINS = textwrap.dedent(
    """
    import time

    def half(completion, reference, metadata):
        return 0.5

    def exact(completion, reference, metadata):
        return float(completion.strip() == reference)

    def flagged(completion, reference, metadata):
        return 0.25, metadata.get("problem_id") == "p0"

    def raises(completion, reference, metadata):
        raise KeyError("no such field")

    def hangs(completion, reference, metadata):
        time.sleep(600)

    def nan(completion, reference, metadata):
        return float("nan")

    def text(completion, reference, metadata):
        return "1.0"

    def too_big(completion, reference, metadata):
        return 1.5

    async def awaits(completion, reference, metadata):
        return 1.0

    def yields(completion, reference, metadata):
        yield 1.0

    def two_args(completion, reference):
        return 1.0

    class Scorer:
        def __call__(self, completion, reference, metadata):
            return 0.25

    scorer = Scorer()
    """
)


@pytest.fixture
def plug(tmp_path):
    """``name -> 'path/plug.py:name'`` for the plugins above."""
    path = tmp_path / "plug.py"
    path.write_text(PLUGINS, encoding="utf-8")
    return lambda name: f"{path}:{name}"


def reward_set(plug, names, weights=(), threshold=1.0, timeout_s=5.0) -> RewardSet:
    return RewardSet(parse_specs([plug(n) if n != "verifier" else n for n in names], weights), threshold, timeout_s)


# -- return values --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, expected",
    [(1, (1.0, None)), (0.25, (0.25, None)), (True, (1.0, None)), ((0.5, True), (0.5, True)), ([0.0, False], (0.0, False))],
)
def test_numbers_and_pairs_are_rewards(value, expected):
    assert check_value(value) == expected


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -0.1, 1.5, "1.0", None, {"score": 1}, (1.0,), (1.0, "yes"), (0.5, True, 1)]
)
def test_anything_else_is_an_invalid_reward(value):
    with pytest.raises(InvalidReward):
        check_value(value)


# -- naming and weights ---------------------------------------------------------------------------
def test_no_reward_means_the_problems_verifier():
    assert parse_specs([]) == [RewardSpec("verifier", "", 1.0)]


@pytest.mark.parametrize(
    "names, weights, fix",
    [
        (["a:f", "b:g"], [1.0], "give one per --reward"),
        (["a:f"], [0.0], "finite number > 0"),
        (["a:f"], [math.nan], "finite number > 0"),
        (["a:f", "a:f"], [], "names a reward twice"),
        (["a:1f"], [], "'package.module:function'"),
        (["no_such_entry_point"], [], ENTRY_POINT_GROUP),
    ],
)
def test_bad_reward_settings_are_refused_with_the_fix(names, weights, fix):
    with pytest.raises(InvalidArgument) as e:
        parse_specs(names, weights)
    assert fix in str(e.value)


def test_an_entry_point_of_an_installed_package_is_found(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text("def score(c, r, m):\n    return 0.75\n", encoding="utf-8")
    dist = tmp_path / "myrewards-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myrewards\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmy-score = myrewards:score\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    [spec] = parse_specs(["my-score"])
    assert (spec.name, spec.target) == ("my-score", "myrewards:score")
    assert PluginReward("my-score").score("x", "y") == (0.75, False)


def test_a_plugin_that_cannot_be_imported_names_the_error_and_the_fix(plug):
    rewards = RewardSet(parse_specs(["no_such_package.rewards:score", plug("half")]))
    with pytest.raises(InvalidArgument) as e:
        rewards.check_imports()
    assert "ModuleNotFoundError: No module named 'no_such_package'" in str(e.value)
    assert "install its package" in str(e.value)
    with pytest.raises(InvalidArgument, match="has no function 'missing'"):
        RewardSet(parse_specs([plug("missing")])).check_imports()


def test_a_function_the_file_does_not_define_is_refused_with_the_functions_it_does_define(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "from math import sqrt\n\ndef score(c, r, m):\n    return 1.0\n\ndef _helper():\n    pass\n\n"
        "def length_bonus(c, r, m):\n    return 0.0\n",
        encoding="utf-8",
    )
    with pytest.raises(InvalidArgument) as e:
        RewardSet(parse_specs([f"{path}:scor"])).check_imports()
    assert "has no function 'scor'" in str(e.value)
    assert "it defines length_bonus, score" in str(e.value)  # its own public functions: not sqrt, not _helper


@pytest.mark.parametrize(
    "name, fix",
    [
        ("awaits", "is an async function"),
        ("yields", "is a generator function"),
        ("two_args", "cannot be called as f(completion, reference, metadata)"),
        ("Scorer", "name an instance"),
    ],
)
def test_a_plugin_whose_every_call_would_fail_is_refused_at_start(plug, name, fix):
    with pytest.raises(InvalidArgument) as e:
        RewardSet(parse_specs([plug(name)])).check_imports()
    assert fix in str(e.value) and name in str(e.value)
    with pytest.raises(InvalidArgument, match="async function"):
        PluginReward(lambda_async)


async def lambda_async(completion, reference, metadata):  # PluginReward is handed the function itself
    return 1.0


def test_a_callable_instance_is_a_plugin_and_a_missing_file_names_the_path(plug, tmp_path):
    assert PluginReward(plug("scorer")).score("x", "y") == (0.25, False)
    with pytest.raises(InvalidArgument, match="check the file's path") as e:
        RewardSet(parse_specs([f"{tmp_path / 'nope.py'}:score"])).check_imports()
    assert "install its package" not in str(e.value)
    with pytest.raises(InvalidArgument, match="'verifier' names a worker's problem verifier"):
        PluginReward("verifier")


def test_a_file_plugin_imports_modules_beside_it_and_names_what_it_could_not_import(tmp_path):
    (tmp_path / "my_helpers_beside.py").write_text("def helper(c):\n    return 0.75\n", encoding="utf-8")
    (tmp_path / "uses.py").write_text("from my_helpers_beside import helper\n\ndef score(c, r, m):\n    return helper(c)\n")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n\ndef score(c, r, m):\n    return 1.0\n")
    assert PluginReward(f"{tmp_path / 'uses.py'}:score").score("x", "y") == (0.75, False)
    with pytest.raises(InvalidArgument, match="No module named 'no_such_module_here'.*install what the file imports"):
        PluginReward(f"{tmp_path / 'broken.py'}:score")


# -- combination and pass rule (in the pool) ------------------------------------------------------
def test_rewards_combine_as_a_weighted_mean(plug):
    rewards = reward_set(plug, ["half", "exact"], [1.0, 3.0])
    right = rewards.score("42", "42", "exact", {"problem_id": "p0"})
    wrong = rewards.score("41", "42", "exact", {"problem_id": "p0"})
    assert right.reward == pytest.approx((1 * 0.5 + 3 * 1.0) / 4)
    assert wrong.reward == pytest.approx(0.5 / 4)
    assert right.failures == wrong.failures == []


def test_a_completion_passes_when_every_reward_passes(plug):
    meta = {"problem_id": "p0"}
    assert reward_set(plug, ["exact", "verifier"]).score("42", "42", "exact", meta).passed
    assert not reward_set(plug, ["exact", "verifier"]).score("42", "42 apples", "exact", meta).passed
    # a number passes at the threshold: 0.5 fails at the default 1.0, passes at 0.5
    assert not reward_set(plug, ["half"]).score("x", "y", "exact", meta).passed
    assert reward_set(plug, ["half"], threshold=0.5).score("x", "y", "exact", meta).passed
    # the function's own flag wins over the threshold, both ways
    assert reward_set(plug, ["flagged"]).score("x", "y", "exact", meta).passed
    assert not reward_set(plug, ["flagged"], threshold=0.1).score("x", "y", "exact", {"problem_id": "p1"}).passed


@pytest.mark.parametrize(
    "name, kind, text",
    [
        ("raises", "error", "KeyError"),
        ("hangs", "timeout", "timed out after 1s; make the function faster or raise --verify-timeout-s"),
        ("nan", "invalid", "nan"),
        ("text", "invalid", "str"),
        ("too_big", "invalid", "1.5"),
    ],
)
def test_a_failing_plugin_gives_zero_and_the_others_still_count(plug, name, kind, text):
    rewards = reward_set(plug, [name, "half"], timeout_s=1.0)
    scored = rewards.score("x", "y", "exact", {"problem_id": "p0"})
    assert scored.reward == pytest.approx(0.25)  # (0 + 0.5) / 2
    assert not scored.passed
    [(failed, got_kind, message)] = scored.failures
    assert (failed, got_kind) == (plug(name), kind)
    assert text in message
    assert rewards.score("x", "y", "exact", {"problem_id": "p0"}).reward == pytest.approx(0.25)  # the pool serves on


# -- a worker's group ------------------------------------------------------------------------------
def test_a_worker_counts_and_logs_a_failing_plugin_per_group_and_reports_pass_flags(plug, caplog):
    from prioreplay.rollout_worker.config import WorkerConfig
    from prioreplay.rollout_worker.worker import RolloutWorker
    from tests.unit.worker.test_worker_loop import ChildSeedBackend, G, OneProblemClient

    client = OneProblemClient()
    config = WorkerConfig(
        group_size=G, batch_size=1, metrics_port=0, reward=[plug("raises"), plug("flagged")], reward_weights=[1, 3]
    )
    worker = RolloutWorker(config, ChildSeedBackend(), client, sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger="prioreplay.worker"):
        worker.run_once()
    [outcome] = client.reported
    assert [c.reward for c in outcome.completions] == [pytest.approx(0.75 * 0.25)] * G
    assert [c.HasField("passed") and c.passed for c in outcome.completions] == [False] * G  # "raises" never passes
    errors = worker.metrics.reward_errors.labels(plug("raises"), "error")._value.get()
    assert errors == G
    assert worker.metrics.reward_errors.labels(plug("flagged"), "error")._value.get() == 0
    [line] = [r.getMessage() for r in caplog.records if "failed on" in r.getMessage()]
    assert f"problem p0: reward {plug('raises')} failed on {G} of {G} completions (error" in line


def test_the_default_worker_sends_no_pass_flag():
    from prioreplay.rollout_worker.config import WorkerConfig
    from prioreplay.rollout_worker.worker import RolloutWorker
    from tests.unit.worker.test_worker_loop import ChildSeedBackend, G, OneProblemClient

    client = OneProblemClient()
    RolloutWorker(WorkerConfig(group_size=G, batch_size=1, metrics_port=0), ChildSeedBackend(), client).run_once()
    [outcome] = client.reported
    assert [c.reward for c in outcome.completions] == [1.0] * G  # gsm8k: "the answer is 2"
    assert not any(c.HasField("passed") for c in outcome.completions)


# -- the trainer form ------------------------------------------------------------------------------
def test_a_plugin_as_a_trl_reward_function_returns_rewards_and_keeps_pass_flags(plug):
    fn = PluginReward(plug("flagged"))
    assert fn.__name__ == "flagged"
    rewards = fn(
        prompts=["a", "b"], completions=["x", [{"role": "assistant", "content": "y"}]], answer=["1", "2"], problem_id=["p0", "p1"]
    )
    assert rewards == [0.25, 0.25]
    assert fn.last_passed == [True, False]
    bad = PluginReward(plug("nan"))
    assert bad(completions=["x"], answer=["1"]) == [0.0] and bad.last_passed == [False] and bad.errors["invalid"] == 1
    with pytest.raises(InvalidArgument, match="no 'answer' column"):
        fn(completions=["x"], solution=["1"])


def test_worker_flags_name_rewards_and_weights_as_trl_does(plug):
    from prioreplay.apps.cli import parse

    cfg = parse(
        "worker", ["--reward", plug("half"), "--reward", "verifier", "--reward-weights", "1,0.5", "--pass-threshold", "0.5"]
    )
    assert (cfg.reward, cfg.reward_weights, cfg.pass_threshold) == ([plug("half"), "verifier"], [1.0, 0.5], 0.5)
    assert [(s.name, s.weight) for s in cfg.reward_set().specs] == [(plug("half"), 1.0), ("verifier", 0.5)]
    with pytest.raises(InvalidArgument, match=r"pass_threshold"):
        parse("worker", ["--pass-threshold", "0"])


@pytest.mark.parametrize("weights", ["nan", "1,inf"])
def test_a_weight_the_flag_parser_cannot_read_is_refused_with_the_value(plug, weights):
    from prioreplay.apps.cli import parse

    with pytest.raises(InvalidArgument, match=r"--reward-weights / PRIOREPLAY_REWARD_WEIGHTS \('\[.*(nan|inf)\]'\) cannot"):
        parse("worker", ["--reward", plug("half"), "--reward", plug("exact"), "--reward-weights", weights])


def test_a_reward_list_in_the_environment_that_is_not_json_says_how_to_write_it(plug, monkeypatch):
    from prioreplay.apps.cli import parse

    monkeypatch.setenv("PRIOREPLAY_REWARD", plug("half"))
    with pytest.raises(InvalidArgument, match=r"PRIOREPLAY_REWARD \(.*plug\.py:half'\) cannot be read.*a JSON list"):
        parse("worker", [])
    monkeypatch.setenv("PRIOREPLAY_REWARD", f'["{plug("half")}"]')
    assert parse("worker", []).reward == [plug("half")]
