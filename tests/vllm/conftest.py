"""tests/vllm: the vLLM backend on the real engine (vLLM's CPU build, ``make install-vllm``).

Every test here carries the ``vllm`` marker. They run in the second environment ``.venv-vllm``
(vLLM pins transformers<5.20); ``make test`` runs them there after the main suite. In an
environment without vLLM this folder collects nothing.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Mark every test of this folder ``vllm``."""
    for item in items:
        if "tests/vllm/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)
