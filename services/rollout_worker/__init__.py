"""Imports as prioreplay.rollout_worker: the rollout worker role (generation backends, the lease→generate→report loop).

The folder is linked into the import package as prioreplay/rollout_worker (docs/DEVELOPMENT.md, "Layout").
"""
