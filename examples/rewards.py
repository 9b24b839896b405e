"""Two reward plugins a worker, TRL or a torch loop can score with (docs/REWARDS.md).

A plugin is ``score(completion, reference, metadata)`` returning a reward in [0, 1], or a pair
``(reward, passed)``. Used by a worker::

    prioreplay worker --reward examples/rewards.py:answer_format \\
        --reward examples/rewards.py:correct_number --reward-weights 0.2,1

The completion passes when both rewards pass: ``correct_number`` says so itself, and
``answer_format`` passes at reward 1 (``--pass-threshold``, default 1.0).
"""

import re

# The final answer as the prompt asks for it: "#### 42" on the last line, or \boxed{42}.
_MARKED = re.compile(r"(?:####[ \t]*(?P<hash>-?[\d,]*\.?\d+)[ \t]*$|\\boxed\{(?P<box>[^{}]*)\})", re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def answer_format(completion: str, reference: str, metadata: dict) -> float:
    """1.0 when the completion ends with a marked final answer ("#### N" or \\boxed{N}), 0.5 when
    it marks one earlier, else 0.0: a shaping reward that does not look at the reference."""
    text = completion.strip().rstrip(".")
    marked = list(_MARKED.finditer(text))
    if not marked:
        return 0.0
    return 1.0 if marked[-1].end() == len(text) else 0.5


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def correct_number(completion: str, reference: str, metadata: dict) -> tuple[float, bool]:
    """(1.0, True) when the completion's final number (its marked answer if any, else its last
    number) equals the reference's last number, else (0.0, False)."""
    marked = list(_MARKED.finditer(completion))
    text = (marked[-1].group("hash") or marked[-1].group("box")) if marked else completion
    got, want = _number(text or ""), _number(reference.rsplit("####", 1)[-1])
    ok = got is not None and want is not None and got == want
    return (1.0 if ok else 0.0), ok
