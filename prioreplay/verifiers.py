"""Verifiers: score one completion against a problem's reference answer with a binary reward.

Four verifiers, named as in :data:`prioreplay.problems.KNOWN_VERIFIERS`:

``math``
    math-verify (Hugging Face): the reference and the completion are parsed (LaTeX, ``\\boxed``,
    plain expressions) and compared symbolically, so ``\\boxed{\\frac{1}{2}}`` matches ``0.5``
    and ``1/2``. A reference without ``$`` or ``\\boxed`` is parsed as ``\\boxed{reference}``.
``gsm8k``
    Final-number match. Reference: the number after the last ``####`` (or the whole reference).
    Completion: the number after its last ``####`` if any, else the number in its last
    ``\\boxed{...}``, else the last number in the text. Both sides go through one normaliser
    (:func:`normalize_numbers`): Unicode minus and dashes are signs ("−5" → -5), currency signs
    are dropped ("-$5" → -5), thousands commas and digit-group spaces are removed, trailing units
    and periods are ignored ("The answer is $1,234." → 1234). Numbers compare exactly as
    decimals (1234 == 1234.0).
``exact``
    Normalised string match: strip, casefold, collapse whitespace, strip one trailing period,
    minus/dash characters read as "-".
``reasoning-gym``
    The reasoning-gym library's own scorer for the problem's task (extra ``prioreplay[tasks]``).
    The reference is the JSON ``{"task", "answer", "metadata"}`` the ``reasoning-gym:`` source
    writes (:mod:`prioreplay.tasks`). The completion's answer is what the library's own
    ``reasoning_gym.utils.extract_answer`` reads: the text of the last ``<answer>...</answer>``
    (stripped), as the library's prompt asks; no tags give 0. That text goes to the task's
    ``score_answer(answer, entry)``; its score (0..1, partial credit possible) counts as correct
    only when it is 1.0. Runs in the same killable process pool as ``math``.

Rewards are 1.0 (correct) or 0.0. :func:`verify` never raises for bad completions or references:
an exception or a time-out gives reward 0.0 and an ``error`` string (the worker counts these in
``prioreplay_worker_verifier_errors_total``). Only an unknown verifier name raises
:class:`InvalidArgument`.

Time-outs: ``math`` verification runs in a small pool of processes (``VERIFY_PROCESSES``, 2
unless ``PRIOREPLAY_VERIFY_PROCESSES`` says otherwise, started on first use). A comparison that
overruns ``timeout_s`` has its process killed (SIGKILL) and gives reward 0.0 with the error
"timed out after Xs". Neither ``signal.alarm`` (main thread only) nor a waiting thread can bound
sympy: a big-integer power such as ``\\boxed{2^{2^{40}}}`` holds the GIL, so no other thread
of the interpreter runs until it ends. A process kill bounds it from any thread, event loop or
executor. Calls beyond the pool's size wait for a free process. The first ``math`` call of a
process also waits (not counted in ``timeout_s``) for a pool process to start and import
math-verify, about a second.

A marked answer (``####``, ``\\boxed{...}``) wins wherever it stands in the completion; only
without one is the final answer searched in the last ``MAX_COMPLETION_CHARS`` characters.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from prioreplay.answers import last_boxed
from prioreplay.errors import InvalidArgument
from prioreplay.problems import KNOWN_VERIFIERS

__all__ = [
    "VerifyResult",
    "verify",
    "get_verifier",
    "known_verifiers",
    "final_number",
    "normalize_text",
    "normalize_numbers",
    "math_parses",
    "MAX_COMPLETION_CHARS",
    "DEFAULT_TIMEOUT_S",
    "pool_call",
]

MAX_COMPLETION_CHARS = 4096
DEFAULT_TIMEOUT_S = 5.0
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
    past them. The cases are tabulated in ``tests/unit/worker/test_verifiers.py``.
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
    for last in _NUMBER_RE.finditer(normalize_numbers(text[-MAX_COMPLETION_CHARS:])):  # noqa: B007 -- keeps the last match
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

#: An unescaped ``$`` (a LaTeX math delimiter); ``\$`` is a literal dollar sign (currency).
_MATH_DOLLAR_RE = re.compile(r"(?<!\\)\$")


@lru_cache(maxsize=4096)
def _parse_reference(reference: str, timeout: int | None) -> tuple:
    """math-verify's parse of a reference, read the way a completion's boxed answer is read.

    A reference with a ``\\boxed{...}`` is its last box; one in math delimiters (an unescaped
    ``$``, ``\\(``, ``\\[``) is parsed as written; anything else is a bare answer and is parsed
    as ``\\boxed{answer}``, exactly like a completion's ``\\boxed{answer}``. So ``\\$18.90``
    (an escaped currency sign, as in MATH-style references) parses as 18.90, and so do the
    completions ``\\boxed{\\$18.90}`` and ``\\boxed{18.90}`` (Skywork-OR1 #16). "%" is a LaTeX
    comment unless escaped, so a bare ``50%`` reads as ``50\\%``.

    Raises:
        ValueError: math-verify parses nothing of the reference.
    """
    from math_verify import parse

    boxed = last_boxed(reference) if "box" in reference else None
    if boxed is not None:
        parsed = parse(f"\\boxed{{{boxed}}}", parsing_timeout=timeout)
    elif _MATH_DOLLAR_RE.search(reference) or "\\(" in reference or "\\[" in reference:
        parsed = parse(reference, parsing_timeout=timeout)
    else:
        bare = re.sub(r"(?<!\\)%", r"\\%", reference.strip())
        parsed = parse(f"\\boxed{{{bare}}}", parsing_timeout=timeout)
        if not parsed or all(isinstance(p, str) for p in parsed):
            parsed = parse(f"${bare}$", parsing_timeout=timeout) or parsed
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


def _score_math(completion: str, reference: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """math-verify's symbolic comparison in a pool process, bounded by ``timeout_s`` seconds.

    Raises:
        TimeoutError: the comparison took longer than ``timeout_s`` (its process was killed).
        RuntimeError: a pool process could not be started.
        Exception: whatever math-verify raised, re-created as RuntimeError with its text.
    """
    return float(_pool().call({"op": "score", "completion": completion, "reference": reference}, timeout_s))  # type: ignore[arg-type]  # the value is a number or numeric string


def math_parses(text: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True when math-verify parses ``\\boxed{text}`` or ``$text$`` to a mathematical object (a number,
    fraction, tuple, interval, expression); used to infer the ``math`` verifier for an answer.
    Runs in the verification pool like :func:`verify` (bounded by ``timeout_s``); False on any
    error or time-out of the parse.

    Raises:
        InvalidArgument: math-verify is not installed: the answer would silently get ``exact`` here
            and ``math`` where it is installed, so the same file would be scored differently.
    """
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise InvalidArgument(
            "inferring a verifier needs the math-verify package (pip install math-verify); "
            "install it, or give each row its verifier (a 'verifier' column or --verifier)"
        )
    try:
        return bool(_pool().call({"op": "parses", "text": text}, timeout_s))
    except Exception:  # noqa: BLE001 - an answer math-verify cannot parse in time is not math
        return False


# --------------------------------------------------------------------------- the verification pool

#: Processes in the math verification pool (started on first use, at most this many at once).
VERIFY_PROCESSES = 2


def _pool_size() -> int:
    raw = os.environ.get("PRIOREPLAY_VERIFY_PROCESSES", str(VERIFY_PROCESSES))
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= 64:
        raise InvalidArgument(
            f"PRIOREPLAY_VERIFY_PROCESSES ({raw!r}) must be an integer from 1 to 64 (math verification processes)"
        )
    return size


#: Seconds a new pool process may take to import math-verify before verification fails.
STARTUP_TIMEOUT_S = 120.0


def _child_main() -> None:
    """The pool process: JSON lines in on stdin, JSON lines out on the original stdout.

    Each request is ``{"op": "score", "completion", "reference"}``, ``{"op": "parses", "text"}``,
    ``{"op": "import", "module"}`` or ``{"op": "call", "target": "module:function", "kwargs"}``
    (the function's JSON-ready return value is the answer); each answer ``{"value": ...}`` or
    ``{"error": "Type: text"}``. Anything the libraries print goes to stderr, so it never mixes
    with answers.
    """
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which kills us
    import math_verify  # noqa: F401 - paid once, before "ready"

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req["op"] == "score":
                value: object = _score_math_with(req["completion"], req["reference"], None)
            elif req["op"] == "rg":
                value = _score_rg_with(req["completion"], req["reference"])
            elif req["op"] == "import":  # an optional scorer's library, paid once per process (_Pool.call)
                importlib.import_module(req["module"])
                value = True
            elif req["op"] == "call":  # a function another module runs here (prioreplay.rewards: plugins)
                module, _, name = req["target"].partition(":")
                value = getattr(importlib.import_module(module), name)(**req["kwargs"])
            else:
                value = _parses_with(req["text"])
            answer = {"value": value}
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            answer = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def _score_rg_with(completion: str, reference: str) -> float:
    """reasoning-gym's own score of the ``<answer>`` text of ``completion`` (0..1), in a pool process."""
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    ref = json.loads(reference)
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    score_fn = reasoning_gym.get_score_answer_fn(ref["metadata"]["source_dataset"])
    return float(score_fn(answer, {"answer": ref["answer"], "metadata": ref["metadata"]}))


def _score_rg(completion: str, reference: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """reasoning-gym's scorer in a pool process, bounded by ``timeout_s`` seconds (errors as :func:`_score_math`)."""
    request = {"op": "rg", "completion": completion, "reference": reference}
    return float(_pool().call(request, timeout_s, needs={"op": "import", "module": "reasoning_gym"}))  # type: ignore[arg-type]  # the value is a number


def _parses_with(text: str) -> bool:
    from math_verify import parse

    for form in (f"\\boxed{{{text}}}", f"${text}$"):
        parsed = parse(form, parsing_timeout=None)
        if parsed and not all(isinstance(p, str) for p in parsed):
            return True
    return False


class _PoolProcess:
    """One pool process (``python -c _child_main``) and its line buffer."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from prioreplay.verifiers import _child_main; _child_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPE above
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self._buf = b""
        self.imported: set[str] = set()  # preparing requests this process has run (_Pool.call's needs), as JSON
        ready = self.read(time.monotonic() + STARTUP_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.kill()
            raise RuntimeError(f"a math verification process did not start within {STARTUP_TIMEOUT_S:g}s")

    def read(self, deadline: float) -> dict | None:
        """The next answer line, or None when ``deadline`` (monotonic seconds) passes first."""
        fd = self.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the math verification process exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class _Pool:
    """At most ``size`` pool processes; a call that overruns its time-out kills its process (a
    hard kill works whatever the computation holds, the GIL included) and the next call starts
    a fresh one."""

    def __init__(self, size: int) -> None:
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[_PoolProcess] = []
        self._lock = threading.Lock()

    def call(self, request: dict, timeout_s: float, needs: dict | None = None) -> object:
        """Run ``request`` in an idle process within ``timeout_s`` seconds. ``needs``: a request
        that prepares it (importing reasoning-gym or a reward plugin: seconds), run first in a
        process that has not run it, under :data:`STARTUP_TIMEOUT_S`, so the request's own
        time-out is for the work alone and only pools that score such problems pay the import."""
        with self._slots:
            with self._lock:
                proc = self._idle.pop() if self._idle else None
            if proc is None or proc.proc.poll() is not None:
                proc = _PoolProcess()
            try:
                key = json.dumps(needs, sort_keys=True) if needs else ""
                if key and key not in proc.imported:
                    proc.stdin.write((key + "\n").encode())
                    proc.stdin.flush()
                    loaded = proc.read(time.monotonic() + STARTUP_TIMEOUT_S)
                    if loaded is None or "error" in loaded:  # the except below kills the process
                        raise RuntimeError(f"preparing {key} failed: {(loaded or {}).get('error', 'timed out')}")
                    proc.imported.add(key)
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
                answer = proc.read(time.monotonic() + timeout_s)
            except BaseException:
                proc.kill()
                raise
            if answer is None:
                proc.kill()
                raise TimeoutError(f"timed out after {timeout_s:g}s")
            with self._lock:
                self._idle.append(proc)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["value"]

    def close(self) -> None:
        with self._lock:
            procs, self._idle = self._idle, []
        for proc in procs:
            proc.kill()


_the_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _pool() -> _Pool:
    global _the_pool
    with _pool_lock:
        if _the_pool is None:
            _the_pool = _Pool(_pool_size())
            atexit.register(_the_pool.close)
        return _the_pool


def pool_call(request: dict, timeout_s: float, needs: dict | None = None) -> object:
    """Run ``request`` (an ``{"op": "call", ...}`` of :func:`_child_main`) in the verification pool
    within ``timeout_s`` seconds, after ``needs`` once per process (:meth:`_Pool.call`).

    Raises:
        TimeoutError: the call overran ``timeout_s`` (its process was killed).
        RuntimeError: the call raised in the pool ("Type: text"), or a process could not start.
    """
    return _pool().call(request, timeout_s, needs)


# --------------------------------------------------------------------------- registry

_SCORERS: dict[str, Callable[..., float]] = {
    "math": _score_math,
    "gsm8k": lambda completion, reference, timeout_s=DEFAULT_TIMEOUT_S: _score_gsm8k(completion, reference),
    "exact": lambda completion, reference, timeout_s=DEFAULT_TIMEOUT_S: _score_exact(completion, reference),
    "reasoning-gym": _score_rg,
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
        name: ``math``, ``gsm8k``, ``exact`` or ``reasoning-gym``.
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
        return VerifyResult(
            0.0, f"completion and reference must be strings, got {type(completion).__name__} and {type(reference).__name__}"
        )
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
