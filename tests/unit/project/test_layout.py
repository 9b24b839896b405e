"""The layout the code is built on: the folder-to-import mapping, the three layers, the base install.

Layers (docs/INTERFACES.md, "Layers") are folders: the **entry points** are ``prioreplay/apps/``
(``prioreplay.apps``), a **role** is ``services/<role>/`` (``prioreplay.<role>``), the **core** is
the rest of ``prioreplay/``. The core imports no role and no entry point; a role imports only the
core; an entry point may import roles, inside functions, except a role's settings modules
(``config``, ``samplers``: pydantic and the standard library) which a command's settings need at
class definition. No import cycle anywhere. Imports under ``if TYPE_CHECKING:`` are annotations
only and are not counted.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVICES = REPO / "services"
#: The folder of the entry-point layer; its modules are read from it, not listed here.
APPS = REPO / "prioreplay" / "apps"
ENTRY_PACKAGE = "prioreplay.apps"
#: Role modules an entry point may import at module level: settings and the sampler names only.
LIGHT_ROLE_MODULES = {"config", "samplers"}
ROLES = sorted(p.name for p in SERVICES.iterdir() if (p / "__init__.py").is_file())


# -- the folder-to-import mapping ------------------------------------------------------------------
def _service_packages() -> dict[str, Path]:
    """{import name: folder} for every folder under services/ that holds Python files."""
    out = {}
    for folder in sorted({p.parent for p in SERVICES.rglob("*.py")}):
        if "__pycache__" not in folder.parts:
            out[".".join(("prioreplay", *folder.relative_to(SERVICES).parts))] = folder
    return out


def test_every_role_folder_is_linked_into_the_import_package():
    """``prioreplay/<role>`` is a relative link to ``../services/<role>`` for every role, and nothing
    else under ``prioreplay/`` links out (docs/DEVELOPMENT.md, "Layout")."""
    for role in ROLES:
        link = REPO / "prioreplay" / role
        assert link.is_symlink(), f"prioreplay/{role} must be a link: ln -s ../services/{role} prioreplay/{role}"
        assert os.readlink(link) == f"../services/{role}", f"prioreplay/{role} -> {os.readlink(link)}, not ../services/{role}"
    links = sorted(p.name for p in (REPO / "prioreplay").iterdir() if p.is_symlink())
    assert links == ROLES, f"links under prioreplay/: {links}; roles under services/: {ROLES}"


@pytest.mark.parametrize("name", list(_service_packages()))
def test_every_services_folder_imports_under_its_mapped_name(name):
    folder = _service_packages()[name]
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder} has Python files but no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert doc.startswith(f"Imports as {name}"), f"{init}: the docstring must begin 'Imports as {name}'"
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not importable: run `make install` again"
    assert Path(spec.origin).resolve() == init.resolve(), f"{name} imports from {spec.origin}, not {folder}"


def test_no_core_module_shadows_a_role():
    for role in ROLES:
        assert not (REPO / "prioreplay" / f"{role}.py").exists(), f"prioreplay/{role}.py would shadow the role's link"


# -- the layers ------------------------------------------------------------------------------------
def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((REPO / "prioreplay").rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("").parts
        if "_pb2" not in path.name:  # generated stubs
            mods[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    for name, folder in _service_packages().items():
        for path in sorted(folder.glob("*.py")):
            mods[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path
    return mods


MODULES = _modules()


def layer(module: str) -> str:
    """'core', 'entry' or 'role:<name>' of a project module, from the folder it lives in."""
    if module == ENTRY_PACKAGE or module.startswith(ENTRY_PACKAGE + "."):
        return "entry"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROLES:
        return f"role:{parts[1]}"
    return "core"


def _is_type_checking(node: ast.If) -> bool:
    return (
        isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        or isinstance(node.test, ast.Attribute)
        and node.test.attr == "TYPE_CHECKING"
    )


def imports(module: str, modules: dict[str, Path] = MODULES) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every runtime import of ``module``."""
    tree = ast.parse(modules[module].read_text(encoding="utf-8"))
    package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                out.extend((_project(a.name, modules), child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else []))
                for a in child.names:
                    out.append((_project(f"{base}.{a.name}", modules) or _project(base, modules), child.lineno, top))
            inner_top = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner_top)

    visit(tree, True)
    return [(m, line, top) for m, line, top in out if m and m != module]


def _project(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to (itself or its nearest known parent), or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def layer_violations(modules: dict[str, Path]) -> list[str]:
    """Every import that crosses the layers the wrong way, as "file:line: what"."""
    wrong = []
    for module, path in modules.items():
        mine = layer(module)
        for target, line, top in imports(module, modules):
            theirs = layer(target)
            where = f"{path.name}:{line}: {module}"
            if mine == "core" and theirs != "core":  # a role or an entry point
                wrong.append(f"{where}: the core imports {target} ({theirs})")
            elif mine.startswith("role:") and theirs not in ("core", mine):
                wrong.append(f"{where}: {mine} imports {target} ({theirs})")
            elif mine == "entry" and top and theirs.startswith("role:") and target.rpartition(".")[2] not in LIGHT_ROLE_MODULES:
                wrong.append(
                    f"{where}: an entry point imports {target} at module level; import it inside the function that needs it"
                )
    return wrong


def test_no_role_imports_another_role_and_the_core_imports_no_role():
    wrong = layer_violations(MODULES)
    assert not wrong, "layer violations (docs/INTERFACES.md, Layers):\n" + "\n".join(wrong)


def test_the_layer_check_catches_each_kind_of_violation(tmp_path):
    def module(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        return path

    fake = {
        **MODULES,
        "prioreplay.rollout_worker.bad": module("bad", "from prioreplay.learner import loss\n"),
        "prioreplay.bad_core": module("bad_core", "def f():\n    from prioreplay.priority_server.store import Store\n"),
        "prioreplay.apps.cli": module("cli", "from prioreplay.learner.learner import Learner\n"),
        "prioreplay.uses_app": module("uses_app", "from prioreplay.apps import demo\n"),
    }
    wrong = "\n".join(layer_violations(fake))
    assert "role:rollout_worker imports prioreplay.learner.loss" in wrong
    assert "the core imports prioreplay.priority_server.store" in wrong
    assert "an entry point imports prioreplay.learner.learner at module level" in wrong
    assert "the core imports prioreplay.apps.demo (entry)" in wrong
    assert len(layer_violations(fake)) == 4


def test_layers_are_folders():
    entry = {m for m in MODULES if layer(m) == "entry"}
    assert entry == {m for m, path in MODULES.items() if APPS in path.parents or path.parent == APPS}
    assert {"prioreplay.apps.cli", "prioreplay.apps.demo", "prioreplay.apps.compare"} <= entry
    assert layer("prioreplay.priority_server.store") == "role:priority_server"
    assert layer("prioreplay.datasets") == "core" and layer("prioreplay.integrations.trl") == "core"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert layer(scripts["prioreplay"].partition(":")[0]) == "entry", "the console script is an entry point"


#: Pairs still to rename, in the priority server's folder (not this layer's to rename): store.py (the
#: interface) / stores.py (the factory), client.py (the core client) / clients.py (traffic per kind
#: of client). Delete each entry when its rename lands.
KNOWN_PLURALS = {("store", "stores"), ("client", "clients")}


def test_no_two_modules_differ_by_a_plural():
    names = {path.stem for path in MODULES.values() if path.stem != "__init__"} | {
        path.name for path in (REPO / "prioreplay").iterdir() if path.is_dir()
    }
    pairs = sorted((n, n + "s") for n in names if n + "s" in names and (n, n + "s") not in KNOWN_PLURALS)
    assert not pairs, f"modules whose names differ by a plural: {pairs}; name each for its job"


def test_no_import_cycles():
    graph = {m: sorted({t for t, _, _ in imports(m)}) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_import_reader_sees_module_level_lazy_and_from_package_imports():
    scoring = {(t, top) for t, _, top in imports("prioreplay.rollout_worker.scoring")}
    assert ("prioreplay.rules", True) in scoring  # from prioreplay import rules
    assert ("prioreplay.checkpoint_reader", False) in {(t, top) for t, _, top in imports("prioreplay.apps.demo")}
    assert layer("prioreplay.rollout_worker.worker") == "role:rollout_worker" and layer("prioreplay.rules") == "core"


def test_docs_name_the_same_layers_and_folders():
    interfaces = (REPO / "docs" / "INTERFACES.md").read_text(encoding="utf-8")
    layers = interfaces.split("## Layers", 1)[1].split("\n## ", 1)[0]
    packages = interfaces.split("## Packages", 1)[1].split("\n## ", 1)[0]
    assert "`prioreplay/apps/`" in layers and f"`{ENTRY_PACKAGE}`" in packages
    for path in sorted(APPS.glob("*.py")):
        if path.stem != "__init__":
            assert f"`{path.name}`" in layers, f"docs/INTERFACES.md, Layers: name {path.name}"
            assert f"`{path.name}`" in packages, f"docs/INTERFACES.md, Packages: name {path.name}"
    for light in LIGHT_ROLE_MODULES:
        assert f"`{light}`" in layers
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = (REPO / "docs" / "DEVELOPMENT.md").read_text(encoding="utf-8").split("## Layout", 1)[1].split("\n## ", 1)[0]
    for role in ROLES:
        assert f"`services/{role}/`" in layers and f"prioreplay.{role}" in layers
        assert f"| `services/{role}/` |" in layout, f"docs/DEVELOPMENT.md, Layout: add services/{role}/"
        assert f"| `services/{role}/` |" in readme, f"README where-to-find table: add services/{role}/"
    assert "| `prioreplay/` |" in layout and "| `prioreplay/apps/` | entry points |" in layout
    assert "`prioreplay/apps/`" in readme, "README where-to-find table: add prioreplay/apps/"
    for path in sorted(APPS.glob("*.py")):
        if path.stem != "__init__":
            assert f"`{path.name}`" in layout, f"docs/DEVELOPMENT.md, Layout: name apps/{path.name}"


# -- the base install ------------------------------------------------------------------------------
#: Packages only the worker, learner, GPU and demo extras bring; the base install has none of them.
ROLE_ONLY_PACKAGES = {"torch", "transformers", "safetensors", "accelerate", "gguf", "math-verify", "matplotlib", "vllm", "peft"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def test_the_base_install_carries_no_model_stack():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {_name(r) for r in project["dependencies"]}
    assert not base & ROLE_ONLY_PACKAGES, f"move {sorted(base & ROLE_ONLY_PACKAGES)} to an extra"
    extras = project["optional-dependencies"]
    for extra in ("worker", "learner"):
        assert {"torch", "transformers", "safetensors"} <= {_name(r) for r in extras[extra]}
    assert "math-verify" in {_name(r) for r in extras["worker"]}
    assert "vllm" in {_name(r) for r in extras["gpu"]}


# -- the tests' layout -----------------------------------------------------------------------------
TESTS = REPO / "tests"


def test_tests_live_in_a_folder_per_part_of_the_code():
    """tests/unit/<part>/ and tests/system/<part>/ (README, "Development"); every folder is a package, so
    two test files of one name in different folders import as different modules."""
    flat = sorted(p.relative_to(REPO).as_posix() for top in ("unit", "system") for p in (TESTS / top).glob("test_*.py"))
    assert not flat, f"move {flat} into the folder of the part of the code they test (tests/<unit|system>/<part>/)"
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    bare = sorted(f.relative_to(REPO).as_posix() for f in folders if not (f / "__init__.py").is_file())
    assert not bare, f"add an __init__.py to {bare}"


def test_no_role_module_imports_its_own_role_by_the_installed_name():
    """Inside ``services/<role>/`` modules import each other relatively (``from .store import …``),
    so an editor or a static tool resolves them from the files alone; ``prioreplay.<role>`` exists
    only through the role's link (prioreplay/<role>). Other roles and ``prioreplay`` core stay absolute."""
    import ast

    repo = Path(__file__).resolve().parents[3]
    offenders = []
    for path in sorted((repo / "services").rglob("*.py")):
        role = path.relative_to(repo / "services").parts[0]
        own = f"prioreplay.{role}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name == own or name.startswith(own + "."):
                    offenders.append(f"{path.relative_to(repo)}:{node.lineno}: {name}")
    assert not offenders, "import these relatively (from .module import name):\n" + "\n".join(offenders)
