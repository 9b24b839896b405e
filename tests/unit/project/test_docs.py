"""The documentation is an index that stays true: checks of README.md, docs/ and the results page.

* docs/METRICS.md lists exactly the metrics the server, the worker and the learner register
  (collected from their registries, compared both ways);
* benchmarks/RESULTS.md is what ``python -m benchmarks.results_page`` writes from results.json now;
* no tracked file names a path outside the repository (a workplace folder, a sibling checkout, a
  home directory): data outside the repository is named by an environment variable or an argument;
* README.md stays an index (at most 150 lines) and every relative link in README.md and docs/
  points at a file or folder that exists.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
METRICS_DOC = REPO / "docs" / "METRICS.md"
README = REPO / "README.md"

# -- docs/METRICS.md against the registries ---------------------------------------------------------

#: Modules under services/ and prioreplay/ that define Prometheus metrics; each is collected below.
#: A new one must be added here and to :func:`registered_metrics` (the guard test says so).
METRIC_MODULES = {
    "services/priority_server/metrics.py",
    "services/priority_server/client_traffic.py",
    "services/priority_server/multiprocess.py",
    "services/rollout_worker/metrics.py",
    "services/learner/metrics.py",
}
_DEFINES_METRICS = re.compile(r"\b(Counter|Gauge|Histogram|Summary|Info|Enum|\w+MetricFamily)\(")


def registered_metrics() -> dict[str, str]:
    """Every metric the three roles export, as ``/metrics`` names it -> its type.

    Counters get their ``_total`` suffix; histograms and summaries keep their base name. The
    server's store-derived metrics appear once the collector holds statistics, so an empty
    :class:`StoreStats` is given to it; the ``--processes N`` aggregate is collected with no child.
    """
    from prioreplay.learner.metrics import LearnerMetrics
    from prioreplay.priority_server.metrics import ServerMetrics
    from prioreplay.priority_server.multiprocess import AggregateCollector
    from prioreplay.priority_server.store.records import StoreStats
    from prioreplay.rollout_worker.metrics import WorkerMetrics

    server = ServerMetrics()
    server.update(StoreStats(), healthy=True)
    aggregate = AggregateCollector([], timeout_s=0.1)
    try:
        families = [
            *server.registry.collect(),
            *WorkerMetrics().registry.collect(),
            *LearnerMetrics().registry.collect(),
            *aggregate.collect(),
        ]
    finally:
        aggregate.close()
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}


def documented_metrics() -> dict[str, str]:
    """The first column of every table in docs/METRICS.md: metric name (labels dropped) -> kind."""
    rows: dict[str, str] = {}
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and (m := re.fullmatch(r"`(prioreplay_[a-z0-9_]+)(\{[a-z_,]+\})?`", cells[0])):
            assert m.group(1) not in rows, f"docs/METRICS.md lists {m.group(1)} twice"
            rows[m.group(1)] = cells[1]
    return rows


def test_metrics_page_lists_every_registered_metric():
    registered, documented = registered_metrics(), documented_metrics()
    assert len(registered) >= 60, sorted(registered)  # the collection itself works
    missing = sorted(set(registered) - set(documented))
    stale = sorted(set(documented) - set(registered))
    assert not missing, f"registered but not in docs/METRICS.md (add a row): {missing}"
    assert not stale, f"in docs/METRICS.md but not registered (remove the row): {stale}"
    wrong_kind = sorted(n for n, kind in registered.items() if documented[n] != kind)
    assert not wrong_kind, f"docs/METRICS.md gives the wrong kind for: {wrong_kind}"


def test_every_module_that_defines_metrics_is_collected():
    defining = set()
    for path in [*REPO.glob("services/**/*.py"), *REPO.glob("prioreplay/**/*.py")]:
        if "/v1/" in path.as_posix():
            continue
        text = path.read_text(encoding="utf-8")
        if "prometheus_client" in text and _DEFINES_METRICS.search(text):
            defining.add(path.relative_to(REPO).as_posix())
    assert defining == METRIC_MODULES, (
        "modules defining Prometheus metrics changed: collect the new ones in registered_metrics() "
        f"and update METRIC_MODULES (now {sorted(defining)})"
    )


# -- the results page ---------------------------------------------------------------------------------


def test_results_page_is_what_the_script_writes_now():
    import json

    from benchmarks import results_page

    expected = results_page.render(json.loads(results_page.RESULTS.read_text(encoding="utf-8")))
    assert results_page.PAGE.read_text(encoding="utf-8") == expected, (
        "benchmarks/RESULTS.md is out of date: run python -m benchmarks.results_page"
    )


def test_results_page_puts_every_figure_in_a_described_group():
    import json

    from benchmarks import results_page

    entries = json.loads(results_page.RESULTS.read_text(encoding="utf-8"))
    described = {prefix for prefix, _title, _how in results_page.GROUPS}
    orphans = sorted({results_page.group_of(e["name"]) for e in entries} - described)
    assert not orphans, f"results.json groups without a description in benchmarks/results_page.py GROUPS: {orphans}"
    assert results_page.group_of("demo_compare_32.heap.x") == "demo_compare"
    assert results_page.group_of("sim.heap.x") == "sim" and results_page.group_of("samplers.x") == "samplers"


def test_results_page_formats_numbers_and_refuses_an_unknown_headline():
    from benchmarks import results_page

    assert results_page._fmt(3.0) == "3" and results_page._fmt(12345) == "12,345"
    assert results_page._fmt(0.123456) == "0.1235" and results_page._fmt(None) == "—"
    assert results_page._fmt(16044.07) == "16,044" and results_page._fmt(-0.08374) == "-0.08374"
    with pytest.raises(KeyError):
        results_page.render([])


# -- no path outside the repository ------------------------------------------------------------------------

#: Paths that point outside the repository: this workplace's folders, a sibling checkout's shared
#: data, home directories (``/home/prioreplay`` is the images' own user, inside the container).
OUTSIDE = re.compile(
    r"(?<![\w.])/wor[k]/|\.\./shared\b|\.parent\s*/\s*[\"']shared[\"']|/Users/\w|/root/|/home/(?!prioreplay\b)\w|~/shared\b"
)
#: Files that must name the patterns to check for them.
OUTSIDE_EXEMPT = {"tests/unit/project/test_docs.py"}


#: Folders a checkout holds that are not the project's (environments, build outputs, caches, runs, data).
NOT_PROJECT = {".git", ".venv", "build", "runs", "data", ".cache", "__pycache__", ".pytest_cache", ".hypothesis"}
NOT_PROJECT |= {".mypy_cache", ".ruff_cache", ".whl", ".gl"}


def tracked_files() -> list[str]:
    """The project's files, relative to the repository: ``git ls-files`` in a git checkout, else a
    walk of the tree without :data:`NOT_PROJECT` folders (an unpacked source archive)."""
    if (REPO / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p]
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in REPO.rglob("*")
        if p.is_file()
        and not any(
            part in NOT_PROJECT or part.endswith(".egg-info") or part.startswith(".venv") for part in p.relative_to(REPO).parts
        )
    )


def test_no_tracked_file_names_a_path_outside_the_repository():
    hits = []
    for rel in tracked_files():
        path = REPO / rel
        if rel in OUTSIDE_EXEMPT or not path.is_file() or path.suffix in {".png", ".jpg", ".gguf", ".safetensors"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not hits, "paths outside the repository (name data by an environment variable or argument):\n" + "\n".join(hits)


def test_the_outside_path_pattern_catches_what_it_should():
    for bad in (
        "/" + "work/shared/data",  # spelled in two parts: this file names no outside path itself
        "prioreplay load ../shared/data/gsm8k",
        'REPO.parent / "shared"',
        "/" + "home" + "/alice/x",
        "/" + "root" + "/.cache",
    ):
        assert OUTSIDE.search(bad), bad
    # what a repository file may name: the image's own home (read from the Dockerfile, so this file
    # spells no absolute path), a scratch file in the temporary folder, and relative paths
    workdirs = [line for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines() if line.startswith("WORKDIR ")]
    assert workdirs, "deploy/Dockerfile sets no WORKDIR"
    scratch = str(Path(tempfile.gettempdir()) / "x")
    for good in (*workdirs, scratch, "runs/job/x", "docs/METHOD.md", "shared volume"):
        assert not OUTSIDE.search(good), good


# -- README and links --------------------------------------------------------------------------------------


def test_readme_is_an_index():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"
    text = "\n".join(lines)
    for needed in ("make demo", "make test", "PRIOREPLAY_TEST_REDIS_URL"):
        assert needed in text, f"README.md must keep {needed!r}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize(
    "doc",
    ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")), "benchmarks/RESULTS.md"],
)
def test_relative_links_point_at_files_that_exist(doc):
    """Links to pages other engineers write (``docs/SAMPLERS.md``, ``docs/RUNBOOK.md``, ``docs/VLLM.md``)
    are allowed before they land; every other relative link must resolve."""
    pending = {"docs/SAMPLERS.md", "docs/RUNBOOK.md", "docs/VLLM.md"}
    path = REPO / doc
    broken = []
    for target in _LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        rel = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
        if not resolved.exists() and rel not in pending:
            broken.append(target)
    assert not broken, f"{doc}: links to nothing: {broken}"


def test_no_doc_or_comment_cites_the_removed_benchmarks_notebook():
    """docs/BENCHMARKS.md is gone (its history is in git): nothing may cite it or its sections,
    except to say where its history is (a line with ``git log``)."""
    hits = []
    for rel in tracked_files():
        kinds = (".py", ".md", ".yml", ".yaml", ".toml", ".lua", "Makefile")
        if rel == "tests/unit/project/test_docs.py" or not rel.endswith(kinds):
            continue
        if not (REPO / rel).is_file():  # deleted in the work tree, not yet committed
            continue
        text = (REPO / rel).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"BENCHMARKS(\.md)?\b", line) and "git log" not in line:
                hits.append(f"{rel}:{n}")
    assert not hits, "cites docs/BENCHMARKS.md (now benchmarks/RESULTS.md and docs/METHOD.md): " + ", ".join(hits)


#: A cited section: ``docs/NAME.md, "Heading"`` or ``NAME.md`, "Heading"`` (a link's text, within docs/).
_SECTION_CITE = re.compile(r"(?:docs/)?([A-Z][A-Z_]+\.md)`?\]?(?:\([^)]*\))?`?\)?,? \"([^\"\s][^\"]{0,80})\"")


def test_cited_sections_exist():
    """Every ``docs/NAME.md, "Section"`` citation in a tracked doc or code file names a heading of that page."""
    pending = {"SAMPLERS.md", "RUNBOOK.md", "VLLM.md"}
    missing, checked = [], 0
    for rel in tracked_files():
        if not rel.endswith((".py", ".md")) or not (REPO / rel).is_file() or rel == "tests/unit/project/test_docs.py":
            continue
        for page, section in _SECTION_CITE.findall((REPO / rel).read_text(encoding="utf-8")):
            doc = REPO / "docs" / page
            if page in pending or page == "README.md" or not doc.is_file():
                continue
            headings = [h.lstrip("#").strip().lower() for h in doc.read_text(encoding="utf-8").splitlines() if h.startswith("#")]
            checked += 1
            wanted = " ".join(section.split()).lower().rstrip(".")
            if not any(wanted in h for h in headings):
                missing.append(f'{rel}: {page}, "{section}"')
    assert checked >= 20, f"only {checked} citations found: the pattern no longer matches how docs cite sections"
    assert not missing, "cited sections that do not exist:\n" + "\n".join(sorted(set(missing)))
