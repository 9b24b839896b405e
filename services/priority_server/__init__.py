"""Imports as prioreplay.priority_server: the priority server role (stores, samplers, servicer, metrics).

The folder is linked into the import package as prioreplay/priority_server (docs/DEVELOPMENT.md, "Layout").
"""
