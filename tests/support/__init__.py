"""Helpers shared by unit and system tests: the store invariants, malformed RPCs, hand-made wire bytes."""
