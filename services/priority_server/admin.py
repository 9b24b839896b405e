"""Entry points of ``prioreplay load`` and ``prioreplay stats``: client commands of a running server.

Each takes its typed configuration and returns the process exit code. Errors the user can fix
are raised as :mod:`prioreplay.errors` classes; the CLI prints them and exits with status 2.
They need only the base install (no torch, no transformers).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import TextIO

from prioreplay.errors import InvalidArgument

from .config import LoadConfig, StatsConfig

#: Width of the priority histogram's longest bar, characters.
BAR_WIDTH = 40


# -- load -----------------------------------------------------------------------------------
def _chunks(records: Iterator, chunk_size: int, failure: list[BaseException]) -> Iterator[list]:
    """Read ``chunk_size`` records at a time; stop (recording the error) at the first bad one.

    A chunk is yielded only once it was read whole, so nothing of a chunk holding a malformed
    line is sent.
    """
    while True:
        chunk = []
        try:
            for record in records:
                chunk.append(record)
                if len(chunk) >= chunk_size:
                    break
        except Exception as e:  # noqa: BLE001 - re-raised by run_load after the stream ends
            failure.append(e)
            return
        if not chunk:
            return
        yield chunk
        if len(chunk) < chunk_size:
            return


def run_load(config: LoadConfig) -> int:
    """Register a dataset's problems with a running server, streamed in chunks.

    Prints ``registered SOURCE: N problem(s) sent, created=… updated=… total=…`` (the loader
    service's log says what it registered). A malformed line fails with its file:line before
    anything of its chunk is sent; the chunks before it stay registered (the count is printed).

    Returns:
        0 when every problem was registered.

    Raises:
        InvalidArgument: malformed input (file:line), unknown source, a source with no problems
            (an empty file loaded 0 problems with exit 0), a problem the server refused (its index
            in the stream), or ids registered with another prompt or answer (without
            ``--replace``; the message names them and ``--id-prefix``).
        StoreUnavailable: the server cannot be reached.
    """
    from tqdm import tqdm

    from prioreplay.client import PriorityClient
    from prioreplay.convert import problem_to_proto

    records = _records(config)
    failure: list[BaseException] = []
    sent = 0
    with (
        PriorityClient(config, max_retries=2) as client,
        tqdm(total=config.limit, unit="problem", desc="load", disable=None, file=sys.stderr) as bar,
    ):
        client.wait_ready(config.rpc_timeout_s)

        def problems():
            nonlocal sent
            for chunk in _chunks(records, config.chunk_size, failure):
                for r in chunk:
                    yield problem_to_proto(r)
                sent += len(chunk)
                bar.update(len(chunk))

        resp = client.register(problems(), chunk_size=config.chunk_size, replace=config.replace)
    _tell_loaded(config, resp, sent, failure)
    return 0


def _records(config: LoadConfig):
    """The problem records of ``config.source``, mapped and limited as ``config`` says (lazily)."""
    from prioreplay.datasets import iter_problems

    return iter_problems(
        config.source,
        split=config.split,
        id_column=config.id_column,
        prompt_column=config.prompt_column,
        answer_column=config.answer_column,
        verifier=config.verifier,
        id_prefix=config.id_prefix or None,
        limit=config.limit,
    )


def _tell_loaded(config: LoadConfig, resp, sent: int, failure: list[BaseException]) -> None:
    """Print what a load registered; raise the reading error that stopped it, or an empty source.

    Raises:
        BaseException: ``failure[0]``, the error that stopped reading (after printing the count).
        InvalidArgument: nothing was sent (an empty file, split or filter).
    """
    counts = f"created={resp.created} updated={resp.updated} total={resp.total}"
    if failure:
        print(f"registered {sent} problem(s) before the error ({counts})", file=sys.stderr)
        raise failure[0]
    if sent == 0:
        raise InvalidArgument(
            f"{config.source}: no problems in this source (empty file, split or filter); nothing was "
            "registered. Check the path, --split and --limit"
        )
    print(f"registered {config.source}: {sent} problem(s) sent, {counts}", flush=True)


# -- stats ----------------------------------------------------------------------------------
def stats_dict(resp) -> dict:
    """A GetStats response as a plain dict (every field, lists as lists) plus ``mean_reward``.

    ``clients`` becomes a list of dicts whose ``source`` is the label (``worker``, ``trl``, ...).
    """
    from .client_traffic import LABELS, normalize

    out: dict = {}
    for f in resp.DESCRIPTOR.fields:
        v = getattr(resp, f.name)
        out[f.name] = list(v) if f.is_repeated else v
    out["clients"] = [
        {f.name: (LABELS[normalize(c.source)] if f.name == "source" else getattr(c, f.name)) for f in c.DESCRIPTOR.fields}
        for c in resp.clients
    ]
    n = resp.completions_reported
    out["mean_reward"] = resp.reward_sum / n if n else 0.0
    return out


def _format_clients(clients: list[dict]) -> list[str]:
    """The per-client lines of ``prioreplay stats`` (empty when no client has sampled or reported)."""
    if not clients:
        return []
    lines = ["", "clients (since this server process started):"]
    for c in clients:
        mean = c["reward_sum"] / c["completions"] if c["completions"] else 0.0
        lines.append(
            f"  {c['source']:<12} leases {c['leases']}, problems {c['problems_sampled']}, groups {c['groups']} "
            f"(mixed {c['groups_mixed']}), completions {c['completions']}, mean reward {mean:.3f}, "
            f"late reports {c['late_reports']}"
        )
    return lines


def format_stats(d: dict, width: int = BAR_WIDTH) -> str:
    """The text report of ``prioreplay stats``: pools, histogram bars, training counters."""
    lines = [
        f"problems       {d['problems']}",
        f"  heap         {d['heap_size']}",
        f"  solved       {d['solved']}",
        f"  unsolved     {d['unsolved']}",
        f"  leased       {d['leased']} (in {d['active_leases']} lease(s))",
        f"  unseen       {d.get('unseen', 0)} (no statistics yet: never tested, not warm-started)",
        *(
            [
                f"  quarantined  {d['quarantined']} (unservable: prompt over a worker's context; register again, "
                "with --replace for a new prompt, to release)"
            ]
            if d.get("quarantined")
            else []
        ),
        "",
        "priority histogram of the heap (p(1-p), Fatemi 2026):",
    ]
    hist, edges = d["priority_histogram"], d["priority_bucket_edges"]
    top = max(hist, default=0)
    for i, count in enumerate(hist):
        bar = "#" * (round(width * count / top) if top else 0)
        close = "]" if i == len(hist) - 1 else ")"
        lines.append(f"  [{edges[i]:.4f}, {edges[i + 1]:.4f}{close} {bar:<{width}} {count}")
    groups = d["groups_mixed"] + d["groups_all_correct"] + d["groups_all_wrong"] + d["groups_constant"]
    lines += [
        "",
        f"step           {d['step']}",
        f"policy version {d['policy_version']}" + (f" ({d['weights_uri']})" if d["weights_uri"] else ""),
        f"groups         {groups} (mixed {d['groups_mixed']}, all-correct {d['groups_all_correct']}, "
        f"all-wrong {d['groups_all_wrong']}, constant {d['groups_constant']})",
        f"effective-group fraction {d['effective_group_fraction']:.3f}",
        f"mean reward    {d['mean_reward']:.3f} over {d['completions_reported']} completion(s)",
        f"forgetting events {d['forgetting_events']}, breakthroughs {d['breakthroughs']}",
        f"lease expiries {d['lease_expiries']}, late reports {d['late_reports']}",
        f"trajectory queue depth {d['queue_depth']}, pending {d['pending_groups']}, acked {d['groups_acked']}",
    ]
    lines += _format_clients(d.get("clients", []))
    return "\n".join(lines)


def run_stats(config: StatsConfig, out: TextIO | None = None) -> int:
    """Print the server's statistics (text, or one JSON object with ``--as-json``).

    Returns:
        0.

    Raises:
        StoreUnavailable: the server cannot be reached; Unauthenticated: wrong token.
    """
    from prioreplay.client import PriorityClient

    out = out or sys.stdout
    with PriorityClient(config, max_retries=2) as client:
        d = stats_dict(client.stats(config.buckets))
    if config.as_json:
        print(json.dumps(d, sort_keys=True), file=out)
    else:
        print(format_stats(d), file=out)
    return 0
