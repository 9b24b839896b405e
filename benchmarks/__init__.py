"""Benchmarks of prioreplay: service throughput, simulated learning efficiency, step overhead.

``python -m benchmarks.run`` (``make bench``) runs them and writes ``benchmarks/results.json``;
``docs/BENCHMARKS.md`` explains every figure and the command that produced it.
"""
