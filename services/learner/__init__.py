"""Imports as prioreplay.learner: the learner role (GRPO loss, trajectory pulling, checkpoints, publishing).

The folder-to-import mapping is derived by setup.py from the folders under services/.
"""
