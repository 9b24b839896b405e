"""Imports as prioreplay.learner: the learner role (GRPO loss, trajectory pulling, checkpoints, publishing).

The folder is linked into the import package as prioreplay/learner (docs/DEVELOPMENT.md, "Layout").
"""
