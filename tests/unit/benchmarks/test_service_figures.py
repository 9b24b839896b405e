"""The service benchmark's figures (benchmarks/service_figures.py) from a run's output: the rounds'
means, the server's CPU per problem, and each ratio with its interval, the rounds and the load."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import service
from benchmarks.results import Results
from benchmarks.service_figures import _service_figures


def row(path: str, rnd: int, rate: float, cores: float) -> dict:
    return {
        "store": "memory",
        "path": path,
        "processes": 1 if path == "grpc" else 0,
        "clients": 8,
        "round": rnd,
        "sampled_per_s": rate,
        "reported_per_s": rate,
        "sample_p50_ms": 1.0,
        "sample_p99_ms": 2.0,
        "report_p50_ms": 1.0,
        "report_p99_ms": 2.0,
        "rpcs": 10,
        "client_cores": 0.05 if path == "grpc" else cores,
        "server_cores": cores if path == "grpc" else None,
        "cpu_us_per_problem": cores / rate * 1e6,
    }


def test_figures_are_the_rounds_means_with_intervals_and_the_load():
    rows = [
        row("grpc", 0, 1000.0, 0.06),
        row("inprocess", 0, 3000.0, 0.09),
        row("grpc", 1, 2000.0, 0.10),
        row("inprocess", 1, 4000.0, 0.10),
    ]
    out = {"register_s": {}, "rows": rows, "rounds": 2, "load": [1.5, 1.7]}
    out["ratios"] = service._throughput_ratios(rows, "memory", (8,))
    out["mean_rows"] = service.mean_rows(rows)
    res = Results("test")
    _service_figures(res, SimpleNamespace(problems=10), out)
    figures = {i["name"]: i for i in res.items}
    cpu = figures["service.memory.c8.server_cpu_us_per_problem"]
    assert cpu["value"] == (60.0 + 50.0) / 2 and cpu["rounds"] == 2 and cpu["load_1m"] == [1.5, 1.7]
    assert cpu["ci95"][0] < cpu["value"] < cpu["ci95"][1]
    assert figures["service.memory.c8.ceiling_cpu_us_per_problem"]["value"] == (30.0 + 25.0) / 2
    ratio = figures["service.memory.c8.e2e_over_ceiling_cpu"]
    assert ratio["value"] == (30.0 / 60.0 + 25.0 / 50.0) / 2  # per round, paired, then the mean
    assert figures["service.memory.grpc.c8.sampled_per_s"]["value"] == 1500.0


def test_worker_vs_raw_rounds_pair_each_round_and_give_an_interval(monkeypatch):
    """vllm_engine's rounds: each round's ratio is one worker run over its own raw replay; the
    figure is their mean with a t-interval (the engine itself is not needed to check the pairing)."""
    from benchmarks import vllm_engine

    runs = iter([{"ratio": 0.8, "worker_tps": 80.0, "raw_tps": 100.0}, {"ratio": 0.9, "worker_tps": 90.0, "raw_tps": 100.0}])
    monkeypatch.setattr(vllm_engine, "worker_vs_raw", lambda backend, **kw: next(runs))
    out = vllm_engine.rounds_of_worker_vs_raw(None, 2, batches=1)
    assert out["ratios"] == [0.8, 0.9] and out["rounds"] == 2
    assert abs(out["ratio"] - 0.85) < 1e-12 and out["ratio_ci95"][0] < 0.8 and out["ratio_ci95"][1] > 0.9
    assert out["worker_tps"] == 85.0
