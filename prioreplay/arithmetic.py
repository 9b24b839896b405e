"""Generated arithmetic problems: ``arithmetic:N[:seed[:level[:style]]]`` of
:func:`prioreplay.datasets.iter_problems`, from 1-digit sums to 4-digit products.

No file needed: problem i depends only on (namespace, seed, i), so a shorter set is a prefix of a
longer one with the same seed. The levels (``ARITH_LEVELS``) and prompt styles (``ARITH_STYLES``)
are described at :func:`arithmetic_problems`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord

_DIGIT_WEIGHTS = (0.35, 0.30, 0.20, 0.15)  # operand digits 1..4: mostly easy, some hard
_OPS = ("+", "-", "*")
_ARITH_BLOCK = 1024
_OP_NAMES = {"+": "add", "-": "subtract", "*": "multiply"}


def _operand(rng: random.Random, digits: int) -> int:
    """A random operand with exactly ``digits`` digits (1-digit operands are 1..9, never 0)."""
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


#: Difficulty levels of ``arithmetic:N:seed:LEVEL``.
ARITH_LEVELS = ("mixed", "easy", "trivial", "hard", "tiers", "recall")
#: The tiers of ``tiers``, drawn with equal chance per problem: aimed at all-right, mixed and
#: all-wrong first-visit groups of the base model (``compare.*`` in benchmarks/RESULTS.md).
TIER_LEVELS = ("trivial", "easy", "hard")
#: Prompt styles of ``arithmetic:N:seed:LEVEL:STYLE`` (``{expr}`` is the expression).
ARITH_STYLES = {
    "plain": "Compute {expr}. Give only the final number.",
    "line": "Compute {expr}. Reply with one line: Answer: <number>",
    "short": "{expr} =",
}
#: The prompt of level ``recall`` (every style): a 1-digit count stated, then asked back; the name
#: and the object vary (8 × 8 × 9 = 576 prompts), so a set of recall problems is not a handful of
#: prompts repeated and a held-out slice disjoint from it exists.
RECALL_PROMPT = "{name} has {n} {things}. How many {things} does {name} have?"
RECALL_NAMES = ("Tom", "Ann", "Sam", "Lily", "Max", "Emma", "Ben", "Mia")
RECALL_THINGS = ("apples", "books", "pens", "cats", "balls", "cards", "cups", "shells")


def _easy_operands(rng: random.Random) -> tuple[list[str], list[int]]:
    """``easy``: one +, − or × ; sums and differences of 1–2 digit operands, 1-digit products."""
    op = rng.choice(_OPS)
    digits = [1, 1] if op == "*" else [rng.choice((1, 2)) for _ in range(2)]
    return [op], digits


def _tier_operands(rng: random.Random, level: str) -> tuple[list[str], list[int]]:
    """``trivial``: a sum of two 1-digit operands; ``hard``: a 3-digit by 2-digit product."""
    return (["+"], [1, 1]) if level == "trivial" else (["*"], [3, 2])


def _arithmetic_problem(rng: random.Random, problem_id: str, level: str = "mixed", style: str = "plain") -> ProblemRecord:
    """One problem. ``mixed``: a single +, −, × on 1–4 digit operands, or (1 in 5) two
    operations; ``easy``: see :func:`_easy_operands`; ``trivial`` / ``hard``:
    :func:`_tier_operands`; ``tiers``: one of :data:`TIER_LEVELS` drawn per problem (its
    ``tier`` metadata); ``recall``: :data:`RECALL_PROMPT` with a 1-digit count, no operation.
    ``style`` picks the prompt's wording (not ``recall``'s)."""
    if level == "recall":
        n, name, things = _operand(rng, 1), rng.choice(RECALL_NAMES), rng.choice(RECALL_THINGS)
        meta = {"source": "arithmetic", "operation": "recall", "digits": "1", "max_digits": "1", "level": level}
        prompt = RECALL_PROMPT.format(n=n, name=name, things=things)
        return ProblemRecord(id=problem_id, prompt=prompt, answer=str(n), verifier="gsm8k", metadata=meta)
    tier = rng.choice(TIER_LEVELS) if level == "tiers" else level
    if tier == "easy":
        ops, digits = _easy_operands(rng)
    elif tier in ("trivial", "hard"):
        ops, digits = _tier_operands(rng, tier)
    elif rng.random() < 0.2:
        ops = [rng.choice(_OPS), rng.choice(("+", "-"))]
        digits = [rng.choices((1, 2), weights=(0.6, 0.4))[0] for _ in range(3)]
    else:
        ops = [rng.choice(_OPS)]
        digits = [rng.choices((1, 2, 3, 4), weights=_DIGIT_WEIGHTS)[0] for _ in range(2)]
        if ops[0] == "*" and sum(digits) > 6:  # keep 4x4-digit products rare but possible
            digits[1] = rng.choices((1, 2, 3, 4), weights=(0.4, 0.3, 0.2, 0.1))[0]
    values = [_operand(rng, d) for d in digits]
    if ops == ["-"] and values[0] < values[1]:
        values.reverse()
        digits.reverse()
    answer = values[0]
    expr = str(values[0])
    if len(ops) == 2 and ops[0] == "*":  # a * b ± c: Python precedence matches the written one
        answer = values[0] * values[1]
        answer = answer + values[2] if ops[1] == "+" else answer - values[2]
        expr = f"{values[0]} * {values[1]} {ops[1]} {values[2]}"
    else:
        for op, v in zip(ops, values[1:], strict=True):
            answer = answer + v if op == "+" else answer - v if op == "-" else answer * v
            expr += f" {op} {v}"
    metadata = {
        "source": "arithmetic",
        "operation": ",".join(_OP_NAMES[o] for o in ops),
        "digits": ",".join(map(str, digits)),
        "max_digits": str(max(digits)),
        "level": level,
    }
    if level == "tiers":
        metadata["tier"] = tier
    return ProblemRecord(
        id=problem_id, prompt=ARITH_STYLES[style].format(expr=expr), answer=str(answer), verifier="gsm8k", metadata=metadata
    )


def arithmetic_problems(
    n: int, seed: int = 0, *, namespace: str = "arith", level: str = "mixed", style: str = "plain"
) -> Iterator[ProblemRecord]:
    """``n`` generated arithmetic problems with ids ``<namespace>-<seed>-<i>``, i = 0..n−1
    (``<namespace>-<level>-<style>-<seed>-<i>`` for another level or style than the defaults).

    Problem i depends only on (namespace, seed, i) (the RNG is seeded per block of 1,024), so ``arithmetic:100:7`` is a prefix of
    ``arithmetic:1000:7``. The mix runs from 1-digit sums to 4-digit products; about one in five
    has two operations (``a * b + c`` or ``a + b - c``). Answers are exact integers (possibly
    negative for two-operation problems); the verifier is ``gsm8k`` (final number in the
    completion). ``metadata`` gives ``operation`` (e.g. ``multiply`` or ``add,subtract``),
    ``digits`` (per operand), ``max_digits`` and ``level``.

    ``level="easy"`` draws one +, − (1–2 digit operands) or × (1-digit operands): the level
    at which a 135M-parameter model is right about half of the time (``demo_defaults.*`` in benchmarks/RESULTS.md, pass
    rates), so that many GRPO groups are mixed. ``level="tiers"`` is the realistic mix: each
    problem is ``trivial`` (a 1-digit sum), ``easy`` or ``hard`` (3-digit × 2-digit) with equal
    chance, so the base model's first-visit groups have both tails (all right, all wrong) beside
    the mixed ones; ``metadata["tier"]`` names the tier. ``style`` words the prompt (``ARITH_STYLES``):
    ``line`` asks for one ``Answer: <number>`` line, which pairs with stop string ``\n``.
    ``level="recall"`` is easier than any sum: a one-sentence word problem states a 1-digit count
    and asks it back (:data:`RECALL_PROMPT`, same wording in every style; ``operation`` is
    ``recall``), for an all-right tail: SmolLM2-135M-Instruct answers it about 70% of the time at
    T = 0.7 with a newline stop, where its 1-digit sums pass about a third (``mix.*`` in
    benchmarks/RESULTS.md).

    Raises:
        InvalidArgument: n < 0, an unknown level or style.
    """
    if n < 0:
        raise InvalidArgument(f"arithmetic problem count ({n}) must be >= 0")
    if level not in ARITH_LEVELS:
        raise InvalidArgument(f"arithmetic level {level!r} is unknown; use one of {', '.join(ARITH_LEVELS)}")
    if style not in ARITH_STYLES:
        raise InvalidArgument(f"arithmetic prompt style {style!r} is unknown; use one of {', '.join(ARITH_STYLES)}")
    if (level, style) != ("mixed", "plain"):
        namespace = f"{namespace}-{level}-{style}"
    rng = random.Random()
    for i in range(n):
        if i % _ARITH_BLOCK == 0:  # one seeding per block: problem i depends on (seed, i) only
            rng = random.Random(f"{namespace}/{seed}/{i // _ARITH_BLOCK}")
        yield _arithmetic_problem(rng, f"{namespace}-{seed}-{i}", level, style)
