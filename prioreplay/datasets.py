"""Dataset loaders: every source of problems becomes a stream of :class:`ProblemRecord`.

One entry point, :func:`iter_problems`, reads

* JSON Lines files (``*.jsonl``, ``*.jsonl.gz``) and ``*.json`` files (JSON Lines, or one JSON
  array of objects),
* Parquet files (``*.parquet``, read in record batches with pyarrow),
* ``arithmetic:N[:seed[:level[:style]]]``: N generated arithmetic problems (no file needed;
  level ``mixed``, ``easy``, ``trivial``, ``hard``, ``tiers`` or ``recall``, prompt style ``plain``, ``line`` or ``short``),
* ``reasoning-gym:<task>[,<task>...]:N[:seed][:key=value...]``: N generated reasoning-gym problems
  scored by the library's own scorer (grammar and answer format in :mod:`prioreplay.tasks`),
* ``mix:<name>`` or ``mix:<file>.toml``: a fixed multi-task mix of the sources above, each
  problem labelled with its component's ``task`` (:mod:`prioreplay.mixes`),
* a local dataset directory (saved with ``Dataset.save_to_disk``, or a folder of data files),
  or a Hugging Face ``datasets`` name ``name`` / ``name:config`` (loaded with
  ``datasets.load_dataset``; names already in the local cache work offline).

Row formats are recognised by their column names (an explicit column mapping wins):

============================  ==========================================  ==========
columns                       reference answer                            verifier
============================  ==========================================  ==========
``prompt`` + ``answer``       ``answer`` as given                         inferred *
``question`` + ``answer``     GSM8K: the number after the last ``####``   ``gsm8k``
                              (commas removed); the whole answer if none
``problem`` + ``solution``    MATH: ``answer`` column if present, else    ``math``
                              the last ``\\boxed{...}`` of the solution
``problem`` + ``answer``      ``answer`` as given                         ``math``
============================  ==========================================  ==========

\\* A row's own ``verifier`` field is used when present; otherwise a plain number (``42``,
``-3.5``, ``1,234``) gets ``gsm8k`` (final-number match, so "The answer is 42." counts),
anything containing LaTeX (``\\``, ``^``, ``{``) or that math-verify parses as mathematics
(``1/2``, ``-3/4``, ``(1, 2)``, ``50%``, ``sqrt(2)``; text with words such as "Room 12B" does not
count) gets ``math``, and other text gets ``exact``.
The ``verifier`` argument overrides all of these for every row.

Ids: a row's ``id`` (any JSON scalar, made a string) or, when absent,
``<folder>-<file stem>-<index:05d>`` with the 0-based line (or row) index (``gsm8k-train-00000``
for ``data/gsm8k/train.jsonl``), so ids are stable across loads and two datasets' ``train.jsonl``
files do not share ids. ``id_prefix`` replaces ``<folder>-<file stem>`` in generated ids and is
prepended (``<prefix>-<id>``) to given ids, to keep several datasets apart on one server.

Malformed input raises :class:`prioreplay.errors.InvalidArgument` naming the file and the 1-based
line (or row): invalid JSON, a line that is not an object, a missing or empty prompt/answer,
bytes that are not UTF-8, a duplicate id (both lines named). Rows are streamed; only the ids
seen so far are kept (to detect duplicates), about 100 bytes per problem.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prioreplay.answers import last_boxed
from prioreplay.arithmetic import ARITH_LEVELS, ARITH_STYLES, arithmetic_problems
from prioreplay.errors import InvalidArgument
from prioreplay.mixes import MIX_PREFIX, mix_evaluation_slice, mix_problems
from prioreplay.problems import KNOWN_VERIFIERS, MAX_ID_BYTES, ProblemRecord
from prioreplay.tasks import PREFIX, reasoning_gym_problems

__all__ = [
    "iter_problems",
    "evaluation_slice",
    "arithmetic_problems",
    "gsm8k_final_answer",
    "last_boxed",
    "ColumnMapping",
]

_NUMBER_RE = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?$")
_UNBRACED_BOX_RE = re.compile(r"\\(?:boxed|fbox)[ \t]+([^\s${}]+)")
_ARITH_RE = re.compile(r"^arithmetic:(\d+)(?::(-?\d+))?(?::([a-z]+))?(?::([a-z]+))?$")
_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".ndjson")


# --------------------------------------------------------------------------- answer extraction


def gsm8k_final_answer(answer: str) -> str:
    """The reference number of a GSM8K answer: the text after the last ``####``, commas removed.

    GSM8K (Cobbe et al. 2021) ends each worked solution with ``#### <number>``. Without ``####``
    the whole answer is returned stripped (commas removed when it is a plain number).

    Example: ``"... so 1,234 - 4 = 1230.\\n#### 1,230"`` → ``"1230"``.
    """
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip().replace(",", "")
    text = answer.strip()
    return text.replace(",", "") if _NUMBER_RE.match(text) else text


_MATH_WORDS_RE = re.compile(r"sqrt|frac|pi|infty|inf|sin|cos|tan|log|ln|exp|cdot|times|le|ge|ne")


def _infer_verifier(answer: str) -> str:
    """``gsm8k`` for a plain number; ``math`` for LaTeX or anything math-verify parses as a
    mathematical object (``1/2``, ``(1, 2)``, ``50%``, ``sqrt(2)``) and that has no word in it
    beyond function names; ``exact`` for other text ("Paris", "Room 12B")."""
    text = answer.strip()
    if _NUMBER_RE.match(text) and any(c.isdigit() for c in text):
        return "gsm8k"
    if any(c in text for c in "\\^{"):
        return "math"
    if re.search(r"[A-Za-z]{2,}", _MATH_WORDS_RE.sub("", text)) or not re.search(r"[\d\u221a\u03c0\u221e]", text):
        return "exact"
    from prioreplay.verifiers import math_parses  # lazy: math-verify is heavy

    return "math" if math_parses(text.replace("%", "\\%")) else "exact"


# --------------------------------------------------------------------------- row → ProblemRecord


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns hold the id, prompt and answer; None means "detect from the column names"."""

    id_column: str | None = None
    prompt_column: str | None = None
    answer_column: str | None = None


class _RowConverter:
    """Turns rows (dicts) into ProblemRecords, remembering ids to report duplicates.

    ``where(index)`` renders a location such as ``data.jsonl:12`` for error messages.
    """

    def __init__(
        self, stem: str, columns: ColumnMapping, verifier: str | None, id_prefix: str | None, location: str, unit: str
    ) -> None:
        self.stem = stem
        self.columns = columns
        self.verifier = verifier
        self.id_prefix = id_prefix
        self.location = location
        self.unit = unit  # "line" / "row"
        self.seen: dict[str, int] = {}

    def where(self, index: int) -> str:
        if self.unit == "line":
            return f"{self.location}:{index + 1}"
        return f"{self.location} {self.unit} {index + 1}"

    def _field(self, row: Mapping[str, Any], name: str, index: int, role: str) -> str:
        if name not in row or row[name] is None:
            keys = ", ".join(sorted(map(str, row))) or "none"
            raise InvalidArgument(
                f"{self.where(index)}: the {role} column {name!r} is missing (columns: {keys}); "
                f"give it or choose another column with --{role}-column"
            )
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InvalidArgument(
                f"{self.where(index)}: {role} {name!r} must be a string or a number, not {type(value).__name__}"
            )
        return str(value)

    def _detect(self, row: Mapping[str, Any], index: int) -> tuple[str, str, str]:
        """(prompt column, answer column, format) for this row."""
        c = self.columns
        if c.prompt_column or c.answer_column:
            prompt_col = c.prompt_column or next((k for k in ("prompt", "question", "problem") if k in row), "prompt")
            answer_col = c.answer_column or next((k for k in ("answer", "solution") if k in row), "answer")
            fmt = "math" if answer_col == "solution" else ("gsm8k" if prompt_col == "question" else "generic")
            return prompt_col, answer_col, fmt
        if "prompt" in row:
            return "prompt", "answer", "generic"
        if "question" in row and "answer" in row:
            return "question", "answer", "gsm8k"
        if "problem" in row and "solution" in row:
            return "problem", "solution", "math"
        if "problem" in row and "answer" in row:
            return "problem", "answer", "math_answer"
        keys = ", ".join(sorted(map(str, row))) or "none"
        raise InvalidArgument(
            f"{self.where(index)}: no prompt column found (columns: {keys}); expected prompt/answer, "
            "question/answer (GSM8K) or problem/solution (MATH), or name them with "
            "--prompt-column and --answer-column"
        )

    def convert(self, row: Any, index: int) -> ProblemRecord:
        """One row → a validated ProblemRecord. Raises InvalidArgument naming the location."""
        if not isinstance(row, Mapping):
            raise InvalidArgument(f"{self.where(index)}: expected a JSON object with prompt and answer, got {type(row).__name__}")
        prompt_col, answer_col, fmt = self._detect(row, index)
        prompt = self._field(row, prompt_col, index, "prompt")
        if not prompt.strip():
            raise InvalidArgument(f"{self.where(index)}: the prompt ({prompt_col!r}) is empty")
        if fmt == "math" and isinstance(row.get("answer"), str) and row["answer"].strip() and not self.columns.answer_column:
            answer_col = "answer"  # MATH-500 style: a clean answer column next to the solution
        raw_answer = self._field(row, answer_col, index, "answer")
        if fmt == "gsm8k":
            answer = gsm8k_final_answer(raw_answer)
        elif fmt == "math" and answer_col != "answer":
            boxed = last_boxed(raw_answer)
            if boxed is None:
                raise InvalidArgument(
                    f"{self.where(index)}: the solution ({answer_col!r}) has no complete "
                    "\\boxed{...} answer; add an 'answer' column or fix the solution"
                )
            answer = boxed
        else:
            answer = raw_answer.strip()
        if not answer:
            raise InvalidArgument(f"{self.where(index)}: the answer ({answer_col!r}) is empty")

        verifier = self.verifier or self._row_verifier(row, index)
        if verifier is None:
            verifier = {"gsm8k": "gsm8k", "math": "math", "math_answer": "math"}.get(fmt) or _infer_verifier(answer)

        problem_id = self._problem_id(row, index)
        metadata = self._metadata(row, index)
        return ProblemRecord(id=problem_id, prompt=prompt, answer=answer, verifier=verifier, metadata=metadata)

    def _row_verifier(self, row: Mapping[str, Any], index: int) -> str | None:
        value = row.get("verifier")
        if value is None or value == "":
            return None
        if value not in KNOWN_VERIFIERS:
            raise InvalidArgument(f"{self.where(index)}: verifier {value!r} is unknown; use one of {', '.join(KNOWN_VERIFIERS)}")
        return str(value)

    def _problem_id(self, row: Mapping[str, Any], index: int) -> str:
        id_col = self.columns.id_column or "id"
        given = row.get(id_col)
        if self.columns.id_column and given is None:
            raise InvalidArgument(f"{self.where(index)}: the id column {id_col!r} is missing or null")
        if given is None or given == "":
            problem_id = f"{self.id_prefix or self.stem}-{index:05d}"
        else:
            if isinstance(given, bool) or not isinstance(given, (str, int)):
                raise InvalidArgument(f"{self.where(index)}: id must be a string or an integer, not {type(given).__name__}")
            problem_id = f"{self.id_prefix}-{given}" if self.id_prefix else str(given)
        if len(problem_id.encode("utf-8")) > MAX_ID_BYTES:
            raise InvalidArgument(f"{self.where(index)}: id {problem_id[:40]!r}... is longer than {MAX_ID_BYTES} bytes")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in problem_id):
            raise InvalidArgument(f"{self.where(index)}: id {problem_id!r} contains control characters")
        first = self.seen.get(problem_id)
        if first is not None:
            raise InvalidArgument(
                f"{self.where(index)}: duplicate id {problem_id!r}, first used at "
                f"{self.where(first)}; ids must be unique within a dataset"
            )
        self.seen[problem_id] = index
        return problem_id

    def _metadata(self, row: Mapping[str, Any], index: int) -> dict[str, str]:
        out: dict[str, str] = {}
        meta = row.get("metadata")
        if meta is not None:
            if not isinstance(meta, Mapping):
                raise InvalidArgument(f"{self.where(index)}: metadata must be an object of strings, not {type(meta).__name__}")
            for k, v in meta.items():
                out[str(k)] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        for key in ("level", "type", "subject"):  # MATH's difficulty and subject labels
            if key in row and row[key] is not None and key not in out:
                out[key] = str(row[key])
        return out


# --------------------------------------------------------------------------- file readers


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _decode(raw: bytes, where: str, first: bool) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "the file must be UTF-8 encoded (convert it, e.g. with iconv -t UTF-8)"
        ) from None
    return text.lstrip("\ufeff") if first else text


def _iter_json_rows(path: Path, conv: _RowConverter) -> Iterator[tuple[int, Any]]:
    """(0-based line index, parsed value) for every non-blank line, or array item of a .json file."""
    with _open_binary(path) as fh:
        head = fh.read(4096)
        start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
        fh.seek(0)
        if start == b"[" and ".json" in path.name and ".jsonl" not in path.name:
            yield from _iter_json_array(fh, conv)
            return
        for index, raw in enumerate(fh):
            where = conv.where(index)
            line = _decode(raw, where, first=index == 0).strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(
                    f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON object"
                ) from None
            yield index, value


def _iter_json_array(fh: io.BufferedIOBase, conv: _RowConverter) -> Iterator[tuple[int, Any]]:
    """Items of a file holding one JSON array (read whole: arrays cannot be streamed by line)."""
    raw = fh.read()
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InvalidArgument(
            f"{conv.location}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); the file must be UTF-8 encoded"
        ) from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{conv.location}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    conv.unit = "item"
    yield from enumerate(items)


def _iter_parquet_rows(path: Path) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise InvalidArgument(f"{path}: not a readable Parquet file ({exc})") from None
    index = 0
    for batch in pf.iter_batches(batch_size=2048):
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _iter_dataset_rows(source: str, split: str | None) -> tuple[str, Iterable[tuple[int, dict]]]:
    """(stem for ids, rows) of a local dataset directory or a ``datasets`` name."""
    import datasets

    path = Path(source)
    if path.is_dir():
        saved = (
            (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
        )
        try:
            ds = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path), split=split or "train")
        except Exception as exc:  # noqa: BLE001 - datasets raises many types
            raise InvalidArgument(f"{source}: could not load the dataset directory ({exc})") from None
        stem = path.name
    else:
        name, _, config = source.partition(":")
        try:
            ds = datasets.load_dataset(name, config or None, split=split or "train")
        except Exception as exc:  # noqa: BLE001
            raise InvalidArgument(
                f"{source!r} is not a .jsonl/.json/.parquet file, an arithmetic:N[:seed[:level[:style]]] spec, a dataset "
                f"directory, or a loadable `datasets` name ({type(exc).__name__}: {exc})"
            ) from None
        stem = name.rsplit("/", 1)[-1]
    if isinstance(ds, datasets.DatasetDict):
        want = split or "train"
        if want not in ds:
            raise InvalidArgument(f"{source}: split {want!r} not found; available: {', '.join(ds)}")
        ds = ds[want]
    return stem, enumerate(ds)


# --------------------------------------------------------------------------- entry points


def _is_json_file(source: str) -> bool:
    return source.lower().endswith(_JSON_SUFFIXES)


def _stem(path: Path) -> str:
    """The id stem of a file: ``<folder>-<name without its suffix>`` (``data/gsm8k/train.jsonl``
    → ``gsm8k-train``), so two datasets' ``train.jsonl`` files get different generated ids
    (croissant-baker #101). The folder is the file's own, wherever the command runs from."""
    name = path.name
    for suffix in sorted(_JSON_SUFFIXES + (".parquet",), key=len, reverse=True):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = path.stem
    folder = path.resolve().parent.name
    return f"{folder}-{name}" if folder else name


def iter_problems(
    source: str,
    *,
    split: str | None = None,
    id_column: str | None = None,
    prompt_column: str | None = None,
    answer_column: str | None = None,
    verifier: str | None = None,
    id_prefix: str | None = None,
    limit: int | None = None,
) -> Iterator[ProblemRecord]:
    """Stream the problems of ``source`` lazily (files are read line by line / batch by batch).

    Args:
        source: a ``.jsonl``/``.json`` (optionally ``.gz``) or ``.parquet`` path, ``arithmetic:N[:seed[:level[:style]]]``,
            a local dataset directory, or a ``datasets`` name ``name[:config]``.
        split: the split of a ``datasets`` name or a saved DatasetDict (default ``train``).
        id_column, prompt_column, answer_column: column names overriding the detection.
        verifier: one of ``problems.KNOWN_VERIFIERS``, used for every problem (overrides rows).
        id_prefix: see the module docstring.
        limit: stop after this many problems (>= 0); None reads everything.

    Yields:
        ProblemRecord, in file / dataset order.

    Raises:
        InvalidArgument: an unknown verifier, a negative limit, a missing file, or malformed
            content (the message names the file and the 1-based line or row). Raised when the
            offending row is reached (the stream is lazy).
    """
    source = str(source)  # a pathlib.Path works too
    if verifier is not None and verifier not in KNOWN_VERIFIERS:
        raise InvalidArgument(f"verifier {verifier!r} is unknown; use one of {', '.join(KNOWN_VERIFIERS)}")
    if limit is not None and limit < 0:
        raise InvalidArgument(f"limit ({limit}) must be >= 0, or None for every problem")
    if id_prefix is not None and (not id_prefix or any(ord(c) < 32 for c in id_prefix)):
        raise InvalidArgument(f"id_prefix ({id_prefix!r}) must be a non-empty string without control characters")
    return _limited(_iter_all(source, split, ColumnMapping(id_column, prompt_column, answer_column), verifier, id_prefix), limit)


def _limited(it: Iterator[ProblemRecord], limit: int | None) -> Iterator[ProblemRecord]:
    if limit is None:
        yield from it
        return
    if limit == 0:
        return
    for count, problem in enumerate(it, start=1):
        yield problem
        if count >= limit:
            return


def _iter_all(
    source: str, split: str | None, columns: ColumnMapping, verifier: str | None, id_prefix: str | None
) -> Iterator[ProblemRecord]:
    m = _ARITH_RE.match(source.strip())
    if m:
        for p in arithmetic_problems(int(m.group(1)), int(m.group(2) or 0), **_arith_kw(m)):
            if verifier or id_prefix:
                p = ProblemRecord(
                    id=f"{id_prefix}-{p.id}" if id_prefix else p.id,
                    prompt=p.prompt,
                    answer=p.answer,
                    verifier=verifier or p.verifier,
                    metadata=p.metadata,
                )
            yield p
        return
    if source.strip().startswith(MIX_PREFIX):
        yield from mix_problems(source, iter_problems)  # the mix reads its components through iter_problems
        return
    if source.strip().startswith(PREFIX):
        for p in reasoning_gym_problems(source):
            if verifier or id_prefix:
                p = ProblemRecord(
                    id=f"{id_prefix}-{p.id}" if id_prefix else p.id,
                    prompt=p.prompt,
                    answer=p.answer,
                    verifier=verifier or p.verifier,
                    metadata=p.metadata,
                )
            yield p
        return
    if source.startswith("arithmetic:"):
        raise InvalidArgument(
            f"{source!r}: expected arithmetic:N[:seed[:level[:style]]] with integers N and "
            f"seed, level one of {', '.join(ARITH_LEVELS)} and style one of "
            f"{', '.join(ARITH_STYLES)}, e.g. arithmetic:1000:0 or arithmetic:256:0:easy:line"
        )

    path = Path(source)
    is_file_source = _is_json_file(source) or source.lower().endswith(".parquet")
    if is_file_source and not path.is_file():
        raise InvalidArgument(f"{source}: file not found; give the path of an existing .jsonl/.json/.parquet file")
    if not is_file_source and path.is_file():  # a local file: never look it up on the Hub
        raise InvalidArgument(
            f"{source}: unsupported file type {path.suffix or '(none)'}; convert it to .jsonl "
            "(one JSON object per line with id/prompt/answer) or .parquet"
        )
    if is_file_source:
        conv = _RowConverter(
            _stem(path), columns, verifier, id_prefix, location=str(path), unit="line" if _is_json_file(source) else "row"
        )
        rows = _iter_json_rows(path, conv) if _is_json_file(source) else _iter_parquet_rows(path)
    else:
        stem, rows = _iter_dataset_rows(source, split)  # type: ignore[assignment]  # both are iterables of (index, row)
        conv = _RowConverter(stem, columns, verifier, id_prefix, location=source, unit="row")
    for index, row in rows:
        yield conv.convert(row, index)


def _arith_kw(m: re.Match) -> dict[str, str]:
    """level / style keyword arguments of a matched ``arithmetic:`` spec."""
    return {"level": m.group(3) or "mixed", "style": m.group(4) or "plain"}


def _held_out_file(path: Path) -> Path:
    """For a training file (name contains "train"), its sibling test file; else the file itself."""
    name = path.name
    if "train" not in name:
        return path
    for repl in ("test", "validation", "val", "eval"):
        sibling = path.with_name(name.replace("train", repl))
        if sibling.is_file():
            return sibling
    raise InvalidArgument(
        f"{path}: this looks like a training file and no sibling test/validation file "
        "exists; pass the held-out file itself to evaluation_slice"
    )


def evaluation_slice(source: str, n: int, seed: int = 0, *, split: str | None = None, **columns: Any) -> list[ProblemRecord]:
    """A fixed held-out slice of ``n`` problems, for accuracy before/after training.

    * ``arithmetic:N[:s]``: n fresh problems with ids ``arith-eval-<seed>-<i>``, skipping any
      whose prompt also occurs among the N training problems, so the slice is disjoint from
      the training set both by id and by text.
    * a file: a training file (name containing ``train``) is replaced by its sibling
      ``test``/``validation`` file (``train.jsonl`` → ``test.jsonl``); from the held-out file a
      seeded sample of n problems (reservoir sampling, returned in file order).
    * a ``datasets`` name or directory: the same sample from ``split`` (default ``test``).
    * ``mix:``: each component's share from its held-out source
      (:func:`prioreplay.mixes.mix_evaluation_slice`).

    The same (source, n, seed) always gives the same slice. ``columns`` are passed to
    :func:`iter_problems` (id_column, prompt_column, answer_column, verifier, id_prefix).

    Raises:
        InvalidArgument: n < 1, or the source's errors (see :func:`iter_problems`).
    """
    source = str(source)
    if n < 1:
        raise InvalidArgument(f"evaluation slice size n ({n}) must be >= 1")
    if source.strip().startswith(MIX_PREFIX):
        return mix_evaluation_slice(source.strip(), n, seed, iter_problems, evaluation_slice)
    m = _ARITH_RE.match(source.strip())
    if m:
        kw = _arith_kw(m)
        train_prompts = {p.prompt for p in arithmetic_problems(int(m.group(1)), int(m.group(2) or 0), **kw)}
        out: list[ProblemRecord] = []
        candidates = arithmetic_problems(10 * n + len(train_prompts) + 1000, seed, namespace="arith-eval", **kw)
        for p in candidates:
            if p.prompt not in train_prompts:
                out.append(p)
                if len(out) == n:
                    return out
        raise InvalidArgument(f"could not find {n} arithmetic problems disjoint from {source}; lower n")
    path = Path(source)
    if (_is_json_file(source) or source.lower().endswith(".parquet")) and path.is_file():
        source = str(_held_out_file(path))
    elif split is None and not (_is_json_file(source) or source.lower().endswith(".parquet")):
        split = "test"
    rng = random.Random(f"evaluation/{seed}")
    reservoir: list[tuple[float, int, ProblemRecord]] = []  # (key, index, problem): keep n largest keys
    for index, problem in enumerate(iter_problems(source, split=split, **columns)):
        key = rng.random()
        if len(reservoir) < n:
            heapq.heappush(reservoir, (key, index, problem))
        elif key > reservoir[0][0]:
            heapq.heapreplace(reservoir, (key, index, problem))
    return [p for _, _, p in sorted(reservoir, key=lambda t: t[1])]
