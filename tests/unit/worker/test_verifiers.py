"""Verifiers: gsm8k final-number, math (math-verify), exact; errors and threads."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from prioreplay import verifiers
from prioreplay.errors import InvalidArgument
from prioreplay.problems import KNOWN_VERIFIERS
from prioreplay.verifiers import VerifyResult, final_number, get_verifier, verify


def gsm8k_references(gsm8k_dir) -> list[str]:
    lines = (gsm8k_dir / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["answer"] for line in lines]


def test_registry_matches_store_names():
    assert set(verifiers.known_verifiers()) == set(KNOWN_VERIFIERS)
    for name in KNOWN_VERIFIERS:
        assert callable(get_verifier(name))


def test_unknown_verifier_lists_known_ones():
    with pytest.raises(InvalidArgument, match="'regex'.*math, gsm8k, exact"):
        verify("regex", "1", "1")
    with pytest.raises(InvalidArgument, match="math, gsm8k, exact"):
        get_verifier("")
    with pytest.raises(InvalidArgument, match="timeout_s"):
        verify("math", "1", "1", timeout_s=0)


# --------------------------------------------------------------------------- gsm8k


def test_every_gsm8k_reference_verifies_and_a_perturbed_one_does_not(gsm8k_dir):
    references = gsm8k_references(gsm8k_dir)
    assert len(references) == 1319
    for ref in references:
        number = Decimal(ref.split("####")[-1].strip().replace(",", ""))
        right = f"Let me think step by step. 3 + 4 = 7, so the answer is {number}."
        wrong = f"Let me think step by step. 3 + 4 = 7, so the answer is {number + 1}."
        assert verify("gsm8k", right, ref) == VerifyResult(1.0, None), (ref, right)
        assert verify("gsm8k", wrong, ref) == VerifyResult(0.0, None), (ref, wrong)
    # references as stored by the loader (the bare number) behave the same
    number = references[0].split("####")[-1].strip()
    assert verify("gsm8k", f"#### {number}", number).reward == 1.0


@pytest.mark.parametrize(
    "completion, reference, reward",
    [
        ("The answer is 1,234.", "1234", 1.0),
        ("She pays $1,234.", "#### 1,234", 1.0),
        ("So 1234.0", "1234", 1.0),
        ("#### 42\nCheck: 40 + 3 = 43", "42", 1.0),  # '####' wins over later numbers
        ("I get \\boxed{17} (from 16 + 1)", "17", 1.0),  # \boxed wins over later numbers
        ("The total is -7", "-7", 1.0),
        ("I computed 5-3", "-3", 0.0),  # a hyphen after a digit is not a sign
        ("I computed 5-3", "3", 1.0),
        ("21 + 39 - 96 =-36", "-36", 1.0),
        ("Answer: 12.50 dollars", "12.5", 1.0),
        ("The answer is 1,234.", "1235", 0.0),
        ("it is 7 or 8", "7", 0.0),  # the final number counts
    ],
)
def test_gsm8k_final_number_rules(completion, reference, reward):
    assert verify("gsm8k", completion, reference) == VerifyResult(reward, None)


def test_final_number_extraction():
    assert final_number("The answer is $1,234.") == Decimal(1234)
    assert final_number("no digits") is None
    assert final_number("1" * 10_000) is None  # too long to be an answer


# --------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "completion, reference, reward",
    [
        ("So the answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("So the answer is \\boxed{\\frac{1}{2}}.", "1/2", 1.0),
        ("The answer is 0.5", "\\frac{1}{2}", 1.0),
        ("The answer is 1/2", "\\frac{1}{2}", 1.0),
        ("$\\dfrac{6}{8}$", "\\frac{3}{4}", 1.0),
        ("\\boxed{\\frac{2}{3}}", "\\frac{1}{2}", 0.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("The answer is 50%", "50%", 1.0),  # bare references as the loader infers them
        ("\\boxed{50\\%}", "50%", 1.0),
        ("the answer is 40%", "50%", 0.0),
        ("so \\boxed{(1, 2)}", "(1, 2)", 1.0),
        ("so \\boxed{-\\frac34}", "-3/4", 1.0),
        ("so \\boxed{\\sqrt{2}}", "sqrt(2)", 1.0),
    ],
)
def test_math_symbolic_equivalence(completion, reference, reward):
    assert verify("math", completion, reference) == VerifyResult(reward, None)


# A reference is read the way a completion's boxed answer is (Skywork-OR1 #16): an escaped
# currency sign ``\$`` is a literal dollar, not a math delimiter, on either side.
@pytest.mark.parametrize(
    "completion, reference, reward",
    [
        ("\\boxed{\\$18.90}", "\\$18.90", 1.0),
        ("\\boxed{18.90}", "\\$18.90", 1.0),
        ("so \\boxed{18.9}.", "\\$18.90", 1.0),
        ("\\boxed{\\$18.90}", "18.90", 1.0),
        ("\\boxed{\\$18.90}", "\\boxed{\\$18.90}", 1.0),
        ("\\boxed{\\$18.90}", "$18.90$", 1.0),
        ("\\boxed{\\$19.90}", "\\$18.90", 0.0),
        ("\\boxed{18}", "\\$18.90", 0.0),
    ],
)
def test_escaped_currency_in_a_reference_reads_as_its_number(completion, reference, reward):
    assert verify("math", completion, reference) == VerifyResult(reward, None)


# --------------------------------------------------------------------------- exact


@pytest.mark.parametrize(
    "completion, reference, reward",
    [
        ("  Paris. ", "paris", 1.0),
        ("New   York\n", "new york", 1.0),
        ("PARIS", "Paris.", 1.0),
        ("Lyon", "Paris", 0.0),
        ("Paris is the capital", "Paris", 0.0),
    ],
)
def test_exact_normalised_match(completion, reference, reward):
    assert verify("exact", completion, reference).reward == reward


# --------------------------------------------------------------------------- malformed input

MALFORMED_COMPLETIONS = ["", "no number at all", "}}{{\\boxed{ \\frac{ $$ #### ", "9" * 10_000, "\x00\udcff"]


@pytest.mark.parametrize("name", KNOWN_VERIFIERS)
@pytest.mark.parametrize("completion", MALFORMED_COMPLETIONS, ids=["empty", "no_number", "garbage", "10kb_digits", "control"])
def test_malformed_completions_give_zero_not_exceptions(name, completion):
    result = verify(name, completion, "12")
    assert result.reward == 0.0
    assert result.error is None or isinstance(result.error, str)
    assert get_verifier(name)(completion, "12") == 0.0


def test_verifier_failure_becomes_error_string():
    result = verify("gsm8k", "The answer is 3.", "no number here")
    assert result.reward == 0.0 and "no number" in result.error
    result = verify("gsm8k", None, "3")  # type: ignore[arg-type]
    assert result.reward == 0.0 and "must be strings" in result.error


# --------------------------------------------------------------------------- threads and time-outs

CASES = [("\\boxed{\\frac{1}{2}}", "0.5"), ("1/3", "\\frac{1}{2}"), ("The answer is 42", "42"), ("", "1")]


def test_math_verify_works_from_worker_threads():
    in_main = [verify("math", c, r) for c, r in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        in_threads = list(pool.map(lambda cr: verify("math", *cr), CASES))
    assert in_threads == in_main
    assert [r.reward for r in in_threads] == [1.0, 0.0, 1.0, 0.0]
    assert all(r.error is None for r in in_threads)


# A GIL-holding input: sympy evaluates 2^(2^40) as a big-integer power in C, so no other thread of
# the interpreter runs (a signal handler or a waiting thread never gets to fire) until it ends.
GIL_HOLDER = r"\boxed{2^{2^{40}}}"

BOUNDED_SCRIPT = """
import asyncio, json, sys, time
from concurrent.futures import ThreadPoolExecutor
from prioreplay.verifiers import verify
start = time.monotonic()
with ThreadPoolExecutor(max_workers=1) as pool:
    first = pool.submit(verify, "math", sys.argv[1], "1", timeout_s=2).result()
second = asyncio.run(asyncio.to_thread(verify, "math", sys.argv[1], "1", timeout_s=2))
third = verify("math", sys.argv[1], "1", timeout_s=2)
after = verify("math", "\\\\boxed{\\\\frac{1}{2}}", "0.5")
print(json.dumps([list(r.__dict__.values()) for r in (first, second, third, after)] + [time.monotonic() - start]))
"""


def test_gil_holding_math_input_is_bounded_from_threads_event_loops_and_main():
    """verify() with a GIL-holding input returns after its time-out from a ThreadPoolExecutor,
    asyncio.to_thread and the main thread (issue 13). Run in a child interpreter so that a
    regression fails (killed after 120 s) instead of hanging the test session."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", BOUNDED_SCRIPT, GIL_HOLDER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    *results, elapsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[:3] == [[0.0, "math: TimeoutError: timed out after 2s"]] * 3
    assert results[3] == [1.0, None]  # the pool recovers after killing the stuck process
    assert elapsed < 60  # three 2 s time-outs and process starts; unbounded before the fix


def test_gil_holding_input_in_this_process_pool_recovers():
    with ThreadPoolExecutor(max_workers=3) as pool:
        stuck = pool.submit(verify, "math", GIL_HOLDER, "1", timeout_s=1)
        fine = [pool.submit(verify, "math", c, r) for c, r in CASES]
        assert stuck.result(timeout=120) == VerifyResult(0.0, "math: TimeoutError: timed out after 1s")
        assert [f.result(timeout=120).reward for f in fine] == [1.0, 0.0, 1.0, 0.0]


# --------------------------------------------------------------------------- number normaliser (issue 13)

# One table: every way of writing a sign, a currency, a thousands separator or a unit that the
# gsm8k verifier reads through one normaliser, for the completion and the reference alike.
NORMALISER_CASES = [
    ("The answer is \u22125.", "5", 0.0),  # U+2212 minus is a sign
    ("The answer is \u22125.", "-5", 1.0),
    ("\\boxed{\u22125}", "-5", 1.0),
    ("-$5", "-5", 1.0),  # sign before the currency
    ("$-5", "-5", 1.0),
    ("-\\$5", "-5", 1.0),  # LaTeX-escaped dollar
    ("It costs \u20ac1,000.", "1000", 1.0),  # euro, thousands comma, trailing period
    ("It costs \u00a31,000.50 in total", "1000.5", 1.0),
    ("The answer is \u20135", "-5", 1.0),  # en dash used as a minus
    ("The answer is \u20145", "-5", 1.0),  # em dash used as a minus
    ("The answer is \uff0d5", "-5", 1.0),  # full-width hyphen-minus
    ("The answer is 1\u202f000", "1000", 1.0),  # narrow no-break space as thousands separator
    ("The answer is 1\u2009000", "1000", 1.0),  # thin space as thousands separator
    ("The answer is 12 kg.", "12", 1.0),  # trailing unit and period
    ("The answer is 12kg", "12", 1.0),
    ("The answer is 7 dollars.", "7", 1.0),
    ("Pages 5\u20137", "7", 1.0),  # an en dash after a digit is a range, not a sign
    ("The answer is +5", "5", 1.0),
    ("The answer is 5", "\u22125", 0.0),  # the reference goes through the same normaliser
    ("The answer is -5", "#### \u22125", 1.0),
    ("The answer is -5", "-$5", 1.0),
]


@pytest.mark.parametrize("completion, reference, reward", NORMALISER_CASES)
def test_gsm8k_number_normaliser_table(completion, reference, reward):
    assert verify("gsm8k", completion, reference) == VerifyResult(reward, None)


@pytest.mark.parametrize("completion, reference", [("\u22125", "-5"), ("\u2212 5 apples", "- 5 apples")])
def test_exact_reads_unicode_minus_as_minus(completion, reference):
    assert verify("exact", completion, reference).reward == 1.0


# --------------------------------------------------------------------------- the marked answer wins anywhere (issue 13)

CHATTER = "Let me double-check this once more. " * 130 + "By the way, 2 + 2 = 4"  # > 4,096 characters


@pytest.mark.parametrize(
    "completion",
    [
        "#### 42\n" + CHATTER,
        "So the answer is \\boxed{42}.\n" + CHATTER,
    ],
)
def test_marked_answer_before_long_chatter_wins(completion):
    assert len(CHATTER) > verifiers.MAX_COMPLETION_CHARS
    assert verify("gsm8k", completion, "42") == VerifyResult(1.0, None)
    assert verify("gsm8k", completion, "4") == VerifyResult(0.0, None)
    assert verify("math", completion, "42") == VerifyResult(1.0, None)
    assert verify("math", completion, "4") == VerifyResult(0.0, None)


def test_final_number_fallback_only_without_a_marked_answer():
    assert verify("gsm8k", "I think 41. " + CHATTER, "4").reward == 1.0
    assert verify("gsm8k", "I think 41. " + CHATTER, "41").reward == 0.0


def test_many_unclosed_boxes_are_read_in_linear_time():
    text = "\\boxed{" * 20_000 + "7"
    start = time.monotonic()
    assert final_number(text) == Decimal(7)
    assert time.monotonic() - start < 5  # quadratic scanning took minutes
