"""Tiny runs of every benchmark."""
