"""Imports as prioreplay.priority_server: the priority server role (stores, samplers, servicer, metrics).

The folder-to-import mapping is derived by setup.py from the folders under services/.
"""
