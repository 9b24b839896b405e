"""Every repository path and project symbol that prose names exists: no text sends a reader to nothing.

**Where.** README.md, docs/*.md and benchmarks/RESULTS.md (text between backticks); the docstrings
of every tracked Python file (module, class and function docstrings, read with :mod:`ast`: text
between backticks, Sphinx roles such as ``:func:`.wire.pull_response``` included); the comments of
the Lua scripts under services/priority_server/store/redis/lua/ (every word after ``--``: Lua
comments use no backticks). This file's own docstrings are left out: they name, as examples, words
that do not resolve.

**A repository path** is one word of letters, digits and ``_ . - /`` (it may end in ``::name`` or
``:line``) that either contains ``/`` and begins with the name of a file or folder that the
repository root, the citing file's folder or a folder above it holds (``tests/unit/...`` anywhere,
``store/base.py`` in a file under services/priority_server/), or has no ``/`` and ends in ``.py``,
``.lua``, ``.md`` or ``.proto`` (a file named in context: ``loss.py``). It resolves when it is a
tracked file or folder relative to one of those folders, or, with no ``/``, when a tracked file
has that name. ``path::name`` must also define ``name`` in that file
(a test; ``Class::method`` both); a bare ``::name`` refers to the path cited last in the same
file. Not paths, by the same rule: absolute paths (``/metrics``, a container's), relative ones
(``./data`` is relative to a compose file, not to the doc), URLs, placeholders (``<name>``, ``*``,
``...``, ``{x}``, ``$X``), run outputs and other projects' paths (``runs/demo/``, ``RUN_DIR/logs/``,
``trl/trainer/``: no folder on the way holds their first name), other kinds of file named bare
(``report.json``, ``alerts.yml``: a run's outputs, another tool's files).

**A project symbol** is a dotted Python name (``a.b.c``, ``a.b()``) whose first name is

1. ``prioreplay``, ``benchmarks`` or ``tests`` (the full form; a proto's package names what the
   .proto defines: ``prioreplay.v1.PriorityService``);
2. in a docstring, empty (``.wire.pull_response``: Sphinx's relative form, read from the
   docstring's package as a relative import reads it), or a name the docstring's module defines or
   imports from the project (``Store.sample`` where ``Store`` is imported). A function's parameter
   is a variable, not a symbol (``params.seed`` in the docstring of ``generate(..., params)``);
3. a class the project defines exactly once (``PriorityClient.report_lease``);
4. the short name of a package under ``prioreplay`` (``samplers``, ``store``), or, where no package
   has the name, of exactly one module there (``rules``); unless an installed library has that
   top-level name (``torch.float32``, ``redis.asyncio``, ``datasets.load_dataset`` are the
   libraries').

Not symbols: names of files (``learner.jsonl``), and runs of the dotted parts of a figure's name in
benchmarks/results.json (``heap.accuracy_after``: tables name figures under their group). A
variable in prose that shares a module's short name (``store.stats()``) reads as that module: name
the class (``Store.stats()``). A symbol resolves by reading the source, not by importing it
(importing every role loads torch, transformers, trl and verl: a minute): each further name must
be a submodule, or a name the module or class defines or imports (functions, classes,
assignments, ``self.x = ...`` in a method, a project base class's members, the stub of a generated
protobuf module). Past a name whose type the source does not give (a variable, a method, a class
with another library's base, a module with ``__getattr__``), the rest is not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LUA = "services/priority_server/store/redis/lua/"
#: This file: its docstrings name, as examples, words that do not resolve.
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()
#: Suffixes that make a word with no ``/`` a repository path: the kinds of file the project writes.
SOURCE_SUFFIXES = (".py", ".lua", ".md", ".proto")
#: Top-level packages whose dotted names are the project's.
PROJECT_ROOTS = ("prioreplay", "benchmarks", "tests")


@functools.cache
def tracked() -> tuple[frozenset[str], frozenset[str]]:
    """(tracked files, tracked folders), relative to the repository, present in the work tree; a
    tracked link to a folder (``prioreplay/<role>`` -> ``services/<role>``) holds its target's files."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [p for p in out.decode().split("\0") if p]
    files = {p for p in paths if (REPO / p).is_file()}
    for link in (p for p in paths if (REPO / p).is_symlink() and (REPO / p).is_dir()):
        target = (REPO / link).resolve().relative_to(REPO).as_posix() + "/"
        files |= {link + f[len(target) - 1 :] for f in list(files) if f.startswith(target)}
    files = frozenset(files)
    folders = frozenset(str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parts) - 1))
    return files, folders


@dataclass(frozen=True)
class Citation:
    """One word a file names: where (``file:line``) and what."""

    file: str
    line: int
    text: str
    in_docstring: bool = False
    #: In a function's docstring: its parameters (variables, not symbols: ``params.seed``).
    params: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"


# -- the words each kind of file names ---------------------------------------------------------------

_TICKED = re.compile(r"``([^`\n]+?)``|(?<![`\w])`([^`\n]+?)`(?!`)")
_ROLE = re.compile(r"^:[a-z]+:~?")


def _ticked(text: str, file: str, first_line: int, in_docstring: bool, params: frozenset[str] = frozenset()) -> list[Citation]:
    out = []
    for m in _TICKED.finditer(text):
        word = _ROLE.sub("", (m.group(1) or m.group(2)).strip())
        out.append(Citation(file, first_line + text.count("\n", 0, m.start()), word, in_docstring, params))
    return out


def markdown_citations(rel: str) -> list[Citation]:
    text = (REPO / rel).read_text(encoding="utf-8")
    return _ticked(text, rel, 1, in_docstring=False)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def statements(body: list[ast.stmt]):
    """Every statement in ``body`` and in the blocks nested in it (no expressions: fast)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            yield from statements(getattr(node, block, []))
        for handler in getattr(node, "handlers", []):
            yield from statements(handler.body)
        for case in getattr(node, "cases", []):
            yield from statements(case.body)


def docstring_citations(rel: str) -> list[Citation]:
    tree = parsed(REPO / rel)
    out = []
    for node in [tree, *statements(tree.body)]:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                params: frozenset[str] = frozenset()
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    a = node.args
                    params = frozenset(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x)
                out += _ticked(first.value.value, rel, first.lineno, True, params)
    return out


def lua_citations(rel: str) -> list[Citation]:
    out = []
    for n, line in enumerate((REPO / rel).read_text(encoding="utf-8").splitlines(), 1):
        if "--" in line:
            for word in line.split("--", 1)[1].split():
                out.append(Citation(rel, n, word.strip("()[],;:'\"").rstrip(".")))
    return out


@functools.cache
def citations() -> list[Citation]:
    files, _ = tracked()
    out: list[Citation] = []
    for rel in sorted(files):
        if rel in ("README.md", "benchmarks/RESULTS.md") or (rel.startswith("docs/") and rel.endswith(".md")):
            out += markdown_citations(rel)
        elif rel.endswith(".py") and not rel.endswith(("_pb2.py", "_pb2_grpc.py")) and rel != SELF:
            out += docstring_citations(rel)
        elif rel.startswith(LUA) and rel.endswith(".lua"):
            out += lua_citations(rel)
    return out


# -- repository paths ----------------------------------------------------------------------------

_PATH_WORD = re.compile(r"(?P<path>[\w.\-/]*)(?:::(?P<name>[\w:]+)(?:\[[^\]]*\])?|:\d+(?:[-–]\d+)?)?")


def _bases(citing: str) -> list[str]:
    """The folders a path in ``citing`` may be relative to: the citing file's, each folder above it,
    the repository root last ('')."""
    folder = Path(citing).parent
    return [p.as_posix().removeprefix(".") for p in (folder, *folder.parents)]


def as_path(word: str, citing: str) -> tuple[str, str] | None:
    """(path, defined name or '') when ``word`` is a repository path by the rule above, else None."""
    m = _PATH_WORD.fullmatch(word)
    if not m or word.startswith(("/", "./", "../")) or "..." in word:
        return None
    path, name = m.group("path"), m.group("name") or ""
    if not path:
        return ("", name) if name else None  # ``::name``: the last path's
    files, folders = tracked()
    if "/" in path:
        first = path.split("/", 1)[0]
        held = any(f"{base}/{first}".lstrip("/") in files | folders for base in _bases(citing))
        return (path, name) if held else None
    return (path, name) if Path(path).suffix in SOURCE_SUFFIXES else None


@functools.cache
def _by_name() -> dict[str, str]:
    """{file name: the first tracked file of that name}."""
    out: dict[str, str] = {}
    for rel in sorted(tracked()[0]):
        out.setdefault(Path(rel).name, rel)
    return out


def resolve_path(path: str, citing: str) -> str | None:
    """The tracked file or folder ``path`` names from ``citing``, or None."""
    files, folders = tracked()
    clean = path.rstrip("/")
    if "/" not in path:
        return _by_name().get(clean)
    for base in _bases(citing):
        rel = f"{base}/{clean}".lstrip("/")
        if rel in files or rel in folders:
            return rel
    return None


def defines(rel: str, name: str) -> bool:
    """Whether Python file ``rel`` defines ``name`` (``Class::method`` as nested names)."""
    if not rel.endswith(".py"):
        return False
    text = (REPO / rel).read_text(encoding="utf-8")
    return all(re.search(rf"^\s*(async\s+def|def|class)\s+{re.escape(part)}\b", text, re.M) for part in name.split("::"))


def broken_paths(cites: list[Citation]) -> list[str]:
    broken, last = [], {}
    for c in cites:
        named = as_path(c.text, c.file)
        if named is None:
            continue
        path, name = named
        target = resolve_path(path, c.file) if path else last.get(c.file)
        if path:
            last[c.file] = target
            if target is None:
                broken.append(str(c))
        if target is not None and name and not defines(target, name):
            broken.append(f"{c} (no {name} in {target})")
    return broken


# -- project symbols: a reading of the source ------------------------------------------------------

#: What a name is bound to. Read from a scope: ``("module", dotted)``, ``("ref", "owner.name")`` (an
#: imported name), ``("class", ClassDef)``, ``("value", None)`` (a type the source does not give).
#: Resolved (a :data:`Target`): ``("module", dotted)``, ``("class", (module, ClassDef))``,
#: ``("value", None)``, ``("missing", dotted)``.
Binding = tuple[str, object]
Target = tuple[str, object]
#: Bases that add no members a docstring would name.
PLAIN_BASES = {"object", "Protocol", "Generic", "ABC", "typing.Protocol", "abc.ABC"}


@dataclass
class Scope:
    """The names a module or class binds, read from its source; ``open_ended``: it may have others (a
    module with ``__getattr__``)."""

    module: str
    names: dict[str, Binding] = field(default_factory=dict)
    bases: list[ast.expr] = field(default_factory=list)
    open_ended: bool = False


@functools.cache
def proto_names() -> dict[str, dict[str, str]]:
    """{proto package: {message, enum or service name: the generated module's name for it}}: a proto's
    full names (``prioreplay.v1.PriorityService``) name what its package defines."""
    out: dict[str, dict[str, str]] = {}
    for rel in sorted(f for f in tracked()[0] if f.endswith(".proto")):
        text = (REPO / rel).read_text(encoding="utf-8")
        package = re.search(r"^package\s+([\w.]+);", text, re.M)
        if package:
            generated = f"{package.group(1)}.{Path(rel).stem}_pb2"
            for name in re.findall(r"^(?:message|enum|service)\s+(\w+)", text, re.M):
                out.setdefault(package.group(1), {})[name] = f"{generated}.{name}"
    return out


def module_files() -> dict[str, Path]:
    """{dotted module name: source} of every tracked project module (a stub over its generated module)."""
    files, _ = tracked()
    out: dict[str, Path] = {}
    for rel in sorted(files):
        if not rel.endswith((".py", ".pyi")) or (REPO / rel).resolve() != REPO / rel:
            continue  # a file seen through a role's link is its services/<role>/ file, read once
        parts = rel.rsplit(".", 1)[0].split("/")
        if parts[0] == "services":  # services/<role>/ imports as prioreplay.<role>
            parts = ["prioreplay", *parts[1:]]
        if parts[0] not in PROJECT_ROOTS:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if rel.endswith(".pyi") or name not in out:
            out[name] = REPO / rel
    return out


class Project:
    """Resolves dotted names against the project's source (rules in the module docstring)."""

    def __init__(self) -> None:
        self.files = module_files()
        self.by_path = {path: name for name, path in self.files.items()}
        self.packages = {m for m, p in self.files.items() if p.name == "__init__.py"}
        self._scopes: dict[object, Scope] = {}
        defined: dict[str, list[str]] = {}
        for module in self.files:
            for name, (kind, _) in self.scope(module).names.items():
                if kind == "class":
                    defined.setdefault(name, []).append(module)
        self.unique_classes = {name: mods[0] for name, mods in defined.items() if len(mods) == 1}
        self.short: dict[str, str] = {}
        mine = [m for m in self.files if m.startswith("prioreplay.")]
        for pool in ([m for m in mine if m in self.packages], mine):
            named: dict[str, list[str]] = {}
            for module in pool:
                named.setdefault(module.rsplit(".", 1)[1], []).append(module)
            for short, modules in named.items():
                if short not in self.short and len(modules) == 1 and importlib.util.find_spec(short) is None:
                    self.short[short] = modules[0]
                self.short.setdefault(short, "")  # the package's, or ambiguous: not a short form
        self.short = {k: v for k, v in self.short.items() if v}

    # -- what a module or class binds
    def scope(self, module: str) -> Scope:
        if module not in self._scopes:
            scope = self._scopes[module] = Scope(module)  # stored first: a cycle of imports ends here
            self._bind(scope, parsed(self.files[module]).body)
            for name, generated in proto_names().get(module, {}).items():
                stub = generated.rsplit(".", 1)[0]
                known = stub in self.files and name in self.scope(stub).names
                scope.names.setdefault(name, ("ref", generated) if known else ("value", None))
        return self._scopes[module]

    def class_scope(self, module: str, node: ast.ClassDef) -> Scope:
        if node not in self._scopes:
            scope = self._scopes[node] = Scope(module, bases=list(node.bases))
            self._bind(scope, node.body)
            for item in statements(node.body):  # self.x = ... in a method
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                        scope.names.setdefault(t.attr, ("value", None))
        return self._scopes[node]

    def _bind(self, scope: Scope, body: list[ast.stmt]) -> None:
        module = scope.module
        package = module if module in self.packages else module.rsplit(".", 1)[0]
        for node in body:
            if isinstance(node, ast.ClassDef):
                scope.names[node.name] = ("class", node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scope.names[node.name] = ("value", None)
                scope.open_ended |= node.name == "__getattr__"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    scope.names[bound] = ("module", alias.name if alias.asname else bound)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    scope.names[alias.asname or alias.name] = ("ref", f"{base}.{alias.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for name in (n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                    scope.names.setdefault(name.id, ("value", None))
            elif isinstance(node, ast.If | ast.Try | ast.With):
                inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
                self._bind(scope, inner + [s for h in getattr(node, "handlers", []) for s in h.body])

    # -- resolution
    def target(self, binding: Binding, module: str) -> Target:
        """What a binding read in ``module`` names, imports followed."""
        for _ in range(20):
            kind, what = binding
            if kind == "class":
                return ("class", (module, what))
            if kind != "ref":
                return binding
            assert isinstance(what, str)
            if what in self.files:
                return ("module", what)
            owner, name = what.rsplit(".", 1)
            if owner not in self.files:
                return ("value", None)  # another library's name
            scope = self.scope(owner)
            if name not in scope.names:
                return ("value", None) if scope.open_ended else ("missing", what)
            binding, module = scope.names[name], owner
        return ("value", None)

    def member(self, target: Target, name: str) -> Target:
        """``target.name``; ``("value", None)`` where the source cannot tell."""
        kind, what = target
        if kind == "module":
            assert isinstance(what, str)
            if f"{what}.{name}" in self.files:
                return ("module", f"{what}.{name}")
            if what not in self.files:
                return ("value", None)  # another library's module
            scope = self.scope(what)
            if name in scope.names:
                return self.target(scope.names[name], what)
            return ("value", None) if scope.open_ended else ("missing", f"{what}.{name}")
        if kind == "class":
            module, node = what  # type: ignore[misc]
            return self.class_member(module, node, name)
        return ("value", None)

    def class_member(self, module: str, node: ast.ClassDef, name: str, depth: int = 0) -> Target:
        scope = self.class_scope(module, node)
        if name in scope.names:
            return self.target(scope.names[name], module)
        for base in scope.bases:
            dotted = ast.unparse(base).split("[", 1)[0]
            if dotted in PLAIN_BASES:
                continue
            first, *rest = dotted.split(".")
            got = self.target(self.scope(module).names.get(first, ("value", None)), module)
            for part in rest:
                got = self.member(got, part)
            if got[0] != "class" or depth > 10:
                return ("value", None)  # another library's base: its members are not read here
            found = self.class_member(*got[1], name, depth + 1)  # type: ignore[misc]
            if found[0] != "missing":
                return found
        return ("missing", f"{module}.{node.name}.{name}")

    def start(self, word: str, cite: Citation) -> tuple[Target, list[str]] | None:
        """Where a dotted name starts (the four rules above) and the names after it; None: not a symbol."""
        first, *rest = word.split(".")
        if first in cite.params:
            return None
        here = self.by_path.get(REPO / cite.file) if cite.in_docstring else None
        if first == "" and here is not None:
            return ("module", here if here in self.packages else here.rsplit(".", 1)[0]), rest
        if first in PROJECT_ROOTS:
            return ("module", first), rest
        if here is not None and first in self.scope(here).names:
            got = self.target(self.scope(here).names[first], here)
            mine = got[0] == "module" and str(got[1]).split(".")[0] in PROJECT_ROOTS
            return (got, rest) if mine or got[0] in ("class", "missing") else None
        if first in self.unique_classes:
            module = self.unique_classes[first]
            return self.target(self.scope(module).names[first], module), rest
        if first in self.short:
            return ("module", self.short[first]), rest
        return None

    def resolves(self, word: str, cite: Citation) -> bool | None:
        """True: it names something; False: it does not; None: not a project symbol."""
        began = self.start(word, cite)
        if began is None:
            return None
        got, rest = began
        for name in rest:
            if got[0] != "module" and got[0] != "class":
                break
            got = self.member(got, name)
        return got[0] != "missing"


@functools.cache
def project_source() -> Project:
    return Project()


_DOTTED = re.compile(r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


#: The last name of a file, not of a symbol (``learner.jsonl``, ``compare.png``, ``tls.crt``).
FILE_KINDS = {"py", "pyi", "lua", "md", "proto", "json", "jsonl", "png", "yaml", "yml", "toml", "txt", "log"}
FILE_KINDS |= {"csv", "out", "safetensors", "gguf", "pt", "crt", "key", "pem", "html", "sh", "cfg", "ini"}


@functools.cache
def figure_parts() -> frozenset[str]:
    """Every run of two or more dotted parts of a figure's name in benchmarks/results.json
    (``failover.all``, ``heap.accuracy_after`` of ``mix.heap.accuracy_after``): tables name a figure
    under its group's heading, so a part of a name is a figure's too."""
    entries = json.loads((REPO / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    out = set()
    for entry in entries:
        parts = entry["name"].split(".")
        out.update(".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 2, len(parts) + 1))
    return frozenset(out)


def as_symbol(word: str) -> str | None:
    """The dotted name ``word`` is (``a.b`` from ``a.b()``), or None."""
    word = word.removesuffix("()")
    if not _DOTTED.fullmatch(word) or word.rsplit(".", 1)[1] in FILE_KINDS or word.lstrip(".") in figure_parts():
        return None
    return word


def broken_symbols(cites: list[Citation], project: Project) -> list[str]:
    broken = []
    for c in cites:
        word = as_symbol(c.text)
        if word is not None and project.resolves(word, c) is False:
            broken.append(str(c))
    return broken


# -- the tests -------------------------------------------------------------------------------------------


def test_the_rules_tell_paths_and_symbols_from_other_words():
    doc, lua = "docs/X.md", LUA + "sample.lua"
    for word in ("tests/unit/learner/test_grpo_loss.py", "loss.py", "prioreplay/", ".ci/Dockerfile", "docs/X.md:12"):
        assert as_path(word, doc) is not None, word
    for word in ("runs/demo/report.json", "RUN_DIR/logs/", "trl/trainer/grpo_trainer.py", "/metrics", "./data", "report.json"):
        assert as_path(word, doc) is None, word
    for word in ("<name>.py", "lua/samplers/<name>.lua", "https://example.org/a.py", "v-N/", "a/b/..."):
        assert as_path(word, doc) is None, word
    assert as_path("store/base.py", lua) == ("store/base.py", "") and as_path("store/base.py", doc) is None
    assert resolve_path("store/base.py", lua) == "services/priority_server/store/base.py"
    assert resolve_path("tests/unit/test_grpo_loss.py", doc) is None  # moved: the kind of break this test finds
    assert broken_paths([Citation(doc, 1, "tests/unit/learner/test_grpo_loss.py::no_such_test")])
    assert not broken_paths([Citation(doc, 1, "tests/unit/project/test_named_paths.py::Citation")])

    project = project_source()
    resolves = {w: project.resolves(w, Citation(doc, 1, w)) for w in (
        "prioreplay.rules.classify", "rules.update_stats", "store.base.Store.sample", "Store.sample",
        "rules.Pool.QUARANTINED", "prioreplay.v1.PriorityService", "samplers.PosteriorRetests",
        "store.base.Store.no_such_method", "prioreplay.no_such_module", "torch.float32", "np.random",
    )}  # fmt: skip
    assert resolves == {
        "prioreplay.rules.classify": True, "rules.update_stats": True, "store.base.Store.sample": True,
        "Store.sample": True, "rules.Pool.QUARANTINED": True, "prioreplay.v1.PriorityService": True,
        "samplers.PosteriorRetests": False, "store.base.Store.no_such_method": False,
        "prioreplay.no_such_module": False, "torch.float32": None, "np.random": None,
    }  # fmt: skip
    server = Citation("services/priority_server/server.py", 1, "", in_docstring=True)
    assert project.resolves(".multiprocess.run_processes", server) and not project.resolves(".processes.run_processes", server)
    assert project.resolves("params.seed", Citation(doc, 1, "", True, frozenset({"params"}))) is None
    assert as_symbol("heap.accuracy_after") is None and as_symbol("learner.jsonl") is None
    assert as_symbol("rules.classify()") == "rules.classify"


def test_every_named_repository_path_exists():
    cites = citations()
    assert sum(as_path(c.text, c.file) is not None for c in cites) > 400  # the rule still finds the paths docs name
    broken = broken_paths(cites)
    assert not broken, "paths that name nothing in the repository (point them at the file, or drop them):\n" + "\n".join(broken)


def test_every_named_project_symbol_exists():
    cites = citations()
    project = project_source()
    assert sum(project.start(w, c) is not None for c in cites if (w := as_symbol(c.text))) > 400
    broken = broken_symbols(cites, project)
    assert not broken, "symbols the project does not define (point them at the right name, or drop them):\n" + "\n".join(broken)
