"""No Python module of the project is longer than 600 lines (generated code aside).

A module past 600 lines holds more than one job; split it by concept (what each part is about),
not in halves. Generated code (the protobuf modules ``prioreplay/v1/*_pb2*.py``) is exempt: it
is rewritten by ``make proto``, never edited.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROOTS = ("prioreplay", "services", "benchmarks", "tests", "examples")
MAX_LINES = 600


def generated(path: Path) -> bool:
    """Whether ``path`` is generated code: ``prioreplay/v1/*_pb2*.py``."""
    rel = path.relative_to(REPO)
    return rel.parts[:2] == ("prioreplay", "v1") and "_pb2" in rel.name


def long_modules() -> dict[str, int]:
    """{path relative to the repo: line count} of every hand-written module over MAX_LINES."""
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" in path.parts or generated(path):
                continue
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                out[path.relative_to(REPO).as_posix()] = lines
    return out


def test_generated_code_is_recognised():
    pb2 = sorted((REPO / "prioreplay" / "v1").glob("*_pb2*.py"))
    assert pb2 and all(generated(p) for p in pb2)
    assert not generated(REPO / "prioreplay" / "client.py")


def test_no_module_exceeds_600_lines():
    found = long_modules()
    assert not found, f"modules over {MAX_LINES} lines (split each by concept):\n" + "\n".join(
        f"{path}: {n}" for path, n in sorted(found.items(), key=lambda kv: -kv[1])
    )
