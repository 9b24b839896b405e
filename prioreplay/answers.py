"""Answer extraction shared by the dataset loaders and the verifiers: the last ``\\boxed``."""

from __future__ import annotations

import re

__all__ = ["last_boxed"]

_UNBRACED_BOX_RE = re.compile(r"\\(?:boxed|fbox)[ \t]+([^\s${}]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, nested braces handled.

    The unbraced LaTeX form ``\\boxed 5`` (one token after a space, as some MATH solutions write
    it) counts too: its content runs to the next space, ``$``, or brace, without a trailing
    ``.``/``,``/``;``. Returns None when there is no complete boxed expression. Examples:
    ``r"so \\boxed{\\frac{1}{2}}."`` → ``r"\\frac{1}{2}"``; ``r"$2+3=\\boxed 5$."`` → ``"5"``.
    One pass over the braces (linear in ``len(text)``, however many boxes are left unclosed).
    """
    best: tuple[int, int] | None = None
    for m in _UNBRACED_BOX_RE.finditer(text):
        content = m.group(1).rstrip(".,;:")
        if content:
            best = (m.start(1) - 1, m.start(1) + len(content))
    starts = {m.end() - 1 for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)}  # index of each box's "{"
    if not starts:
        return text[best[0] + 1 : best[1]].strip() if best else None
    stack: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            open_at = stack.pop()
            if open_at in starts and (best is None or open_at > best[0]):
                best = (open_at, m.start())
    return text[best[0] + 1 : best[1]].strip() if best else None
