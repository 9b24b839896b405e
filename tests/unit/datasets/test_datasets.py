"""Dataset loaders: GSM8K, MATH, JSONL/JSON/Parquet, local `datasets` directories, arithmetic."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from prioreplay.datasets import evaluation_slice, gsm8k_final_answer, iter_problems, last_boxed
from prioreplay.errors import InvalidArgument
from prioreplay.problems import KNOWN_VERIFIERS, validate_problem


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def expected_gsm8k_answer(raw: str) -> str:
    """Independent restatement of the GSM8K rule: text after the last '#### ', commas removed."""
    return raw.split("####")[-1].strip().replace(",", "")


# --------------------------------------------------------------------------- GSM8K


def test_gsm8k_test_split_loads_with_stable_ids_and_answers(gsm8k_dir):
    path = gsm8k_dir / "test.jsonl"
    first = list(iter_problems(str(path)))
    second = list(iter_problems(str(path)))
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    assert len(first) == len(raw) == 1319
    assert [p.id for p in first] == [p.id for p in second]
    assert len({p.id for p in first}) == 1319
    assert first[0].id == "gsm8k-test-00000" and first[1318].id == "gsm8k-test-01318"
    for p, r in zip(first, raw, strict=True):
        assert p.prompt == r["question"]
        assert p.answer == expected_gsm8k_answer(r["answer"])
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.answer
        assert p.verifier == "gsm8k"
        validate_problem(p, 0, KNOWN_VERIFIERS)


def test_gsm8k_answer_extraction_uses_last_marker_and_strips_commas():
    assert gsm8k_final_answer("a #### 5 then\n#### 1,234") == "1234"
    assert gsm8k_final_answer(" 2,500 ") == "2500"
    assert gsm8k_final_answer("seven") == "seven"


def test_limit_stops_early_and_streams_lazily(tmp_path):
    rows = [{"id": f"p{i}", "prompt": f"q{i}", "answer": str(i)} for i in range(8)]
    path = write_jsonl(tmp_path / "lazy.jsonl", rows)
    with path.open("a", encoding="utf-8") as fh:
        fh.write("{not json\n")  # line 9: only reached without a limit
    assert [p.id for p in iter_problems(str(path), limit=3)] == ["p0", "p1", "p2"]
    assert list(iter_problems(str(path), limit=0)) == []
    with pytest.raises(InvalidArgument, match=re.escape(f"{path}:9")):
        list(iter_problems(str(path)))
    with pytest.raises(InvalidArgument, match="limit"):
        iter_problems(str(path), limit=-1)


# --------------------------------------------------------------------------- malformed input

MALFORMED = {
    "invalid_json": (b'{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "b", "prompt": \n', 2, "invalid JSON"),
    "not_an_object": (b'{"id": "a", "prompt": "p", "answer": "1"}\n\n[1, 2]\n', 3, "JSON object"),
    "missing_prompt": (b'{"id": "a", "answer": "1"}\n', 1, "prompt"),
    "missing_answer": (b'{"id": "a", "prompt": "p"}\n{"id": "b", "prompt": "p", "answer": "1"}\n', 1, "answer"),
    "empty_prompt": (b'{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "b", "prompt": "  ", "answer": "1"}\n', 2, "empty"),
    "empty_answer": (b'{"id": "a", "prompt": "p", "answer": ""}\n', 1, "empty"),
    "non_utf8": (b'{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "b", "prompt": "caf\xe9", "answer": "1"}\n', 2, "UTF-8"),
    "unknown_verifier": (b'{"id": "a", "prompt": "p", "answer": "1", "verifier": "regex"}\n', 1, "regex"),
    "bad_metadata": (b'{"id": "a", "prompt": "p", "answer": "1", "metadata": [1]}\n', 1, "metadata"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_lines_name_file_and_line(tmp_path, case):
    content, line, phrase = MALFORMED[case]
    path = tmp_path / f"{case}.jsonl"
    path.write_bytes(content)
    with pytest.raises(InvalidArgument) as info:
        list(iter_problems(str(path)))
    message = str(info.value)
    assert f"{path}:{line}:" in message
    assert phrase in message


def test_duplicate_ids_name_both_lines(tmp_path):
    rows = [
        {"id": "x", "prompt": "a", "answer": "1"},
        {"id": "y", "prompt": "b", "answer": "2"},
        {"id": "x", "prompt": "c", "answer": "3"},
    ]
    path = write_jsonl(tmp_path / "dup.jsonl", rows)
    with pytest.raises(InvalidArgument) as info:
        list(iter_problems(str(path)))
    assert f"{path}:3:" in str(info.value) and f"{path}:1" in str(info.value) and "'x'" in str(info.value)


def test_missing_file_and_bad_arithmetic_spec_are_clear(tmp_path):
    with pytest.raises(InvalidArgument, match="file not found"):
        list(iter_problems(str(tmp_path / "absent.jsonl")))
    with pytest.raises(InvalidArgument, match="arithmetic:N"):
        list(iter_problems("arithmetic:ten"))
    with pytest.raises(InvalidArgument, match="verifier 'regex'"):
        iter_problems("arithmetic:3", verifier="regex")


# --------------------------------------------------------------------------- generic / MATH / formats


def test_generic_rows_ids_metadata_and_verifier_inference(tmp_path):
    rows = [
        {"id": 7, "prompt": "How many?", "answer": "1,200"},
        {"prompt": "Capital of France?", "answer": "Paris", "metadata": {"topic": "geo", "n": 3}},
        {"id": "c", "prompt": "Simplify", "answer": "\\frac{1}{2}"},
        {"id": "d", "prompt": "Say hi", "answer": "hi", "verifier": "math"},
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    problems = list(iter_problems(str(path)))
    assert [p.id for p in problems] == ["7", f"{tmp_path.name}-mixed-00001", "c", "d"]
    assert [p.verifier for p in problems] == ["gsm8k", "exact", "math", "math"]
    assert problems[1].metadata == {"topic": "geo", "n": "3"}
    forced = list(iter_problems(str(path), verifier="exact", id_prefix="ds"))
    assert {p.verifier for p in forced} == {"exact"}
    assert [p.id for p in forced] == ["ds-7", "ds-00001", "ds-c", "ds-d"]


def test_generated_ids_differ_between_two_datasets_files_of_the_same_name(tmp_path):
    """data/gsm8k/train.jsonl and data/math/train.jsonl once both made train-00000... (croissant-baker #101)."""
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(3)]
    gsm8k = list(iter_problems(str(write_jsonl(tmp_path / "gsm8k" / "train.jsonl", rows))))
    math = list(iter_problems(str(write_jsonl(tmp_path / "math" / "train.jsonl", rows))))
    assert [p.id for p in gsm8k] == ["gsm8k-train-00000", "gsm8k-train-00001", "gsm8k-train-00002"]
    assert not {p.id for p in gsm8k} & {p.id for p in math}
    relative = list(iter_problems(os.path.relpath(tmp_path / "math" / "train.jsonl")))
    assert [p.id for p in relative] == [p.id for p in math]  # the same file, however it is named


def test_math_format_takes_last_boxed_with_nested_braces(tmp_path):
    rows = [
        {
            "problem": "Half?",
            "solution": "First \\boxed{3}. Then $\\boxed{\\frac{1}{\\sqrt{4}}}$.",
            "level": "Level 2",
            "type": "Algebra",
        },
        {"problem": "No box", "solution": "The answer is 3."},
    ]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    it = iter_problems(str(path))
    first = next(it)
    assert first.answer == "\\frac{1}{\\sqrt{4}}"
    assert first.verifier == "math"
    assert first.metadata == {"level": "Level 2", "type": "Algebra"}
    with pytest.raises(InvalidArgument, match=re.escape(f"{path}:2:") + ".*boxed"):
        next(it)
    assert last_boxed("\\boxed{a{b}c} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{unclosed") is None


def test_column_mapping_flags(tmp_path):
    rows = [{"uid": "u1", "q": "What is 2+2?", "a": "4"}, {"uid": "u2", "q": "3+3?", "a": "6"}]
    path = write_jsonl(tmp_path / "custom.jsonl", rows)
    with pytest.raises(InvalidArgument, match="no prompt column"):
        list(iter_problems(str(path)))
    problems = list(iter_problems(str(path), id_column="uid", prompt_column="q", answer_column="a"))
    assert [(p.id, p.prompt, p.answer) for p in problems] == [("u1", "What is 2+2?", "4"), ("u2", "3+3?", "6")]


def test_json_array_and_bom(tmp_path):
    rows = [{"id": "a", "prompt": "p", "answer": "1"}, {"id": "b", "prompt": "q", "answer": "2"}]
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps(rows), encoding="utf-8")
    assert [p.id for p in iter_problems(str(arr))] == ["a", "b"]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    assert [p.answer for p in iter_problems(str(bom))] == ["1", "2"]


def test_parquet_round_trip_matches_jsonl(tmp_path, gsm8k_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text(encoding="utf-8").splitlines()[:50]]
    jsonl = write_jsonl(tmp_path / "small.jsonl", raw)
    parquet = tmp_path / "small.parquet"
    pq.write_table(pa.Table.from_pylist(raw), parquet, row_group_size=16)
    assert list(iter_problems(str(parquet))) == list(iter_problems(str(jsonl)))

    generic = tmp_path / "generic.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"id": "g1", "prompt": "p", "answer": "x"}, {"id": "g1", "prompt": "q", "answer": "y"}]), generic
    )
    with pytest.raises(InvalidArgument, match=re.escape(f"{generic} row 2") + ".*duplicate"):
        list(iter_problems(str(generic)))


def test_local_dataset_directories(tmp_path, gsm8k_dir):
    import datasets

    raw = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text(encoding="utf-8").splitlines()[:20]]
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(raw).save_to_disk(str(saved))
    from_disk = list(iter_problems(str(saved)))
    assert [p.answer for p in from_disk] == [expected_gsm8k_answer(r["answer"]) for r in raw]
    assert from_disk[3].id == "saved-00003" and from_disk[3].verifier == "gsm8k"

    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(raw[:5]), "test": datasets.Dataset.from_list(raw[5:8])}
    ).save_to_disk(str(dd))
    assert [p.prompt for p in iter_problems(str(dd), split="test")] == [r["question"] for r in raw[5:8]]
    with pytest.raises(InvalidArgument, match="available: train, test"):
        list(iter_problems(str(dd), split="validation"))


def test_folder_of_data_files_goes_through_load_dataset(tmp_path, monkeypatch, gsm8k_dir):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    raw = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text(encoding="utf-8").splitlines()[:12]]
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", raw[:8])
    write_jsonl(folder / "test.jsonl", raw[8:])
    assert [p.prompt for p in iter_problems(str(folder), split="test")] == [r["question"] for r in raw[8:]]
    assert len(list(iter_problems(str(folder)))) == 8


# --------------------------------------------------------------------------- arithmetic

_EXPR = re.compile(r"^Compute ([\d +\-*]+)\. Give only the final number\.$")


def test_arithmetic_ids_stable_and_answers_correct():
    first = list(iter_problems("arithmetic:400:7"))
    again = list(iter_problems("arithmetic:400:7"))
    other = list(iter_problems("arithmetic:400:8"))
    assert first == again
    assert [p.id for p in first] == [f"arith-7-{i}" for i in range(400)]
    assert {p.id for p in first}.isdisjoint(p.id for p in other)
    assert sum(a.prompt != b.prompt for a, b in zip(first, other, strict=True)) > 300
    assert list(iter_problems("arithmetic:50:7")) == first[:50]  # problem i does not depend on N
    assert list(iter_problems("arithmetic:1100:7"))[:400] == first
    for p in first:
        expr = _EXPR.match(p.prompt).group(1)
        assert int(p.answer) == eval(expr, {"__builtins__": {}})  # noqa: S307 - digits and + - * only
        assert p.verifier == "gsm8k"
        operands = re.findall(r"\d+", expr)
        assert p.metadata["digits"] == ",".join(str(len(o)) for o in operands)


def test_arithmetic_spans_difficulties():
    problems = list(iter_problems("arithmetic:400:0"))
    ops = {p.metadata["operation"] for p in problems}
    assert {"add", "subtract", "multiply"} <= ops
    assert any("," in op for op in ops)  # two-operation problems
    max_digits = {p.metadata["max_digits"] for p in problems}
    assert max_digits == {"1", "2", "3", "4"}
    assert any(p.metadata["operation"] == "add" and p.metadata["max_digits"] == "1" for p in problems)
    assert any(p.metadata["operation"] == "multiply" and p.metadata["max_digits"] == "4" for p in problems)


def test_arithmetic_recall_asks_back_a_stated_one_digit_count():
    problems = list(iter_problems("arithmetic:40:0:recall"))
    assert problems[0].id == "arith-recall-plain-0-0"
    for p in problems:
        stated = re.fullmatch(r"(\w+) has (\d) (\w+)\. How many \3 does \1 have\?", p.prompt)
        assert stated is not None, p.prompt
        assert p.answer == stated.group(2) != "0"
        assert (p.metadata["operation"], p.metadata["level"]) == ("recall", "recall")
    assert len({p.answer for p in problems}) > 5  # the count varies
    assert len({p.prompt for p in problems}) > 30  # and so do the name and the object: not 9 prompts repeated
    held = evaluation_slice("arithmetic:40:0:recall", 40, seed=0)  # a disjoint held-out slice exists
    assert {p.prompt for p in held}.isdisjoint(p.prompt for p in problems)
    assert list(iter_problems("arithmetic:10:0:recall")) == problems[:10]


# --------------------------------------------------------------------------- evaluation slice


def test_evaluation_slice_arithmetic_is_disjoint_and_fixed():
    train = list(iter_problems("arithmetic:300:0"))
    held = evaluation_slice("arithmetic:300:0", 40, seed=0)
    assert len(held) == 40
    assert held == evaluation_slice("arithmetic:300:0", 40, seed=0)
    assert {p.id for p in held}.isdisjoint(p.id for p in train)
    assert {p.prompt for p in held}.isdisjoint(p.prompt for p in train)
    assert [p.id for p in evaluation_slice("arithmetic:300:0", 40, seed=1)] != [p.id for p in held]


def test_evaluation_slice_of_gsm8k_train_uses_the_test_file(gsm8k_dir, tmp_path):
    train_ids = {p.id for p in iter_problems(str(gsm8k_dir / "train.jsonl"))}
    held = evaluation_slice(str(gsm8k_dir / "train.jsonl"), 30, seed=3)
    assert len(held) == 30 and len({p.id for p in held}) == 30
    assert all(p.id.startswith("gsm8k-test-") for p in held)
    assert {p.id for p in held}.isdisjoint(train_ids)
    assert held == evaluation_slice(str(gsm8k_dir / "test.jsonl"), 30, seed=3)
    assert held != evaluation_slice(str(gsm8k_dir / "test.jsonl"), 30, seed=4)
    lonely = write_jsonl(tmp_path / "train_only.jsonl", [{"id": "a", "prompt": "p", "answer": "1"}])
    with pytest.raises(InvalidArgument, match="held-out"):
        evaluation_slice(str(lonely), 1)


def test_a_local_file_of_unknown_type_fails_at_once_without_the_hub(tmp_path):
    f = tmp_path / "data.csv"
    f.write_text("prompt,answer\n1+1,2\n")
    with pytest.raises(InvalidArgument, match=r"data\.csv: unsupported file type \.csv"):
        list(iter_problems(str(f)))


def test_math_solution_with_unbraced_boxed_loads(tmp_path):
    """MATH writes some answers as ``\\boxed 5`` (no braces): the row loads with answer 5 (issue 13)."""
    rows = [
        {"problem": "Two plus three?", "solution": "We add: $2+3=\\boxed 5$."},
        {"problem": "Negative?", "solution": "So the result is $\\boxed -3$"},
        {"problem": "Both?", "solution": "First \\boxed{1}, finally \\boxed 7."},
        {"problem": "Braced last?", "solution": "First \\boxed 7, finally \\boxed{\\frac{1}{2}}"},
    ]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    problems = list(iter_problems(str(path)))
    assert [p.answer for p in problems] == ["5", "-3", "7", "\\frac{1}{2}"]
    assert {p.verifier for p in problems} == {"math"}
    assert last_boxed("\\boxed 5") == "5"
    assert last_boxed("\\boxed") is None
    assert last_boxed("\\boxedfoo") is None


@pytest.mark.parametrize(
    "answer, verifier",
    [
        ("1/2", "math"),
        ("-3/4", "math"),
        ("(1, 2)", "math"),
        ("50%", "math"),
        ("sqrt(2)", "math"),
        ("2\\sqrt{2}", "math"),
        ("[0, 1)", "math"),
        ("3.5", "gsm8k"),
        ("-1,200", "gsm8k"),
        ("Paris", "exact"),
        ("New York", "exact"),
        ("Room 12B", "exact"),
        ("yes", "exact"),
    ],
)
def test_generic_answers_math_verify_parses_get_the_math_verifier(tmp_path, answer, verifier):
    """Answers math-verify can parse get ``math``, so a boxed LaTeX completion scores (issue 13)."""
    path = write_jsonl(tmp_path / "generic.jsonl", [{"prompt": "Q?", "answer": answer}])
    (problem,) = iter_problems(str(path))
    assert problem.verifier == verifier


def test_inferred_math_verifier_scores_a_boxed_latex_completion(tmp_path):
    from prioreplay.verifiers import verify

    path = write_jsonl(tmp_path / "generic.jsonl", [{"prompt": "Half?", "answer": "1/2"}])
    (problem,) = iter_problems(str(path))
    assert verify(problem.verifier, "...so the answer is \\boxed{\\frac12}", problem.answer).reward == 1.0


def test_inferring_a_verifier_without_math_verify_is_an_error_not_a_silent_exact(tmp_path, monkeypatch):
    """Without math-verify a '1/2' answer used to get ``exact`` (and ``math`` where it is
    installed): the same file scored differently per install. Now it names the package and the fix."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    path = write_jsonl(tmp_path / "generic.jsonl", [{"prompt": "Half?", "answer": "1/2"}])
    with pytest.raises(InvalidArgument, match="math-verify"):
        list(iter_problems(str(path)))
    # a row that names its verifier needs no inference
    path = write_jsonl(tmp_path / "named.jsonl", [{"prompt": "Half?", "answer": "1/2", "verifier": "exact"}])
    assert [p.verifier for p in iter_problems(str(path))] == ["exact"]
