"""The problem record every role shares: its fields, the verifier names, and the limits on ids and names.

A dataset loader makes :class:`ProblemRecord` values, the priority server stores and leases them,
the rollout worker scores completions with the verifier the record names. The checks here are
the ones the server applies to every registered problem, so a loader can refuse the same input
early, with the file and line.

This module imports only the standard library and :mod:`prioreplay.errors`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from prioreplay.errors import InvalidArgument

#: The verifier names a problem may carry (scorers in :mod:`prioreplay.verifiers`).
KNOWN_VERIFIERS = ("math", "gsm8k", "exact", "reasoning-gym")
#: The same names as a type, for typed settings (``--verifier``).
VerifierName = Literal[KNOWN_VERIFIERS]  # type: ignore[valid-type]

#: Longest problem id, bytes of UTF-8.
MAX_ID_BYTES = 256
#: Longest worker id, consumer name or run namespace, bytes of UTF-8.
MAX_NAME_BYTES = 128

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ProblemRecord:
    """A registered problem (the proto's ``Problem``).

    Attributes:
        id: stable, unique within a run; at most :data:`MAX_ID_BYTES` bytes, no control characters.
        prompt: the user turn the model answers (non-empty).
        answer: the reference answer the verifier compares against (non-empty).
        verifier: one of :data:`KNOWN_VERIFIERS`.
        metadata: free-form string labels (source, difficulty); never used for sampling.
    """

    id: str
    prompt: str
    answer: str
    verifier: str = "exact"
    metadata: dict[str, str] = field(default_factory=dict)


def validate_problem(p: ProblemRecord, index: int, known_verifiers: Sequence[str] = KNOWN_VERIFIERS) -> None:
    """Raises InvalidArgument naming the problem's index and field when it is unusable.

    Unusable: an empty id, an id over :data:`MAX_ID_BYTES` bytes or with control characters, an
    empty (whitespace-only) prompt or answer, a verifier not in ``known_verifiers``.
    """
    where = f"problem #{index} (id {p.id!r})"
    if not p.id:
        raise InvalidArgument(f"problem #{index}: id is empty; give every problem a stable, non-empty id")
    if len(p.id.encode("utf-8")) > MAX_ID_BYTES:
        raise InvalidArgument(f"{where}: id is {len(p.id.encode())} bytes; the limit is {MAX_ID_BYTES}")
    if _CONTROL_CHARS.search(p.id):
        raise InvalidArgument(f"{where}: id contains control characters")
    if not p.prompt.strip():
        raise InvalidArgument(f"{where}: prompt is empty")
    if not p.answer.strip():
        raise InvalidArgument(f"{where}: answer is empty; every problem needs a reference answer")
    if p.verifier not in known_verifiers:
        raise InvalidArgument(f"{where}: verifier {p.verifier!r} is unknown; use one of {', '.join(known_verifiers)}")


def check_name(value: str, what: str) -> None:
    """Raises InvalidArgument when ``value`` (a worker id, consumer name...) is over :data:`MAX_NAME_BYTES`."""
    n = len(value.encode("utf-8"))
    if n > MAX_NAME_BYTES:
        raise InvalidArgument(f"{what} is {n} bytes; the limit is {MAX_NAME_BYTES}; use a shorter name")


#: The label of a problem with no ``task``, ``source`` or verifier (:func:`problem_task`).
DEFAULT_TASK = "default"
#: The label that stands for every task past a :class:`TaskLabels` cap.
OTHER_TASK = "other"
#: Distinct task labels a metric or report keeps by default (:class:`TaskLabels`).
MAX_TASK_LABELS = 16
#: Longest task label kept, characters (a longer one is folded into :data:`OTHER_TASK`).
MAX_TASK_CHARS = 64


def problem_task(p: ProblemRecord) -> str:
    """The task a problem's outcomes are broken down by: its ``task`` metadata (the
    ``reasoning-gym:`` source and ``mix:`` components set it), else its ``source`` metadata
    (``arithmetic``), else its verifier name, else :data:`DEFAULT_TASK`."""
    return p.metadata.get("task") or p.metadata.get("source") or p.verifier or DEFAULT_TASK


class TaskLabels:
    """A bounded set of task labels, for a metric label or a report key.

    The first ``limit`` distinct tasks seen keep their own name; every later one, and any name
    over :data:`MAX_TASK_CHARS` characters or with non-printable characters, is folded into
    :data:`OTHER_TASK`, so a dataset of thousands of tasks (or ids mistaken for tasks) adds at
    most ``limit + 1`` label values to a metric. Deterministic for the same order of calls.

    Raises:
        InvalidArgument: ``limit`` < 1.
    """

    def __init__(self, limit: int = MAX_TASK_LABELS) -> None:
        if limit < 1:
            raise InvalidArgument(f"task label limit ({limit}) must be >= 1; the rest fold into {OTHER_TASK!r}")
        self.limit = limit
        self._kept: set[str] = set()

    def label(self, task: str) -> str:
        """``task`` itself while fewer than ``limit`` tasks are kept (or it is one of them), else ``"other"``."""
        if task in self._kept:
            return task
        if len(self._kept) < self.limit and task != OTHER_TASK and len(task) <= MAX_TASK_CHARS and task.isprintable():
            self._kept.add(task)
            return task
        return OTHER_TASK
