"""Faults: killed processes, Redis errors and failover, soak under random kills."""
