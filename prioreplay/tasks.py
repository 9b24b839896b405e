"""The ``reasoning-gym:`` dataset source: generated reasoning tasks scored by the library's own scorers.

Grammar (one string, no spaces)::

    reasoning-gym:<task>[,<task>...]:N[:seed][:key=value...]

* ``<task>``: a reasoning-gym dataset name (``basic_arithmetic``, ``leg_counting``, ...).
* ``N``: the number of problems (integer >= 1), spread round-robin over the tasks (problem i is
  task ``i % len(tasks)``).
* ``seed``: integer, default 0; the library's generator seed, the same for every task.
* ``key=value``: a difficulty setting passed to the task's config (``min_terms=2``); it applies
  to every task that names the task first (``leg_counting.max_animals=3``) or, without a prefix,
  to every task. Values are integers, floats, ``true``/``false``, else strings.

Problems: prompt = the library's question plus one line asking for ``<answer>...</answer>`` (the
format the library's own prompt asks for and its ``extract_answer`` reads); answer = JSON
``{"task", "answer", "metadata"}`` for the ``reasoning-gym`` verifier (see
:mod:`prioreplay.verifiers`); metadata = ``source``, ``task`` and ``difficulty`` (the JSON of the
task's settings), so outcomes can be broken down by task. Ids are
``rg-<task>-<seed>[-<settings hash>]-<index>``: the same spec gives the same ids and problems.

Needs the extra ``prioreplay[tasks]`` (reasoning-gym, generates offline).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord

__all__ = ["ANSWER_INSTRUCTION", "PREFIX", "reasoning_gym_problems"]

#: The spec prefix of this source.
PREFIX = "reasoning-gym:"
#: The line appended to every question (the library's own answer format).
ANSWER_INSTRUCTION = "Give only your final answer between <answer> and </answer>."
_USAGE = (
    "expected reasoning-gym:<task>[,<task>...]:N[:seed][:key=value...], e.g. reasoning-gym:basic_arithmetic,leg_counting:200:0"
)


def _value(text: str) -> object:
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse(spec: str) -> tuple[list[str], int, int, dict[str, dict[str, object]]]:
    """(tasks, N, seed, settings per task) of a spec; InvalidArgument naming the bad part."""
    parts = spec.strip()[len(PREFIX) :].split(":")
    if len(parts) < 2 or not parts[0]:
        raise InvalidArgument(f"{spec!r}: {_USAGE}")
    tasks = parts[0].split(",")
    try:
        n = int(parts[1])
    except ValueError:
        raise InvalidArgument(f"{spec!r}: N {parts[1]!r} is not an integer; {_USAGE}") from None
    if n < 1:
        raise InvalidArgument(f"{spec!r}: N is {n}; give at least 1 problem")
    rest = parts[2:]
    seed = 0
    if rest and "=" not in rest[0]:
        try:
            seed = int(rest[0])
        except ValueError:
            raise InvalidArgument(f"{spec!r}: seed {rest[0]!r} is not an integer; {_USAGE}") from None
        rest = rest[1:]
    settings: dict[str, dict[str, object]] = {t: {} for t in tasks}
    for item in rest:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidArgument(f"{spec!r}: setting {item!r} is not key=value; {_USAGE}")
        task, dot, name = key.rpartition(".")
        targets = [task] if dot else tasks
        if dot and task not in settings:
            raise InvalidArgument(f"{spec!r}: setting {item!r} names task {task!r}, which is not in {','.join(tasks)}")
        for t in targets:
            settings[t][name] = _value(value)
    return tasks, n, seed, settings


def reasoning_gym_problems(spec: str) -> Iterator[ProblemRecord]:
    """The problems of a ``reasoning-gym:`` spec (grammar in the module docstring), in order.

    Raises:
        InvalidArgument: a malformed spec, a bad N or seed, an unknown task (the message lists
            the library's tasks), a setting the task does not take, or reasoning-gym not installed.
    """
    tasks, n, seed, settings = _parse(spec)
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise InvalidArgument(f"{spec!r}: reasoning-gym is not installed ({exc}); pip install 'prioreplay[tasks]'") from None
    for t in tasks:
        if t not in DATASETS:
            raise InvalidArgument(f"{spec!r}: unknown reasoning-gym task {t!r}; known tasks: {', '.join(sorted(DATASETS))}")
    datasets = []
    for k, t in enumerate(tasks):
        size = len(range(k, n, len(tasks)))
        try:
            datasets.append(reasoning_gym.create_dataset(t, size=max(size, 1), seed=seed, **settings[t]))
        except (TypeError, ValueError, AssertionError) as exc:
            raise InvalidArgument(f"{spec!r}: task {t!r} refused settings {settings[t]}: {type(exc).__name__}: {exc}") from None
    for i in range(n):
        k, j = i % len(tasks), i // len(tasks)
        t = tasks[k]
        entry = datasets[k][j]
        difficulty = json.dumps(settings[t], sort_keys=True)
        tag = f"-{hashlib.sha256(difficulty.encode()).hexdigest()[:8]}" if settings[t] else ""
        yield ProblemRecord(
            id=f"rg-{t}-{seed}{tag}-{j}",
            prompt=f"{entry['question'].rstrip()}\n\n{ANSWER_INSTRUCTION}",
            answer=json.dumps({"task": t, "answer": entry["answer"], "metadata": entry["metadata"]}, default=str),
            verifier="reasoning-gym",
            metadata={"source": "reasoning-gym", "task": t, "difficulty": difficulty},
        )
