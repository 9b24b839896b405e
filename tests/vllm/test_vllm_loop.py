"""The whole loop on vLLM's CPU build: an in-process priority server (embedded store), one rollout
worker on the vllm backend and the learner, publishing every step; every published version must be
loaded by the worker (``benchmarks.gpu_check --device cpu --backend vllm``: the learner waits before
each step until the worker runs the newest version, and the check fails on a version never loaded),
and the step-0 behaviour log-probs must match the learner's recompute."""

from __future__ import annotations

from benchmarks import gpu_check


def test_three_versions_published_and_each_loaded_by_the_vllm_worker(capsys):
    code = gpu_check.main(["--device", "cpu", "--backend", "vllm", "--steps", "3", "--problems", "32"])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert "(vllm, cpu)" in out and "loaded versions [0, 1, 2, 3]" in out
