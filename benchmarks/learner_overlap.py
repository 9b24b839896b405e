"""The learner's wait share with a full queue, its pull prefetch off and on (or its publish
synchronous and in the background), side by side.

Target (issue "No accelerator waits on the service", item 4): the share of a learner step spent
waiting for groups <= 1% when the server's queue is full.

Set-up: an in-process priority server (memory store) whose trajectory queue holds every group the
run needs before the first step (registered, leased and reported up front: the queue is full);
a learner on the tiny model (``prioreplay.tiny_model``, CPU) pulls ``--batch-groups`` groups a
step, publishes every step, checkpoints every 10. Arms in alternating blocks of ``--steps``
steps, ``--repeats`` blocks each, each block a fresh learner with its own consumer name: ``off``
(``prefetch=False``: the step's pull runs before its compute) and ``on`` (the default: the next
step's pull runs on a background thread while the step computes). Per step, wait share =
``wait_s`` / (``wait_s`` + ``compute_s`` + ``publish_s`` + ``checkpoint_s``) from the step's record;
a block's share is the sum of its waits over the sum of its step times. Reported: the mean of
the blocks' shares per arm with a 95% t-interval over blocks, and the mean step time.

The tiny model's step takes milliseconds, so a pull's RPC is a visible share of it; with a real
model the compute grows by orders of magnitude and the off arm's share shrinks with it.

With ``--background-publish`` the arms are ``sync`` (prefetch on, the publish on the step's path:
the ``on`` arm above) and ``bg`` (prefetch on, ``background_publish=True``: the step copies the
weights to CPU and the write + PublishPolicy run on a thread while the next step trains). Per
block, publish stall share = Σ ``publish_s`` / Σ step time (``publish_s``: in ``bg`` the copy and
any wait for the previous version's write; a checkpoint step also waits for its version inside
``checkpoint_s``), reported as above, with the mean step time and the mean ``publish_s`` per step of each arm. ``--model`` trains
another model (an alias such as ``smollm2-135m``, or a directory) instead of the tiny one; its
figures are named with the alias appended.

Usage: ``python -m benchmarks.learner_overlap [--steps 12] [--repeats 3] [--batch-groups 4]
[--background-publish] [--model tiny] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.publish import record
from prioreplay.intervals import mean_interval

G = 4  # completions per group
TOKENS = 8  # tokens per completion


def _fill_queue(client: Any, n_groups: int, seed: int) -> None:
    """Register ``n_groups`` problems, lease each once and report one mixed group per problem."""
    from prioreplay.v1 import priority_service_pb2 as pb

    rng = random.Random(seed)
    client.register([pb.Problem(id=f"q{i}", prompt=f"what is {i} + 1?", answer=str(i + 1)) for i in range(n_groups)])
    left = n_groups
    while left:
        lease = client.sample(min(left, 64))
        outcomes = [
            pb.ProblemOutcome(
                problem_id=lp.problem.id,
                prompt_token_ids=[5, 6, 7],
                completions=[
                    pb.Completion(
                        reward=float((i + k) % 2),
                        token_ids=[rng.randrange(5, 60) for _ in range(TOKENS)],
                        logprobs=[-2.0] * TOKENS,
                    )
                    for i in range(G)
                ],
            )
            for k, lp in enumerate(lease.problems)
        ]
        resp = client.report(lease.lease_id, outcomes)
        assert resp.accepted, resp.reason
        left -= len(lease.problems)


def _block(
    address: str, model: Path, work: Path, name: str, prefetch: bool, steps: int, batch_groups: int, background: bool = False
) -> dict:
    """Run one learner for ``steps`` steps; its summed wait, publish and step seconds."""
    from prioreplay.learner.config import LearnerConfig
    from prioreplay.learner.learner import Learner

    cfg = LearnerConfig(
        server=address,
        model=str(model),
        checkpoint_dir=work / name,
        batch_groups=batch_groups,
        micro_batch_size=8,
        publish_every=1,
        checkpoint_every=10,
        metrics_port=0,
        pull_wait_s=1.0,
        batch_timeout_s=5.0,
        consumer=name,
        device="cpu",
        prefetch=prefetch,
        background_publish=background,
        max_staleness=1_000_000,
    )
    learner = Learner(cfg)
    try:
        learner.resume()
        wait = publish = total = 0.0
        for _ in range(steps):
            res = learner.step()
            r = res.record
            if not res.trained:
                raise RuntimeError(f"block {name}: a step trained nothing ({r}); the queue ran dry")
            phases = [float(r.get(k) or 0.0) for k in ("wait_s", "compute_s", "publish_s", "checkpoint_s")]
            wait, publish, total = wait + phases[0], publish + phases[2], total + sum(phases)
        learner.wait_published()  # the last version out before the next block (not timed)
        return {"wait_s": wait, "publish_s": publish, "step_s": total}
    finally:
        learner.client.close()


#: figure names per arm: (share, its key); ``off``/``on`` compare prefetch, ``sync``/``bg`` the publish
ARMS = {
    "off": ("wait_s", "learner_wait_share_no_prefetch"),
    "on": ("wait_s", "learner_wait_share"),
    "sync": ("publish_s", "learner_publish_stall_share_sync"),
    "bg": ("publish_s", "learner_publish_stall_share"),
}


def measure(steps: int, repeats: int, batch_groups: int, background: bool = False, model_name: str = "tiny") -> dict[str, float]:
    """Two arms in alternating blocks (see the module docstring); the figures by name."""
    from prioreplay import models
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.tiny_model import make_tiny_model

    arms = ("sync", "bg") if background else ("off", "on")
    shares: dict[str, list[float]] = {arm: [] for arm in arms}
    step_s: dict[str, list[float]] = {arm: [] for arm in arms}
    publish_s: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "tiny", seed=1) if model_name == "tiny" else models.resolve_model(model_name)
        config = ServerConfig(metrics_port=0, snapshot_interval_s=0, max_queue_depth=0)
        srv = BackgroundServer(lambda: create_store("memory", StoreConfig(retest_fraction=0.0)), config).start()
        client = PriorityClient(ClientSettings(server=srv.address))
        try:
            # every block's groups, with room: a block's first (recovery) pull asks for as many groups
            # as the server holds pending for earlier blocks' consumers, and its backlog keeps the rest
            _fill_queue(client, 8 * repeats * (steps + 1) * batch_groups, seed=0)
            for rep in range(repeats):
                for arm in arms:
                    b = _block(srv.address, model, work, f"{arm}-{rep}", arm != "off", steps, batch_groups, arm == "bg")
                    shares[arm].append(b[ARMS[arm][0]] / b["step_s"])
                    step_s[arm].append(b["step_s"] / steps)
                    publish_s[arm].append(b["publish_s"] / steps)
        finally:
            client.close()
            srv.stop()
    figs: dict[str, float] = {}
    suffix = "" if model_name == "tiny" else "_" + Path(model_name).name.replace("-", "_").replace(".", "_")
    for arm in reversed(arms):
        key = ARMS[arm][1] + suffix
        mean, lo, hi = mean_interval(shares[arm])
        figs.update({key: mean, f"{key}_lo": lo, f"{key}_hi": hi})
        figs[f"{key}_step_s"] = statistics.fmean(step_s[arm])
        if background:  # the stall itself, in seconds per step (its share moves with the compute's noise)
            figs[f"{key}_publish_s"] = statistics.fmean(publish_s[arm])
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="learner steps per block")
    ap.add_argument("--repeats", type=int, default=3, help="blocks per arm (alternating off, on)")
    ap.add_argument("--batch-groups", type=int, default=4, help="groups per learner step")
    ap.add_argument(
        "--background-publish",
        action="store_true",
        help="compare the publish on the step's path (sync) with background_publish (bg) instead of prefetch off/on",
    )
    ap.add_argument("--model", default="tiny", help="tiny (built here), or a model alias or directory (e.g. smollm2-135m)")
    ap.add_argument("--note", default="", help="measurement conditions, e.g. the load (recorded)")
    ap.add_argument("--out", default=None, help="merge the figures into this results.json (default: print only)")
    a = ap.parse_args(argv)
    figs = measure(a.steps, a.repeats, a.batch_groups, a.background_publish, a.model)
    print(json.dumps(figs, indent=1))
    if a.out:
        units = {k: ("s" if k.endswith("_s") else "fraction") for k in figs}
        command = f"python -m benchmarks.learner_overlap --steps {a.steps} --repeats {a.repeats} --batch-groups {a.batch_groups}"
        command += " --background-publish" * a.background_publish + (f" --model {a.model}" if a.model != "tiny" else "")
        record(Path(a.out), "overhead", figs, units, command, a.note)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
