"""The ``mix:`` dataset source: a fixed multi-task mix of other sources, each labelled with a task.

Grammar: ``mix:<name>`` for a mix shipped with prioreplay (:data:`MIXES`), or ``mix:<file>.toml``
for a mix of your own::

    # my-mix.toml: one [[component]] per task; problems interleave in proportion to their counts
    [[component]]
    task = "arith-trivial"                    # the task label (metadata "task"); at most 64 characters
    source = "arithmetic:24:0:trivial"        # any `prioreplay load` source except another mix
    held_out = "arithmetic:24:0:trivial"      # optional: what the held-out slice draws from

A mix's problems are its components' problems, in a fixed interleaving: component k's j-th problem
sits at (j + 1/2) / n_k of the way through the mix (ties in component order), so every prefix holds
each task in about its share. Ids are the components' own ids (stable for the same spec: the
components' sources are fixed strings with their seeds); two components that give the same id are
refused. Each problem's metadata gains ``task`` (the component's label, replacing the source's
own ``task``, kept as ``source_task``) and ``mix`` (the mix's name), so outcomes can be broken
down by component (:func:`prioreplay.problems.problem_task`).

Held-out slice (:func:`mix_evaluation_slice`): each component contributes its share of the n
held-out problems from ``held_out`` (default: the component's ``source``, through
:func:`prioreplay.datasets.evaluation_slice`, which keeps generated arithmetic disjoint from the
training problems). A generated source with its own seed (``reasoning-gym:...:N:<other seed>``)
is the way to a held-out set of such a task.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prioreplay.errors import InvalidArgument
from prioreplay.problems import MAX_TASK_CHARS, ProblemRecord

#: The spec prefix of this source.
MIX_PREFIX = "mix:"

__all__ = ["MIXES", "MIX_PREFIX", "MixComponent", "mix_components", "mix_evaluation_slice", "mix_problems"]

_MAX_LABEL = MAX_TASK_CHARS


@dataclass(frozen=True)
class MixComponent:
    """One task of a mix: its label, the source its problems come from, and its held-out source.

    Raises:
        InvalidArgument: an empty or over-long label, an empty source, or a source that is a mix.
    """

    task: str
    source: str
    held_out: str | None = None

    def __post_init__(self) -> None:
        if not self.task or len(self.task) > _MAX_LABEL or not self.task.isprintable():
            raise InvalidArgument(f"mix component task {self.task!r} must be 1-{_MAX_LABEL} printable characters")
        for what, src in (("source", self.source), ("held_out", self.held_out)):
            if src is not None and (not src.strip() or src.startswith(MIX_PREFIX)):
                raise InvalidArgument(f"mix component {self.task!r}: {what} {src!r} must be a non-empty source, not a mix")


#: The mixes shipped with prioreplay, by name (``mix:<name>``).
#:
#: ``smollm2-tails``: 96 problems of six tasks for SmolLM2-135M-Instruct at the demo's settings
#: (G = 4, T = 0.7, newline stop, 24 tokens): a count asked back (``recall``, for the all-right
#: tail), 1-digit sums, easy arithmetic, 3-digit by 2-digit products, and two reasoning-gym tasks at
#: their easiest (leg counting, 1-digit arithmetic in the library's ``<answer>`` format) for the
#: all-wrong tail. Measured before any sampler ran (``mix.*`` in benchmarks/RESULTS.md): first-visit
#: groups 30% all-wrong, 53% mixed, 17% all-right. The all-right tail is thin because the model's
#: easiest task, recall, passes only 63% (27% of its groups all right); docs/USAGE.md has the table.
MIXES: dict[str, tuple[MixComponent, ...]] = {
    "smollm2-tails": (
        MixComponent("arith-recall", "arithmetic:60:0:recall"),
        MixComponent("arith-trivial", "arithmetic:8:0:trivial"),
        MixComponent("arith-easy", "arithmetic:8:0:easy"),
        MixComponent("arith-hard", "arithmetic:8:0:hard"),
        MixComponent(
            "rg-leg_counting",
            "reasoning-gym:leg_counting:6:0:min_animals=1:max_animals=2",
            "reasoning-gym:leg_counting:12:1000:min_animals=1:max_animals=2",
        ),
        MixComponent(
            "rg-basic_arithmetic",
            "reasoning-gym:basic_arithmetic:6:0:min_terms=2:max_terms=2:min_digits=1:max_digits=1",
            "reasoning-gym:basic_arithmetic:12:1000:min_terms=2:max_terms=2:min_digits=1:max_digits=1",
        ),
    ),
}


def _name(spec: str) -> str:
    name = spec.strip()[len(MIX_PREFIX) :]
    if not name:
        raise InvalidArgument(f"{spec!r}: expected mix:<name> (one of {', '.join(MIXES)}) or mix:<file>.toml")
    return name


def _load_file(path: Path, spec: str) -> tuple[MixComponent, ...]:
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"{spec!r}: cannot read the mix file ({exc})") from None
    rows = doc.get("component")
    if not isinstance(rows, list) or not rows:
        raise InvalidArgument(f"{spec!r}: the mix file has no [[component]] tables; give each task one")
    out = []
    for i, row in enumerate(rows):
        unknown = set(row) - {"task", "source", "held_out"}
        if unknown or not isinstance(row.get("task"), str) or not isinstance(row.get("source"), str):
            raise InvalidArgument(
                f"{spec!r}: component #{i + 1} needs string keys task and source (optional held_out)"
                + (f"; unknown keys {sorted(unknown)}" if unknown else "")
            )
        out.append(MixComponent(row["task"], row["source"], row.get("held_out")))
    return tuple(out)


def mix_components(spec: str) -> tuple[str, tuple[MixComponent, ...]]:
    """(name, components) of a ``mix:`` spec: a shipped mix or a ``.toml`` file (module docstring).

    Raises:
        InvalidArgument: an unknown name (the message lists the shipped mixes), an unreadable or
            malformed file, two components with the same task label.
    """
    name = _name(spec)
    if name.lower().endswith(".toml"):
        components = _load_file(Path(name), spec)
        name = Path(name).stem
    elif name in MIXES:
        components = MIXES[name]
    else:
        raise InvalidArgument(f"{spec!r}: unknown mix {name!r}; shipped mixes: {', '.join(MIXES)}; or give a .toml file")
    labels = [c.task for c in components]
    if len(set(labels)) != len(labels):
        raise InvalidArgument(f"{spec!r}: task labels repeat ({labels}); give each component its own task")
    return name, components


def _interleave(parts: list[list[ProblemRecord]]) -> list[ProblemRecord]:
    """Component k's j-th problem at key (j + 1/2) / n_k, ties in component order."""
    keyed = [((j + 0.5) / len(ps), k, j) for k, ps in enumerate(parts) for j in range(len(ps))]
    return [parts[k][j] for _, k, j in sorted(keyed)]


def _labelled(p: ProblemRecord, task: str, mix: str) -> ProblemRecord:
    meta = dict(p.metadata)
    if "task" in meta and meta["task"] != task:
        meta["source_task"] = meta["task"]
    meta.update(task=task, mix=mix)
    return ProblemRecord(id=p.id, prompt=p.prompt, answer=p.answer, verifier=p.verifier, metadata=meta)


def _combine(spec: str, name: str, parts: list[tuple[MixComponent, list[ProblemRecord]]]) -> list[ProblemRecord]:
    seen: dict[str, str] = {}
    for comp, problems in parts:
        for p in problems:
            if p.id in seen:
                raise InvalidArgument(
                    f"{spec!r}: components {seen[p.id]!r} and {comp.task!r} both give problem id {p.id!r}; "
                    "give one of them another seed or id_prefix"
                )
            seen[p.id] = comp.task
    return _interleave([[_labelled(p, comp.task, name) for p in problems] for comp, problems in parts])


def mix_problems(spec: str, load: Callable[[str], Iterable[ProblemRecord]]) -> Iterator[ProblemRecord]:
    """The problems of a ``mix:`` spec, interleaved (module docstring); the same spec, the same list.

    Args:
        load: reads one component's source (:func:`prioreplay.datasets.iter_problems`, which
            passes itself: this module never imports the loaders that dispatch to it).

    Raises:
        InvalidArgument: :func:`mix_components`' errors, a component source's own errors, or
            two components giving the same problem id.
    """
    name, components = mix_components(spec)
    yield from _combine(spec, name, [(c, list(load(c.source))) for c in components])


def mix_evaluation_slice(
    spec: str,
    n: int,
    seed: int,
    load: Callable[[str], Iterable[ProblemRecord]],
    held_out: Callable[[str, int, int], list[ProblemRecord]],
) -> list[ProblemRecord]:
    """A held-out slice of ``n`` problems of a mix: component k gives its share of n (in proportion
    to its training count, largest remainders first) from ``held_out(source, share, seed)``
    (:func:`prioreplay.datasets.evaluation_slice`) of its ``held_out`` source or its own,
    interleaved as the mix is; ``load`` reads a source (:func:`prioreplay.datasets.iter_problems`).

    Raises:
        InvalidArgument: n < 1, :func:`mix_problems`' errors.
    """
    if n < 1:
        raise InvalidArgument(f"evaluation slice size n ({n}) must be >= 1")
    name, components = mix_components(spec)
    sizes = [sum(1 for _ in load(c.source)) for c in components]
    exact = [n * s / sum(sizes) for s in sizes]
    shares = [int(x) for x in exact]
    for k in sorted(range(len(exact)), key=lambda k: shares[k] - exact[k])[: n - sum(shares)]:
        shares[k] += 1
    parts = []
    for comp, share in zip(components, shares, strict=True):
        if share:
            parts.append((comp, held_out(comp.held_out or comp.source, share, seed)))
    return _combine(spec, name, parts)
