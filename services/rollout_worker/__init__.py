"""Imports as prioreplay.rollout_worker: the rollout worker role (generation backends, the lease→generate→report loop).

The folder-to-import mapping is derived by setup.py from the folders under services/.
"""
