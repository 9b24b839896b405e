"""Packaging of the folder layout: ``prioreplay/`` and every role folder under ``services/``.

``services/<role>/`` imports as ``prioreplay.<role>`` (sub-folders as sub-packages). The mapping
is derived here from the folders themselves, so a new role (a folder with an ``__init__.py``)
needs no entry anywhere else; run ``make install`` again so an editable install sees it.
Everything else (metadata, dependencies, extras) is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup


def role_packages(services: str = "services") -> dict[str, str]:
    """{import name: folder} of every package under ``services/``: ``prioreplay.<role>[.<sub>...]``."""
    mapping = {}
    for init in sorted(Path(services).glob("**/__init__.py")):
        folder = init.parent
        mapping[".".join(("prioreplay", *folder.relative_to(services).parts))] = folder.as_posix()
    return mapping


if __name__ == "__main__":
    roles = role_packages()
    setup(
        package_dir={"prioreplay": "prioreplay", **roles},
        packages=["prioreplay", *(f"prioreplay.{p}" for p in find_packages("prioreplay")), *roles],
    )
