"""The pace bound's cost on a fleet: the share of worker time spent waiting for the learner, and
what it buys (no stale groups), for a learner slower and one faster than the fleet.

Set-up: a real priority server in this process (memory store, ``--pace-batches K``), ``W``
simulated workers and one simulated learner on threads, over gRPC. A worker leases ``b_w`` problems
(``SampleProblems``; the server holds the call while the bound leaves no room), "generates" for
``gen_s`` seconds, and reports one mixed group per problem under the policy version of its lease.
The learner fills a batch of ``B`` groups (declared on its pulls), "trains" for ``step_s`` seconds,
drops groups more than ``max_staleness`` versions old (as the real learner does), acknowledges, and
publishes the next version. ``step_s`` is set by the speed ratio r = fleet production / learner
consumption = (W·b_w / gen_s) / (B / step_s): r = 2, the learner is the bottleneck (the demo's
regime); r = 0.5, the fleet is.

Per (r, K), over ``seconds`` of wall time:

* ``worker_wait_share``: the wall time of the lease calls the bound held (answered with
  ``pace_wait_s`` > 0), clipped to the window, / (W × seconds): the share of GPU time a paced fleet
  spends idle (the cost);
* ``stale_share``: stale groups / groups the learner pulled (what an unpaced fleet wastes);
* ``trained_share``: groups trained / groups generated (generation that reached the policy);
* ``staleness_mean``: versions between a trained group's generation and its step.

K = 0 is the server without a bound. Sequential workers (one lease at a time); a pipelined worker
(``--pipeline``, the default) holds up to two leases, so the fleet then has 2·W·b_w problems to
keep in flight. The figures say when to loosen the bound (docs/USAGE.md, "Pacing"): with
K·B below the fleet's in-flight problems, workers wait even when the learner keeps up.

Each figure is the mean of ``--rounds`` repeats of its run, with a 95% t-interval (the runs are
timed, not seeded: repeats measure the timing noise).

Usage: ``python -m benchmarks.pacing [--seconds 5] [--workers 8] [--worker-batch 4]
[--learner-batch 8] [--rounds 5] [--out benchmarks/results.json] [--plot docs/bench_pacing.png]``.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The bound settings compared (0: no bound).
PACES = (0, 1, 2, 4)
#: Fleet production / learner consumption: the learner slower (2) and faster (0.5) than the fleet.
RATIOS = (2.0, 0.5)


@dataclass
class Tally:
    """What one (ratio, K) run counted, across the threads (each field is added to under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    waited_s: float = 0.0
    generated: int = 0
    pulled: int = 0
    stale: int = 0
    trained: int = 0
    age_sum: int = 0


def _worker(address: str, batch: int, gen_s: float, end: float, stop: threading.Event, tally: Tally, name: str) -> None:
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.v1 import priority_service_pb2 as pb

    comps = [pb.Completion(reward=r, token_ids=[7], logprobs=[-0.5]) for r in (1.0, 0.0)]
    with PriorityClient(ClientSettings(server=address)) as c:
        while not stop.is_set():
            asked = time.monotonic()
            lease = c.sample(batch, worker_id=name)
            if lease.pace_wait_s > 0:  # held by the pace bound: idle until the answer (within the window)
                with tally.lock:
                    tally.waited_s += max(0.0, min(time.monotonic(), end) - asked)
            if not lease.problems:
                if not lease.paced:
                    stop.wait(lease.retry_after_s or 0.05)
                continue
            stop.wait(gen_s)  # generating (the GPU busy)
            outs = [
                pb.ProblemOutcome(
                    problem_id=lp.problem.id, policy_version=lease.policy_version, prompt_token_ids=[5], completions=comps
                )
                for lp in lease.problems
            ]
            c.report(lease.lease_id, outs)
            with tally.lock:
                tally.generated += len(outs)


def _learner(address: str, batch: int, step_s: float, max_staleness: int, stop: threading.Event, tally: Tally) -> None:
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    version = 0
    with PriorityClient(ClientSettings(server=address)) as c:
        while not stop.is_set():
            groups: list = []
            while len(groups) < batch and not stop.is_set():
                groups += list(c.pull(batch - len(groups), wait_s=0.5, consumer="sim", batch_groups=batch).groups)
            if stop.is_set():
                break
            ages = [version - g.policy_version for g in groups]
            used = [a for a in ages if a <= max_staleness]
            stop.wait(step_s)  # training
            c.ack([g.group_id for g in groups])
            version += 1
            c.publish(version, f"sim://v-{version}")
            with tally.lock:
                tally.pulled += len(groups)
                tally.stale += len(ages) - len(used)
                tally.trained += len(used)
                tally.age_sum += sum(used)


def run_one(
    pace: int, ratio: float, *, seconds: float, workers: int, worker_batch: int, learner_batch: int, gen_s: float
) -> dict[str, float]:
    """One (K, r) run: the four figures of the module docstring."""
    from prioreplay.convert import problem_to_proto
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.problems import ProblemRecord

    step_s = ratio * learner_batch * gen_s / (workers * worker_batch)
    config = ServerConfig(  # held calls answer within a second, so the threads stop soon after the window
        snapshot_interval_s=0,
        pace_batches=pace,
        pace_batch_groups=learner_batch,
        pace_wait_s=1.0,
        max_queue_depth=0,
        retest_fraction=0.0,
    )
    tally, stop = Tally(), threading.Event()
    with BackgroundServer(lambda: create_store("memory", config.to_store_config()), config) as srv:
        from prioreplay.client import PriorityClient
        from prioreplay.config import ClientSettings

        with PriorityClient(ClientSettings(server=srv.address)) as c:
            c.register(
                [problem_to_proto(ProblemRecord(f"p{i}", f"{i}+1", str(i + 1))) for i in range(4 * workers * worker_batch)]
            )
        end = time.monotonic() + seconds
        threads = [
            threading.Thread(target=_worker, args=(srv.address, worker_batch, gen_s, end, stop, tally, f"w{i}"), daemon=True)
            for i in range(workers)
        ]
        threads.append(threading.Thread(target=_learner, args=(srv.address, learner_batch, step_s, 4, stop, tally), daemon=True))
        for t in threads:
            t.start()
        time.sleep(max(0.0, end - time.monotonic()))
        stop.set()
        for t in threads:
            t.join(30)
    return {
        "worker_wait_share": tally.waited_s / (workers * seconds),
        "stale_share": tally.stale / tally.pulled if tally.pulled else 0.0,
        "trained_share": tally.trained / tally.generated if tally.generated else 0.0,
        "staleness_mean": tally.age_sum / tally.trained if tally.trained else 0.0,
    }


def measure(seconds: float = 5.0, workers: int = 8, worker_batch: int = 4, learner_batch: int = 8, gen_s: float = 0.4,
            paces: tuple[int, ...] = PACES, ratios: tuple[float, ...] = RATIOS) -> dict[str, dict[str, float]]:  # fmt: skip
    """Every (r, K) run: ``{"r<ratio>.k<K>": figures}``."""
    out = {}
    for ratio in ratios:
        for pace in paces:
            out[f"r{ratio:g}.k{pace}"] = run_one(
                pace, ratio, seconds=seconds, workers=workers, worker_batch=worker_batch, learner_batch=learner_batch, gen_s=gen_s
            )
    return out


def plot(figs: dict[str, dict[str, float]], path: str) -> None:
    """Worker wait share against K per learner speed, and what an unpaced fleet wastes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted({float(k.split(".k")[0][1:]) for k in figs}, reverse=True)
    paces = sorted({int(k.split(".k")[1]) for k in figs})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in ratios:
        label = f"learner {'slower' if r > 1 else 'faster'} than the fleet (r = {r:g})"
        ax1.plot(paces, [figs[f"r{r:g}.k{k}"]["worker_wait_share"] for k in paces], marker="o", label=label)
        ax2.plot(paces, [figs[f"r{r:g}.k{k}"]["stale_share"] for k in paces], marker="o", label=f"stale share, r = {r:g}")
        ax2.plot(
            paces, [figs[f"r{r:g}.k{k}"]["trained_share"] for k in paces], marker="s", ls="--", label=f"trained share, r = {r:g}"
        )
    ax1.set(xlabel="--pace-batches K (0: no bound)", ylabel="share of worker time waiting", title="the cost: idle workers")
    ax2.set(xlabel="--pace-batches K (0: no bound)", ylabel="share of groups", title="what it buys")
    for ax in (ax1, ax2):
        ax.set_xticks(paces)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import json

    from benchmarks.results import Results, log, merge_results
    from prioreplay.intervals import mean_interval

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="wall time per (r, K) run")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--worker-batch", type=int, default=4, help="problems per lease b_w")
    ap.add_argument("--learner-batch", type=int, default=8, help="groups per learner step B")
    ap.add_argument("--gen-s", type=float, default=0.4, help="seconds a worker generates one lease")
    ap.add_argument(
        "--rounds", type=int, default=5, help="repeats of every (r, K) run: each figure is their mean, 95%% t-interval"
    )
    ap.add_argument("--out", default=None, help="merge the figures into this results.json (default: print only)")
    ap.add_argument("--plot", default=None, help="write the figure here (e.g. docs/bench_pacing.png)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: give at least 1")
    log(f"pacing: {a.rounds} rounds of {len(RATIOS) * len(PACES)} runs of {a.seconds:g} s")
    rounds = [measure(a.seconds, a.workers, a.worker_batch, a.learner_batch, a.gen_s) for _ in range(a.rounds)]
    # each figure over the rounds: mean and 95% t-interval (the runs are timed, not seeded: rounds are repeats)
    summary = {run: {key: mean_interval([r[run][key] for r in rounds]) for key in values} for run, values in rounds[0].items()}
    figs = {run: {key: m for key, (m, _, _) in values.items()} for run, values in summary.items()}
    print(json.dumps(summary, indent=1))
    command = (
        f"python -m benchmarks.pacing --seconds {a.seconds:g} --workers {a.workers} --worker-batch {a.worker_batch} "
        f"--learner-batch {a.learner_batch} --gen-s {a.gen_s:g} --rounds {a.rounds}"
    )
    res = Results(command, note="simulated workers and learner (sleeps) on a real in-process server, memory store")
    for run, values in summary.items():
        for key, (m, lo, hi) in values.items():
            unit = "versions" if key == "staleness_mean" else "fraction"
            res.add(f"pacing.{run}.{key}", round(m, 4), unit, ci95=[round(lo, 4), round(hi, 4)], rounds=a.rounds)
    if a.plot:
        res.plot(a.plot, lambda path: plot(figs, path))
    if a.out:
        merge_results(Path(a.out), res.items)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__: list[Any] = ["measure", "plot", "run_one"]
