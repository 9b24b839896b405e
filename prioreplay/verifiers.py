"""Verifiers: score one completion against a problem's reference answer with a binary reward.

Three verifiers, named as in :data:`prioreplay.problems.KNOWN_VERIFIERS`:

``math``
    math-verify (Hugging Face): the reference and the completion are parsed (LaTeX, ``\\boxed``,
    plain expressions) and compared symbolically, so ``\\boxed{\\frac{1}{2}}`` matches ``0.5``
    and ``1/2``. A reference without ``$`` or ``\\boxed`` is parsed as ``\\boxed{reference}``.
``gsm8k``
    Final-number match. Reference: the number after the last ``####`` (or the whole reference).
    Completion: the number after its last ``####`` if any, else the number in its last
    ``\\boxed{...}``, else the last number in the text; thousands commas, ``$`` and a trailing
    period are handled ("The answer is $1,234." → 1234). Numbers compare exactly as decimals
    (1234 == 1234.0).
``exact``
    Normalised string match: strip, casefold, collapse whitespace, strip one trailing period.

Rewards are 1.0 (correct) or 0.0. :func:`verify` never raises for bad completions or references:
an exception or a time-out gives reward 0.0 and an ``error`` string (the worker counts these in
``prioreplay_worker_verifier_errors_total``). Only an unknown verifier name raises
:class:`InvalidArgument`.

Threads: math-verify bounds its own work with ``signal.alarm``, which only works in the main
thread. In the main thread :func:`verify` uses that (the computation is interrupted); in any
other thread math-verify runs with its time-outs disabled inside a daemon helper thread that
:func:`verify` waits on for ``timeout_s``. A helper that overruns cannot be killed; it is
abandoned (reward 0.0, error "timed out") and at most ``MAX_ABANDONED`` may be outstanding, after
which ``math`` verifications fail fast with an error until they finish.

A marked answer (``####``, ``\\boxed{...}``) wins wherever it stands in the completion; only
without one is the final answer searched in the last ``MAX_COMPLETION_CHARS`` characters.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Callable

from prioreplay.datasets import last_boxed
from prioreplay.errors import InvalidArgument
from prioreplay.problems import KNOWN_VERIFIERS

__all__ = ["VerifyResult", "verify", "get_verifier", "known_verifiers", "final_number",
           "normalize_text", "normalize_numbers", "MAX_COMPLETION_CHARS", "DEFAULT_TIMEOUT_S"]

MAX_COMPLETION_CHARS = 4096
DEFAULT_TIMEOUT_S = 5.0
MAX_ABANDONED = 8
_MAX_NUMBER_DIGITS = 200  # longer digit runs are not answers; compared as text never as numbers

# A number (after normalize_numbers): optional sign (not after a word character, so "5-3" reads
# 5 and 3), thousands groups or plain digits, optional decimals. A trailing "." or unit is
# outside the match.
_NUMBER_RE = re.compile(r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")

# Characters written for a minus sign or a dash: U+2212 minus, U+2010/2011 hyphens, U+2012
# figure dash, U+2013 en dash, U+2014 em dash, U+FE58/FE63 small forms, U+FF0D full-width.
# Before a digit (and not after one) they are a sign; after a digit a range ("5–7" reads 5, 7).
_DASHES = str.maketrans({c: "-" for c in "\u2212\u2010\u2011\u2012\u2013\u2014\ufe58\ufe63\uff0d"} | {"\uff0b": "+"})
# Currency signs (optionally LaTeX-escaped, "\\$") are dropped, so "-$5", "$-5" and "-\\$5" all read -5.
_CURRENCY_RE = re.compile(r"\\?[$\u00a2\u00a3\u00a5\u20ac\u20b9]")
# Thin, narrow no-break and no-break spaces (and "'", "1'000") between digit groups of three.
_GROUP_SPACE_RE = re.compile(r"(?<=\d)[\u2009\u202f\u00a0'](?=\d{3}(?!\d))")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # silences "Timeout is disabled" warnings


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of one verification.

    Attributes:
        reward: 1.0 when the completion's answer matches the reference, else 0.0.
        error: None, or why the verifier could not decide (exception text, "timed out after Xs").
            A result with an error always has reward 0.0.
    """

    reward: float
    error: str | None = None


# --------------------------------------------------------------------------- gsm8k

def normalize_numbers(text: str) -> str:
    """Rewrite the ways numbers are written into one form before the gsm8k verifier reads them.

    The same rules apply to completions and references: every minus/dash character becomes
    "-" (U+2212 "−5" → "-5"), currency signs are dropped ("-$5", "$-5", "€1,000" → "-5", "-5",
    "1,000"), thin/no-break spaces between digit groups are removed ("1 000" → "1000").
    Thousands commas, trailing units and periods are left for :data:`_NUMBER_RE`, which reads
    past them. The cases are tabulated in ``tests/unit/test_verifiers.py``.
    """
    text = text.translate(_DASHES)
    text = _CURRENCY_RE.sub("", text)
    return _GROUP_SPACE_RE.sub("", text)


def _to_decimal(token: str) -> Decimal | None:
    digits = normalize_numbers(token).replace(",", "").strip()
    if sum(c.isdigit() for c in digits) > _MAX_NUMBER_DIGITS:
        return None
    try:
        value = Decimal(digits)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def final_number(text: str) -> Decimal | None:
    """The final numeric answer of a completion (gsm8k rules above), or None when there is none.

    Precedence: the first number after the last ``####``; else the last number inside the last
    ``\\boxed{...}``; else the last number in the text. Example: "So she pays $1,234." → 1234.
    The marked answers (``####``, ``\\boxed``) are found wherever they stand in the text (a
    linear scan); only the final-number fallback, used when there is neither, reads the last
    ``MAX_COMPLETION_CHARS`` characters. The text goes through :func:`normalize_numbers` first
    ("−5" → -5).
    """
    if "####" in text:
        match = _NUMBER_RE.search(normalize_numbers(text.rsplit("####", 1)[1][:MAX_COMPLETION_CHARS]))
        if match:
            return _to_decimal(match.group())
    boxed = last_boxed(text) if "box" in text else None
    if boxed:
        numbers = _NUMBER_RE.findall(normalize_numbers(boxed))
        if numbers:
            return _to_decimal(numbers[-1])
    last = None
    for last in _NUMBER_RE.finditer(normalize_numbers(text[-MAX_COMPLETION_CHARS:])):
        pass
    return _to_decimal(last.group()) if last else None


def _reference_number(reference: str) -> Decimal:
    text = reference.rsplit("####", 1)[1] if "####" in reference else reference
    value = _to_decimal(text)
    if value is None:
        value = final_number(text)
    if value is None:
        raise ValueError(f"reference {reference[:80]!r} has no number; the gsm8k verifier needs a numeric answer")
    return value


def _score_gsm8k(completion: str, reference: str) -> float:
    expected = _reference_number(reference)
    got = final_number(completion)
    return 1.0 if got is not None and got == expected else 0.0


# --------------------------------------------------------------------------- exact

def normalize_text(text: str) -> str:
    """Strip, casefold, collapse runs of whitespace to one space, drop one trailing period; every
    minus/dash character (U+2212 "−", en dash...) reads as "-"."""
    out = " ".join(text.translate(_DASHES).split()).casefold()
    return out[:-1].rstrip() if out.endswith(".") else out


def _score_exact(completion: str, reference: str) -> float:
    return 1.0 if normalize_text(completion) == normalize_text(reference) else 0.0


# --------------------------------------------------------------------------- math

@lru_cache(maxsize=4096)
def _parse_reference(reference: str, timeout: int | None) -> tuple:
    from math_verify import parse

    text = reference if ("$" in reference or "\\boxed" in reference) else f"\\boxed{{{reference}}}"
    parsed = parse(text, parsing_timeout=timeout)
    if not parsed:
        raise ValueError(f"math-verify could not parse the reference {reference[:80]!r}")
    return tuple(parsed)


def _math_target(completion: str) -> str:
    """What math-verify parses of a completion: its last ``\\boxed{...}`` wherever it stands,
    else the line after its last ``####``, else its last ``MAX_COMPLETION_CHARS`` characters
    (the final answer is at the end)."""
    boxed = last_boxed(completion) if "box" in completion else None
    if boxed is not None:
        return f"\\boxed{{{boxed}}}"
    if "####" in completion:
        marked = completion.rsplit("####", 1)[1].strip().split("\n", 1)[0][:MAX_COMPLETION_CHARS]
        if marked:
            return marked
    return completion[-MAX_COMPLETION_CHARS:]


def _score_math_with(completion: str, reference: str, timeout: int | None) -> float:
    from math_verify import parse
    from math_verify import verify as mv_verify

    gold = list(_parse_reference(reference, timeout))
    target = parse(_math_target(completion), parsing_timeout=timeout)
    if not target:
        return 0.0
    return 1.0 if mv_verify(gold, target, timeout_seconds=timeout) else 0.0


_abandoned = 0
_abandoned_lock = threading.Lock()


def _score_math(completion: str, reference: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """math-verify's symbolic comparison, bounded by ``timeout_s`` seconds in any thread.

    Raises:
        TimeoutError: the comparison took longer than ``timeout_s``.
        RuntimeError: too many earlier comparisons are still running after their time-out.
        Exception: whatever math-verify raises (verify() turns these into errors).
    """
    if threading.current_thread() is threading.main_thread():
        # signal.alarm takes whole seconds: round up so the bound is never shorter than asked.
        return _score_math_with(completion, reference, max(1, math.ceil(timeout_s)))
    return _run_bounded(lambda: _score_math_with(completion, reference, None), timeout_s)


def _run_bounded(fn: Callable[[], float], timeout_s: float) -> float:
    """Run ``fn`` in a daemon thread and wait ``timeout_s`` seconds for its result."""
    global _abandoned
    with _abandoned_lock:
        if _abandoned >= MAX_ABANDONED:
            raise RuntimeError(f"{_abandoned} earlier math verifications are still running after "
                               "their time-out; refusing new ones until they finish")
    box: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        global _abandoned
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            box["error"] = exc
        finally:
            with _abandoned_lock:
                if box.get("abandoned"):
                    _abandoned -= 1
                done.set()

    threading.Thread(target=target, name="prioreplay-math-verify", daemon=True).start()
    if not done.wait(timeout_s):
        with _abandoned_lock:
            if not done.is_set():
                box["abandoned"] = True
                _abandoned += 1
                raise TimeoutError(f"timed out after {timeout_s:g}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return float(box["value"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- registry

_SCORERS: dict[str, Callable[..., float]] = {
    "math": _score_math,
    "gsm8k": lambda completion, reference, timeout_s=DEFAULT_TIMEOUT_S: _score_gsm8k(completion, reference),
    "exact": lambda completion, reference, timeout_s=DEFAULT_TIMEOUT_S: _score_exact(completion, reference),
}
assert tuple(sorted(_SCORERS)) == tuple(sorted(KNOWN_VERIFIERS)), "keep in sync with problems.KNOWN_VERIFIERS"


def known_verifiers() -> tuple[str, ...]:
    """The verifier names, as in ``problems.KNOWN_VERIFIERS``."""
    return tuple(KNOWN_VERIFIERS)


def _check_name(name: str) -> None:
    if name not in _SCORERS:
        raise InvalidArgument(f"verifier {name!r} is unknown; use one of {', '.join(KNOWN_VERIFIERS)}")


def verify(name: str, completion: str, reference: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> VerifyResult:
    """Score ``completion`` against ``reference`` with verifier ``name``; never raises for bad input.

    Args:
        name: ``math``, ``gsm8k`` or ``exact``.
        completion: the model's generated text (a marked answer anywhere, else its last
            ``MAX_COMPLETION_CHARS`` characters, is read).
        reference: the problem's reference answer.
        timeout_s: bound on the ``math`` verifier, seconds (> 0); the others are linear-time.

    Returns:
        VerifyResult(1.0 or 0.0, error). error is set (and reward 0.0) when the verifier raised or
        timed out, or when an argument is not a string.

    Raises:
        InvalidArgument: unknown ``name`` (the message lists the known ones), or timeout_s <= 0.
    """
    _check_name(name)
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InvalidArgument(f"timeout_s ({timeout_s}) must be a finite number of seconds > 0")
    if not isinstance(completion, str) or not isinstance(reference, str):
        return VerifyResult(0.0, f"completion and reference must be strings, got "
                                 f"{type(completion).__name__} and {type(reference).__name__}")
    try:
        reward = _SCORERS[name](completion, reference, timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any verifier failure is a 0 reward with an error
        return VerifyResult(0.0, f"{name}: {type(exc).__name__}: {exc}"[:500])
    return VerifyResult(1.0 if reward >= 1.0 else 0.0, None)


def get_verifier(name: str) -> Callable[[str, str], float]:
    """The reward function ``(completion, reference) -> 1.0 | 0.0`` of verifier ``name``.

    The function behaves like :func:`verify` with the default time-out and returns only the
    reward (0.0 on errors); use :func:`verify` to see and count errors.

    Raises:
        InvalidArgument: unknown ``name``, listing the known ones.
    """
    _check_name(name)

    def reward_fn(completion: str, reference: str) -> float:
        return verify(name, completion, reference).reward

    reward_fn.__name__ = f"{name}_reward"
    return reward_fn
