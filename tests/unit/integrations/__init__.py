"""The framework integrations' pure parts."""
