"""Which interpreter the demo's workers run under: vLLM lives in its own environment (docs/VLLM.md),
so ``prioreplay demo --backend vllm`` starts its workers there, and says how to make it when missing."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from prioreplay.apps.demo_config import VLLM_PYTHON, DemoConfig, resolve_worker_python
from prioreplay.errors import InvalidArgument


def test_transformers_workers_run_under_this_interpreter():
    assert resolve_worker_python(DemoConfig()) == sys.executable


def test_vllm_workers_default_to_the_vllm_environment_and_name_the_fix_when_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .venv-vllm here
    with pytest.raises(InvalidArgument) as e:
        resolve_worker_python(DemoConfig(backend="vllm"))
    assert str(VLLM_PYTHON) in str(e.value) and "does not exist" in str(e.value)
    assert "make install-vllm" in str(e.value) and "--worker-python" in str(e.value)


def test_a_worker_python_without_vllm_is_refused_for_the_vllm_backend():
    if importlib.util.find_spec("vllm") is not None:  # the project's .venv has none; vLLM's own has it
        pytest.skip("this interpreter has vllm: the refusal needs one without it")
    with pytest.raises(InvalidArgument, match="has no vllm package"):
        resolve_worker_python(DemoConfig(backend="vllm", worker_python=sys.executable))


def test_an_explicit_worker_python_must_exist(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        resolve_worker_python(DemoConfig(worker_python=tmp_path / "nope" / "python"))
    assert resolve_worker_python(DemoConfig(worker_python=sys.executable)) == sys.executable
