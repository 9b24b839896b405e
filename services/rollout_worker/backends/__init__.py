"""Imports as prioreplay.rollout_worker.backends: the generation backends (transformers, vLLM)."""
