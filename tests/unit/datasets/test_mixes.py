"""The mix: source (prioreplay.mixes): shipped and file mixes, stable ids, interleaving, task labels, held-out slice."""

from __future__ import annotations

from collections import Counter

import pytest

from prioreplay.datasets import evaluation_slice, iter_problems
from prioreplay.errors import InvalidArgument
from prioreplay.mixes import MIXES, MixComponent, mix_components
from prioreplay.problems import problem_task

ARITH_MIX = """
[[component]]
task = "sums"
source = "arithmetic:6:0:trivial"

[[component]]
task = "easy"
source = "arithmetic:3:0:easy"
"""


@pytest.fixture
def mix_file(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(ARITH_MIX)
    return path


def test_a_file_mix_labels_each_problem_with_its_component_task(mix_file):
    problems = list(iter_problems(f"mix:{mix_file}"))
    assert Counter(p.metadata["task"] for p in problems) == {"sums": 6, "easy": 3}
    assert {p.metadata["mix"] for p in problems} == {"two"}
    assert all(problem_task(p) == p.metadata["task"] for p in problems)
    # the components' own problems, unchanged but for the labels
    own = {p.id: p for p in iter_problems("arithmetic:6:0:trivial")}
    assert all(p.prompt == own[p.id].prompt and p.answer == own[p.id].answer for p in problems if p.id in own)


def test_components_interleave_in_proportion_to_their_counts(mix_file):
    tasks = [p.metadata["task"] for p in iter_problems(f"mix:{mix_file}")]
    # keys (j + 1/2) / n: sums at 1/12, 3/12, 5/12, ...; easy at 2/12, 6/12, 10/12
    assert tasks == ["sums", "easy", "sums", "sums", "easy", "sums", "sums", "easy", "sums"]


def test_the_same_spec_gives_the_same_ids_and_prompts(mix_file):
    a, b = list(iter_problems(f"mix:{mix_file}")), list(iter_problems(f"mix:{mix_file}"))
    assert [(p.id, p.prompt, p.answer) for p in a] == [(p.id, p.prompt, p.answer) for p in b]
    assert len({p.id for p in a}) == len(a)


def test_the_shipped_mix_is_stable_and_covers_its_components():
    pytest.importorskip("reasoning_gym")
    problems = list(iter_problems("mix:smollm2-tails"))
    again = list(iter_problems("mix:smollm2-tails"))
    assert [p.id for p in problems] == [p.id for p in again]
    assert len({p.id for p in problems}) == len(problems) == 96
    counts = Counter(p.metadata["task"] for p in problems)
    assert set(counts) == {c.task for c in MIXES["smollm2-tails"]}
    # the recall tier (the all-right tail) is most of the mix; the hard tasks keep the all-wrong tail
    assert counts["arith-recall"] == 60
    assert counts["arith-hard"] + counts["rg-leg_counting"] + counts["rg-basic_arithmetic"] == 20
    rg = [p for p in problems if p.metadata["task"] == "rg-leg_counting"]
    assert rg and all(p.metadata["source_task"] == "leg_counting" for p in rg)


def test_a_held_out_slice_takes_each_component_share_disjoint_from_training(mix_file):
    train = {p.id for p in iter_problems(f"mix:{mix_file}")}
    held = evaluation_slice(f"mix:{mix_file}", 6, seed=1)
    assert Counter(p.metadata["task"] for p in held) == {"sums": 4, "easy": 2}
    assert not train & {p.id for p in held}
    assert [p.id for p in held] == [p.id for p in evaluation_slice(f"mix:{mix_file}", 6, seed=1)]


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("mix:", "expected mix:<name>"),
        ("mix:nope", "unknown mix 'nope'; shipped mixes: smollm2-tails"),
        ("mix:missing.toml", "cannot read the mix file"),
    ],
)
def test_bad_specs_name_the_fix(spec, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        list(iter_problems(spec))


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("x = 1", "no \\[\\[component\\]\\] tables"),
        ('[[component]]\ntask = "a"', "needs string keys task and source"),
        ('[[component]]\ntask = "a"\nsource = "arithmetic:2"\nweight = 2', "unknown keys \\['weight'\\]"),
        ('[[component]]\ntask = "a"\nsource = "mix:smollm2-tails"', "not a mix"),
        ('[[component]]\ntask = "a"\nsource = "arithmetic:2"\n[[component]]\ntask = "a"\nsource = "arithmetic:3:1"', "repeat"),
        ('[[component]]\ntask = "a"\nsource = "arithmetic:2"\n[[component]]\ntask = "b"\nsource = "arithmetic:3"', "both give"),
        ("[[component", "cannot read the mix file"),
    ],
)
def test_malformed_mix_files_are_refused(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=fragment):
        list(iter_problems(f"mix:{path}"))


def test_a_component_label_must_be_short_and_printable():
    with pytest.raises(InvalidArgument, match="1-64 printable"):
        MixComponent("x" * 65, "arithmetic:2")
    with pytest.raises(InvalidArgument, match="1-64 printable"):
        MixComponent("a\nb", "arithmetic:2")
    assert mix_components("mix:smollm2-tails")[0] == "smollm2-tails"
