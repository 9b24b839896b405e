"""The Redis store: its own behaviour, the invariants, and agreement with the memory store."""
