"""A dataset's rows as priority-server problems: stable ids, prompt and answer texts, a fingerprint.

:class:`ProblemTable` is what a :class:`~prioreplay.integrations.torch.PrioritySampler` registers
with the server; the sampler maps leased problem ids back to dataset indices through it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prioreplay.convert import problem_to_proto
from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb

#: Columns tried, in order, for a problem's reference answer when ``answer_column`` is not given.
ANSWER_COLUMNS = ("answer", "solution", "ground_truth")
#: The answer registered for rows without one (the server requires one; the trainer scores itself).
NO_ANSWER = "(scored by the trainer)"
#: Longest problem id the server accepts, bytes.
MAX_ID_BYTES = 256

Column = str | Callable[[Mapping], Any] | None


def prompt_text(value: Any) -> str:
    """A prompt as text: a string as is, chat messages as ``role: content`` lines, else ``str()``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    return str(value)


def _column(row: Mapping, col: Column) -> Any:
    return col(row) if callable(col) else row[col]


def _rows(dataset) -> list[Mapping] | None:
    """The rows of a map-style dataset as mappings, or None when they are not mappings."""
    n = len(dataset)
    if hasattr(dataset, "column_names") and hasattr(dataset, "to_list"):  # a datasets.Dataset: one columnar read
        return dataset.to_list()
    rows = [dataset[i] for i in range(n)]
    return rows if all(isinstance(r, Mapping) for r in rows) else None


@dataclass(frozen=True)
class ProblemTable:
    """The problems of a dataset: ``ids[i]`` is the problem id of dataset index ``i``.

    Attributes:
        ids: one stable, unique id per row (≤ 256 bytes of UTF-8).
        prompts, answers: the text registered with the server (informational: the trainer keeps
            its own prompts and scores its own completions).
        fingerprint: 16 hex chars of SHA-256 over every row's id, prompt and answer; a saved
            sampler state is accepted only by a sampler over the same table.
    """

    ids: list[str]
    prompts: list[str]
    answers: list[str]
    fingerprint: str

    @classmethod
    def from_dataset(
        cls, dataset, ids: str | Sequence[str] | None = None, prompt_column: Column = "prompt", answer_column: Column = None
    ) -> ProblemTable:
        """Read a map-style dataset's problems.

        Args:
            dataset: ``len()`` and ``dataset[i]``; rows are mappings (a ``datasets.Dataset``, a
                list of dicts) unless ``ids`` is a list.
            ids: None: ``<fingerprint of the rows' text>:<row index>`` (stable while the data is
                unchanged; any edit makes new problems); a column name: that column, as text; a
                list: one id per row.
            prompt_column, answer_column: a column name or ``row -> value``; the answer defaults to
                the first of ``answer``, ``solution``, ``ground_truth`` present, else
                :data:`NO_ANSWER`. Rows that are not mappings register ``row <i>`` as prompt.

        Raises:
            InvalidArgument: an empty dataset, rows that are not mappings without an id list, a
                missing column, an id list of the wrong length, or ids that repeat, are empty or
                longer than 256 bytes (the message names the row).
        """
        n = len(dataset)
        if n == 0:
            raise InvalidArgument("the dataset is empty; a PrioritySampler needs at least one row")
        if not isinstance(ids, (str, type(None))) and len(ids) != n:
            raise InvalidArgument(f"ids has {len(ids)} entries for {n} rows; give exactly one id per row")
        rows = _rows(dataset) if isinstance(ids, (str, type(None))) or prompt_column is not None else None
        if rows is None and isinstance(ids, (str, type(None))):
            raise InvalidArgument(
                f"the dataset's rows are {type(dataset[0]).__name__}, not mappings: pass "
                "ids=[...] (one stable id per row) so problems can be named"
            )
        if rows is None:
            prompts, answers = [f"row {i}" for i in range(n)], [NO_ANSWER] * n
        else:
            prompts, answers = cls._texts(rows, prompt_column, answer_column)
        h = hashlib.sha256()
        for i in range(n):
            given = "" if ids is None else str(_column(rows[i], ids) if isinstance(ids, str) else ids[i])  # type: ignore[index]  # loaded in __init__ before any use
            for part in (given, prompts[i], answers[i]):
                h.update(part.encode("utf-8", "surrogatepass") + b"\x00")
        fp = h.hexdigest()[:16]
        if ids is None:
            out = [f"{fp}:{i}" for i in range(n)]
        elif isinstance(ids, str):
            out = [str(_column(r, ids)) for r in rows]  # type: ignore[union-attr]  # loaded in __init__ before any use
        else:
            out = [str(x) for x in ids]
        cls._check_ids(out)
        return cls(ids=out, prompts=prompts, answers=answers, fingerprint=fp)

    @staticmethod
    def _texts(rows: list[Mapping], prompt_column: Column, answer_column: Column) -> tuple[list[str], list[str]]:
        if answer_column is None:
            answer_column = next((c for c in ANSWER_COLUMNS if c in rows[0]), None)
        try:
            prompts = [
                prompt_text(_column(r, prompt_column)) if prompt_column is not None else f"row {i}" for i, r in enumerate(rows)
            ]
            answers = [str(_column(r, answer_column)) if answer_column is not None else NO_ANSWER for r in rows]
        except KeyError as e:
            raise InvalidArgument(
                f"column {e} is missing from the dataset's rows (columns: {sorted(rows[0])}); "
                "pass prompt_column= / answer_column= naming existing columns"
            ) from None
        return ([p if p.strip() else f"row {i}" for i, p in enumerate(prompts)], [a if a.strip() else NO_ANSWER for a in answers])

    @staticmethod
    def _check_ids(ids: list[str]) -> None:
        seen: dict[str, int] = {}
        for i, pid in enumerate(ids):
            if not pid or len(pid.encode("utf-8")) > MAX_ID_BYTES:
                raise InvalidArgument(f"row {i}: problem id {pid[:40]!r} must be 1..{MAX_ID_BYTES} bytes of UTF-8")
            if pid in seen:
                raise InvalidArgument(f"rows {seen[pid]} and {i} share the problem id {pid!r}; ids must be unique")
            seen[pid] = i

    def records(self, source: str) -> Iterator[pb.Problem]:
        """The rows as ``pb.Problem`` messages (metadata: client kind, dataset fingerprint, row index)."""
        for i, pid in enumerate(self.ids):
            meta = {"client": source, "dataset": self.fingerprint, "row": str(i)}
            yield problem_to_proto(ProblemRecord(id=pid, prompt=self.prompts[i], answer=self.answers[i], metadata=meta))
