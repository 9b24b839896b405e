"""The reasoning-gym: source (prioreplay.tasks): grammar, stable ids, and the library's scorer agreeing with ours."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym  # noqa: E402

from prioreplay.datasets import iter_problems  # noqa: E402
from prioreplay.errors import InvalidArgument  # noqa: E402
from prioreplay.problems import validate_problem  # noqa: E402
from prioreplay.verifiers import _score_rg_with  # noqa: E402

SPEC = "reasoning-gym:basic_arithmetic,leg_counting:6:3"


def test_two_tasks_round_robin_with_task_metadata_and_valid_records():
    problems = list(iter_problems(SPEC))
    assert [p.metadata["task"] for p in problems] == ["basic_arithmetic", "leg_counting"] * 3
    assert [p.id for p in problems[:2]] == ["rg-basic_arithmetic-3-0", "rg-leg_counting-3-0"]
    for i, p in enumerate(problems):
        validate_problem(p, i)
        assert p.verifier == "reasoning-gym" and p.metadata["source"] == "reasoning-gym"
        assert p.prompt.endswith("<answer> and </answer>.")


def test_same_spec_same_ids_and_problems_other_seed_or_settings_other_ids():
    a, b = list(iter_problems(SPEC)), list(iter_problems(SPEC))
    assert a == b
    other = list(iter_problems("reasoning-gym:basic_arithmetic,leg_counting:6:4"))
    assert {p.id for p in a}.isdisjoint(p.id for p in other)
    hard = list(iter_problems("reasoning-gym:leg_counting:2:3:min_animals=2:max_animals=2"))
    assert hard[0].metadata["difficulty"] == '{"max_animals": 2, "min_animals": 2}'
    assert hard[0].id.startswith("rg-leg_counting-3-") and hard[0].id != "rg-leg_counting-3-0"


def test_library_scorer_agrees_with_ours_on_its_own_entries():
    """Each library entry, scored by the library with its own answer → 1.0; ours on `<answer>answer</answer>` agrees."""
    for task in ("basic_arithmetic", "leg_counting"):
        ds = reasoning_gym.create_dataset(task, size=5, seed=3)
        ours = [p for p in iter_problems(f"reasoning-gym:{task}:5:3")]
        for entry, p in zip(ds, ours, strict=True):
            assert json.loads(p.answer)["answer"] == entry["answer"]
            assert ds.score_answer(entry["answer"], entry) == 1.0
            assert _score_rg_with(f"Thinking...\n<answer>{entry['answer']}</answer>", p.answer) == 1.0
            wrong = "not a number"
            assert ds.score_answer(wrong, entry) < 1.0
            assert _score_rg_with(f"<answer>{wrong}</answer>", p.answer) == ds.score_answer(wrong, entry)
            assert _score_rg_with(entry["answer"], p.answer) == 0.0  # no <answer> tags: nothing extracted


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("reasoning-gym:no_such_task:5", "unknown reasoning-gym task 'no_such_task'"),
        ("reasoning-gym:leg_counting:five", "N 'five' is not an integer"),
        ("reasoning-gym:leg_counting:0", "N is 0"),
        ("reasoning-gym:leg_counting", "expected reasoning-gym:<task>"),
        ("reasoning-gym:leg_counting:5:x", "seed 'x' is not an integer"),
        ("reasoning-gym:leg_counting:5:0:oops", "setting 'oops' is not key=value"),
        ("reasoning-gym:leg_counting:5:0:chess.max=2", "names task 'chess'"),
        ("reasoning-gym:leg_counting:5:0:no_knob=2", "refused settings"),
    ],
)
def test_grammar_errors_name_the_bad_part(spec, needle):
    with pytest.raises(InvalidArgument) as info:
        list(iter_problems(spec))
    assert needle in str(info.value)
