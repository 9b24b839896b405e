"""Write the page of current benchmark results, ``benchmarks/RESULTS.md``, from ``benchmarks/results.json``.

``results.json`` holds one entry per figure (``name``, ``value``, ``unit``, the ``command`` that
produced it, ``date``, ``machine_cores``, a ``note`` on the conditions, and where measured a 95%
interval ``ci95`` = [low, high]); every benchmark writes its figures there (``python -m
benchmarks.run``, ``benchmarks.decision``, ...). This module turns it into one Markdown page: the
headline figures first, then one section per group of figures (the name's first part) with what
it measures, its commands and every figure. The page is generated, never edited by hand:

    python -m benchmarks.results_page            # rewrite benchmarks/RESULTS.md
    python -m benchmarks.results_page --check    # exit 1 when the committed page is out of date

``tests/unit/project/test_docs.py`` checks that the committed page equals what this writes now.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
PAGE = HERE / "RESULTS.md"

#: The headline figures, in order: (name in results.json, what it says).
HEADLINES: tuple[tuple[str, str], ...] = (
    (
        "compare.mix.heap.useful_tokens_ratio_vs_uniform",
        "real GRPO (SmolLM2-135M, CPU, 5 seeds, equal completion tokens): "
        "heap's useful tokens per completion token over uniform's",
    ),
    (
        "compare.mix.heap.heldout_change_vs_uniform",
        "... and its held-out accuracy after training, minus uniform's (not established)",
    ),
    (
        "sim.heap.rollouts_ratio_vs_uniform",
        "simulated learner: rollouts to the target success rate, heap + retest over uniform (10 seeds)",
    ),
    ("redis.state_bytes_per_problem_1000000", "Redis bytes of statistics and priority per problem, at 10^6 problems"),
    ("redis.register_1000000_s", "registering 10^6 problems over gRPC"),
    ("service.memory.grpc.c8.sampled_per_s", "one server process end to end, memory store, 8 clients, B = 256, G = 8"),
    ("overhead.worker_idle_share", "a pipelined worker's engine idle, share of wall time (CPU, tiny model)"),
    ("overhead.worker_idle_share_sequential", "... the same with --no-pipeline"),
    ("overhead.worker_rpc_share", "CPU demo: worker time in priority RPCs"),
    ("overhead.learner_rpc_share", "CPU demo: learner time in priority RPCs"),
    ("integration.trl.overhead_share", "inside TRL's GRPOTrainer: the integration's share of a tiny-model step"),
    ("overhead.learner_wait_share", "learner waiting for groups with a full queue, prefetch on"),
    ("service.pull_latency_p50_ms", "report queued -> waiting pull answered, p50, slower store"),
    ("replicaacks.added_p50_ms", "--min-replica-acks 1: added to a report of 64 groups, p50"),
    ("failover.promotion_s", "Sentinel failover: primary killed -> replica promoted and serving"),
)

#: Groups of figures by name prefix (the longest matching prefix wins): (prefix, title, how it is measured).
GROUPS: tuple[tuple[str, str, str], ...] = (
    (
        "offpolicy",
        "Off-policy correction: the behaviour/proximal mismatch of real workers",
        "`python -m benchmarks.offpolicy` (docs/OFFPOLICY.md): SmolLM2-135M-Instruct on CPU, the transformers worker in "
        "float32 and in bf16 generates, the learner recomputes the same tokens in float32 at staleness 0 and after 4 "
        "optimizer steps; k3 KL(behaviour || proximal) per token and percentiles of |log w|. One seed: a size, not a comparison.",
    ),
    (
        "offpolicy.run",
        "Off-policy correction: does it pay? none vs tis vs icepop, stale bf16 worker",
        "`prioreplay compare --samplers heap+icepop,heap+tis,heap+none --dtype bfloat16 --max-staleness 4 "
        '--publish-every 4 ...`, then `python -m benchmarks.offpolicy_runs` (docs/OFFPOLICY.md, "Does it pay?"): '
        "arms that differ only by the learner's correction, same model, data, seeds and rollout budget; per arm the mean "
        "over seeds with its 95% t-interval: held-out accuracy at each evaluation, the KL to the reference, gradient "
        "norms, the shares of clipped and non-finite steps, and the held-out difference against `none`.",
    ),
    (
        "vllm",
        "vLLM's CPU build: the real engine beside the worker and the transformers backend",
        "`OMP_NUM_THREADS=1 .venv-vllm/bin/python -m benchmarks.vllm_engine` (docs/VLLM.md): one engine, the same prompts and "
        "sampling settings side by side in one run; backend vs raw engine tokens/s, vLLM vs transformers at G = 8, "
        "in-place reload vs a restart, start-up and peak memory. The load average is in each record's note.",
    ),
    (
        "compare",
        "Real GRPO: the decision rule's runs on a difficulty mix",
        "`prioreplay compare` on `arithmetic:64:0:tiers` (three tiers aimed at all-wrong, mixed and all-right, drawn "
        "with equal chance; measured on the base model's first visit: 66% all-wrong, 33% mixed, 2% all-right, "
        "`mix.arithmetic_tiers.*`), SmolLM2-135M-Instruct on CPU, arms `uniform`, `heap`, `posterior`, `heap-version-retests`, "
        "equal completion tokens (`--rollouts 0 --completion-tokens 16000`), seeds 0-4; then `python -m benchmarks.decision` "
        'applies the decision rule written before the runs (docs/METHOD.md, "How a default is chosen"). `uniform` already drops '
        "zero-variance groups, as DAPO's dynamic sampling does. Useful tokens: completion tokens in mixed groups. Held-out: "
        "128 problems of the mix, greedy, the same per seed for every arm; differences are per seed, mean with a 95% "
        "t-interval across seeds; ratios by paired bootstrap. `pool_misfiled_share`: the pool audit (pooled problems that "
        "would give a mixed group, or are solved, if tested with the final policy).",
    ),
    (
        "method",
        "The method against plain GRPO and DAPO: rollouts to a held-out target",
        '`python -m benchmarks.method` (docs/METHOD.md, "How the figures are measured"): the simulator of `sim.*` with 400 '
        "held-out problems (never trained on; they move by skill transfer only), arms `grpo` (plain GRPO as TRL runs it: "
        "uniform problems, every group in the step, zero-variance groups diluting the token-mean loss), `dapo` (uniform, "
        "zero-variance groups dropped, batches drawn until B mixed groups) and the prioritized samplers, each run for twice "
        "grpo's budget R = 256,000 rollouts with held-out accuracy read at 17 evenly spaced evaluations. "
        "`rollouts_to_target.<arm>_vs_<base>`: the base's rollouts over the arm's to reach the held-out accuracy grpo "
        "reaches at R, interpolated on the curves (> 1: fewer rollouts), `ci_low`/`ci_high` a paired bootstrap over seeds; "
        "`final_at_2x`: held-out accuracy at 2R; `misfiled`: the pool audit at the end. A simulator, not a language model: "
        "it says how the samplers behave under its assumptions, not what a real run gains. `misfiled.demo_<arm>`: the pool "
        "audit of real `prioreplay compare` runs (SmolLM2-135M-Instruct on CPU, the default demo task), pooled over seeds "
        "with a Wilson interval (`python -m benchmarks.method --from-compare DIR`). `warm_start.first_epoch_useful_ratio`: "
        "in the simulator, the first epoch's useful-rollout fraction of a run started from a previous heap run's statistics "
        "shrunk by 0.5, over a cold run's, same population and starting logits (`--warm-start`). "
        "`warm_start.rollouts_to_target_ratio`: the same warm and cold runs each for the full budget R, the cold run's "
        "rollouts over the warm run's to reach the cold run's held-out accuracy at R (9 evaluations to R; > 1: warm needs "
        "fewer), paired bootstrap over seeds. "
        "`warm_start.demo_first_epoch_useful_ratio`: the same on real `prioreplay demo` runs (SmolLM2-135M-Instruct, "
        "one epoch of the default task each), warm from another seed's `prioreplay export-stats`, over cold, per seed "
        "(`--demo-warm-start COLD:WARM ...`). Arms `heap_fresh` and `heap_evidence_fresh_heap`: heap priorities aged "
        "between reports toward the prior's (`--heap-age-decay` 0.95, FreshPER). "
        "Real runs (`prioreplay compare --rollouts 2R --eval-points N`, `--from-compare DIR`): "
        "`rollouts_to_target.demo_<arm>_vs_<base>` reads grpo's held-out accuracy at R off its curve as the target; "
        "`final_at_2x.demo_<arm>` is each arm's accuracy at 2R with its difference to grpo (a plateau); "
        "`power.<arm>_vs_<base>.*` (`python -m benchmarks.power DIR`): the standard deviation over seeds of the paired "
        "held-out difference at each kept version, and the seeds a paired test (alpha 0.05, power 0.8) needs to detect "
        "5 points at the end. "
        "Against `heap` (the default retest "
        "setting): `misfiled_change.<arm>_vs_heap`, the arm's misfiled share minus heap's paired per seed (bootstrap), and "
        "`rollouts_to_target.<arm>_vs_heap`, heap's rollouts over the arm's to grpo's target; arms `heap_retest02` and "
        '`heap_retest03` are `heap` with retest fraction 0.2 and 0.3 (docs/METHOD.md, "What a lower misfiled share costs").',
    ),
    (
        "method.estimator",
        "Is rollouts to target honest? The estimator on simulated identical arms",
        '`python -m benchmarks.estimator` (docs/METHOD.md, "How the figures are measured"): 200 simulated experiments of two '
        "identical arms, each a held-out learning curve to 2R with seed-to-seed spread and the binomial noise of its "
        "held-out evaluations, so the true ratio is 1. `null_median`: the median of the experiment's rollouts-to-target "
        "ratio; `null_coverage`: the share of experiments whose 95% interval covers 1. The bare names are the default "
        "estimator of `prioreplay compare` (each seed's target the mean of grpo's accuracy at R over its other seeds; the "
        "geometric mean of per-seed ratios with a t-interval of the mean log ratio); `fixed.*`: a held-out accuracy fixed "
        "before the runs, the same ratio and interval; `old.*`: grpo's own accuracy at R as the target with a paired "
        "percentile bootstrap, the estimator of the earlier real-run figures, which favours the baseline. Without "
        "`demo.`: 6 seeds and 256 held-out problems at 9 points; `demo.*`: 3 seeds, 64 problems and 7 points, the design "
        "of the first real comparison.",
    ),
    (
        "method.sim_vs_real",
        "The simulator's prediction for a real comparison, to set beside the real runs",
        '`python -m benchmarks.sim_vs_real --protocol P --seeds 40` (docs/METHOD.md, "How the figures are measured"): a '
        "real `prioreplay compare` rebuilt in the simulator with the real learner's model (a trajectory queue, a step of 4 "
        "groups per 2 leases' generation time, groups more than 4 versions old dropped, generation paced at K learner "
        "batches or not, Adam-like steps), read as compare reads it (each seed's target grpo's mean held-out accuracy at R "
        "over its other seeds; geometric mean of per-seed ratios with a t-interval of the log ratio). "
        "`<arm>.predicted`: the arm's rollouts to target against grpo (value; 1 for grpo) with `vs_dapo` beside it, "
        "`ci95` over the 40 simulated seeds and `real_seeds_ci95` the interval a real comparison of the protocol's seeds "
        "would show around the same centre, and `trained_share`/`stale_share` of the groups queued for the learner. "
        "Bare names: the `decision` protocol (512 problems of arithmetic's `tiers` set, G = 4, B = 8, 4 groups a step, "
        "2R = 3,072 rollouts, 9 evaluations of 256 problems, 6 real seeds, paced K = 1); `demo.*`: the first real "
        "comparison (64 easy problems, 2R = 768, 7 evaluations of 64 problems, 3 seeds, unpaced); `*_exact.*`: the same "
        "with the held-out accuracy read without evaluation noise (the learning dynamics alone; `demo_paced_exact`: the "
        "demo paced at K = 1). `<arm>` without `.predicted` (`--measured compare.json`): a real comparison's measured "
        "ratios beside the prediction, both with their intervals.",
    ),
    (
        "sim",
        "Simulated learner: the paper's samplers",
        "`benchmarks/simulate.py` drives the real `MemoryStore` (its samplers, pools and statistics) with latent success "
        "logits in place of a language model: 2,000 problems in 40 skills, a U-shaped pass-rate distribution, G = 8, "
        "B = 64, a group's update equal to its p(1 - p), forgetting of 0.002 logit per untrained step, target mean pass@1 "
        "0.65, budget 256,000 rollouts; 10 paired seeds, 95% percentile-bootstrap intervals. The figures do not depend on "
        "timing.",
    ),
    (
        "samplers",
        "Simulated learner: samplers beyond the paper, four populations",
        "As `sim.*`, every sampler of the registry on four populations (`default`; `hard`: mean logit -2; `forgetting`: "
        "3x the forgetting; `dilute`: zero-variance groups dilute the step), 10 paired seeds; names "
        "`samplers.<population>.<method>.<metric>`; ratios per seed then summarized; a seed that misses the target is "
        "left out of a ratio (`reached`).",
    ),
    (
        "retests_by_version",
        "Simulated learner: retests that follow the policy version",
        "As `samplers.*` on the `forgetting` population: `heap` against `--retest-versions` k = 1 and 4.",
    ),
    (
        "calib",
        "The simulator fitted to real runs",
        "`benchmarks/calibrate.py` fits the simulator's model (per-problem and shared learning rates, forgetting) to the "
        "per-problem histories (`outcomes.jsonl`, the learner's `trained_groups`) of two real demo runs by maximum "
        "likelihood, then projects heap against uniform at 10,000 problems.",
    ),
    (
        "service",
        "Service throughput and latency",
        "100,000 problems registered; C concurrent clients each loop SampleProblems(B = 256) -> ReportOutcomes with "
        "G = 8 completions of 16 tokens (random rewards, about 2/3 of the groups mixed) against a `prioreplay server` "
        "subprocess (heap, memory store or Redis 7 on localhost); 2 s warm-up, 10 s measured. The ceiling (`inprocess`) is "
        "the same loop issued directly to the store, without gRPC; `--rounds` times, each C's gRPC row and then its ceiling "
        "row (interleaved), so each ratio (`e2e_over_ceiling_*`) is a mean of per-round pairs with a 95% interval and "
        "the load average noted; `server_cpu_us_per_problem`: the server process tree's CPU per problem sampled. "
        "`service.pull_latency.*`: a learner waiting in "
        "PullTrajectories while a worker reports one mixed group; from the store accepting the report to the pull "
        "answering, `woken` (the server now) against `polled` (the former sleep loop).",
    ),
    (
        "scale",
        "Several server processes, the lean report path, open-loop latency",
        "As `service.*` with `--processes 1,2`, a lean benchmark client (reports built as bytes), `reportpath`: report "
        "handling without the store, `openloop`: requests at a fixed rate; `beforeafter`: the same client against a server "
        "before and after the lean report path. Measured on a heavily shared 2-core machine: read the ratios and the CPU "
        "time per problem, not the absolute rates.",
    ),
    (
        "redis",
        "Redis memory and registration at 10^6 problems",
        "`MEMORY USAGE key SAMPLES 0` of the run's keys (statistics and priority apart from the prompts), the `INFO memory` "
        "delta, and the time to register 10^6 problems through RegisterProblems in chunks of 2,000.",
    ),
    (
        "replicaacks",
        "The cost of --min-replica-acks on the report path",
        "A Redis primary and one replica on local ports; the Redis store leases 64 problems and reports them (8 rewards "
        "each, with a payload) 200 times with `min_replica_acks` 0 and 200 times with 1, in interleaved blocks of 50. One "
        "run, no interval.",
    ),
    (
        "failover",
        "A Redis failover under load",
        "A primary, two replicas and one sentinel (quorum 1, `down-after-milliseconds 1000`) on local ports; one client "
        "reports in a loop through `--store redis+sentinel://...`; the primary is SIGKILLed after 20 acknowledged reports "
        "(3 runs per setting). These runs lost nothing; a planned `SENTINEL FAILOVER` did: docs/GUARANTEES.md, "
        '"Known limits".',
    ),
    (
        "failover.lost",
        "Acknowledged reports lost in a Redis failover, per fault and --min-replica-acks",
        "`python -m benchmarks.failover_loss`: a primary, two replicas and three sentinels (quorum 2, "
        "`down-after-milliseconds 1000`) on local ports; the gRPC server on `redis+sentinel://` with the setting; three "
        "clients lease and report at full rate (a report is resent while UNAVAILABLE); one fault once 30 reports are "
        "acknowledged; the run ends 30 acknowledgements after the recovery. Then every acknowledged report is looked up "
        "on the new primary. `failover.lost.<fault>.<setting>`: the most lost in a run (`min` and each run beside it); "
        "`.acknowledged`, `.no_service_s` (the longest gap between two acknowledgements): medians.",
    ),
    (
        "sampler_cost",
        "Sampler cost in the service",
        "One client, SampleProblems(256) -> ReportOutcomes over gRPC to a server holding 100,000 problems, 10 s after 2 s "
        "of warm-up, per sampler and store, beside the main branch before and after (`--baseline-pythonpath`).",
    ),
    (
        "overhead",
        "Overhead of the service in a training step",
        "`benchmarks/overhead.py`. `*_rpc_share`: from a CPU demo run, time in priority RPCs over the role's step time "
        "(a learner's pull wait measures starvation and is left out). `worker_idle_share`: one worker (tiny model, CPU) "
        "against an in-process server, wall time outside the backend's generate, pipelined and `--no-pipeline` alternating "
        "(3 pairs, t-interval). `learner_wait_share*` (`benchmarks/learner_overlap.py`): a learner on the tiny model with "
        "every group queued before the first step, prefetch on and off, 8 blocks of 10 steps; `learner_publish_stall_share*`: "
        "the same with `--background-publish` and without.",
    ),
    (
        "pacing",
        "The pace bound on a fleet: idle workers against stale groups",
        '`python -m benchmarks.pacing` (docs/USAGE.md, "Pacing"): a real in-process server (memory store, '
        "`--pace-batches K`, K = 0: no bound) with 8 simulated workers (leases of 4, 0.4 s to generate one) and a "
        "simulated learner (batches of 8, dropping groups more than 4 versions old) on threads, 5 s per run. "
        "`pacing.r<r>.k<K>.*`: r = fleet production / learner consumption (2: the learner slower, 0.5: faster). "
        "`worker_wait_share`: worker time held by the bound; `stale_share`: stale / pulled; `trained_share`: "
        "trained / generated; `staleness_mean`: versions, trained groups. Each figure is the mean of `--rounds` "
        "repeats of its run with a 95% t-interval (the runs are timed, not seeded), on a 2-core machine.",
    ),
    (
        "integration",
        "What the TRL integration adds to a GRPOTrainer step",
        "`benchmarks/integration.py`: TRL's GRPOTrainer on the tiny model (CPU), TRL's own sampling against "
        "`PriorityGRPOTrainer` with a `prioreplay server` process, same data, seed and settings, 10 steps a run, 3 runs "
        "per arm alternating. `overhead_share`: the integration's own time over the same run's `train_runtime`. "
        "`integration.trl.compare.*`: `make compare-trl`, 60 steps x B = 4 x G = 4 on SmolLM2-135M, 3 seeds.",
    ),
    (
        "learner",
        "Publishing a version apart from checkpointing",
        "`prioreplay demo --steps 6 --eval-size 0` then `python -m benchmarks.publish RUN`: publish seconds over the "
        "learner's own work (compute + publish + checkpoint), per variant; one run each on a shared machine.",
    ),
    (
        "weights",
        "Weights over HTTP beside a shared volume",
        "`python -m benchmarks.publish --fetch MODEL`: one version published as the learner does, loaded into a worker's "
        "transformers backend from the publish directory, and fetched over the learner's HTTP server into a cold cache "
        "and loaded from there; 5 versions, medians; loopback, one disk.",
    ),
    (
        "real",
        "Real GRPO on CPU, the first run (heap vs uniform)",
        "`prioreplay demo --sampler heap` and `--sampler uniform` with the demo defaults of that time (`arithmetic:512`, "
        "10 learner steps), one seed: too short to tell the samplers apart.",
    ),
    (
        "mix",
        "The multi-task mix `mix:smollm2-tails`: first-visit groups of SmolLM2-135M-Instruct per task",
        "`python -m benchmarks.passrate --dataset mix:smollm2-tails` before any sampler runs: G completions of every "
        "problem with the base model at the demo's temperature, stop and token limit; the shares of all-wrong, mixed and "
        'all-right groups over the mix and per task (`task.<task>.*`). docs/USAGE.md, "Multi-task mixes".',
    ),
    (
        "demo_defaults",
        "The demo's defaults: pass rate of SmolLM2-135M-Instruct on generated arithmetic",
        "`python -m benchmarks.passrate` per level, prompt style and stop: the model's pass rate, from which the demo's "
        "easy set and budget were chosen (problems revisited, so prioritizing has something to act on).",
    ),
    (
        "demo_compare",
        "`prioreplay compare`, heap vs uniform on the easy set",
        "`make compare` (and smaller sets, `demo_compare_32*`, `demo_compare` = 16 problems): heap and uniform per seed "
        "at one rollout budget; effective-group fraction, useful rollouts and held-out changes with intervals, and the "
        "effective-group-fraction ratio with a paired bootstrap interval across seeds.",
    ),
)


def _fmt(value: float | int | None) -> str:
    """A figure as text: whole numbers and numbers of 1,000 or more without decimals (thousands
    separated), other numbers to 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _interval(entry: dict) -> str:
    ci = entry.get("ci95")
    if not ci or len(ci) != 2 or ci[0] is None or ci[1] is None:
        return ""
    return f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def group_of(name: str) -> str:
    """The prefix in :data:`GROUPS` that ``name`` belongs to (the longest that matches), or its first part."""
    best = ""
    for prefix, _title, _how in GROUPS:
        if (name == prefix or name.startswith(prefix + ".") or name.startswith(prefix + "_")) and len(prefix) > len(best):
            best = prefix
    return best or name.split(".", 1)[0]


def _table(rows: Iterable[dict], strip: str = "") -> list[str]:
    lines = ["| figure | value | 95% interval | unit |", "| --- | ---: | --- | --- |"]
    for e in rows:
        name = e["name"][len(strip) :] if strip and e["name"].startswith(strip) else e["name"]
        lines.append(f"| `{_cell(name)}` | {_fmt(e.get('value'))} | {_interval(e)} | {_cell(e.get('unit', ''))} |")
    return lines


def render(entries: list[dict]) -> str:
    """The page for ``entries`` (the list in results.json), as Markdown text ending in a newline.

    Raises:
        KeyError: a name in :data:`HEADLINES` is not among ``entries`` (rename it there).
    """
    by_name = {e["name"]: e for e in entries}
    out = [
        "# Current benchmark results",
        "",
        "<!-- Generated by `python -m benchmarks.results_page` from benchmarks/results.json; do not edit. -->",
        "",
        f"Every figure in `benchmarks/results.json` ({len(entries):,} of them), generated by "
        "`python -m benchmarks.results_page`; `tests/unit/project/test_docs.py` checks that this page is current. "
        "Each section says how its figures are measured and gives the commands that produced them "
        "(`SCRATCH_DIR`, `RUN`, `MAIN` and `runs/...` stand for directories of the run). Most were measured on "
        "a 2-core machine, often shared with other jobs (each command's note says): read ratios measured side by side, "
        "not absolute times. The method behind the figures: [docs/METHOD.md](../docs/METHOD.md); how to rerun them: "
        "[docs/DEVELOPMENT.md](../docs/DEVELOPMENT.md).",
        "",
        "## Headlines",
        "",
        "| what | value | 95% interval | unit | figure |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for name, what in HEADLINES:
        e = by_name[name]
        out.append(f"| {_cell(what)} | {_fmt(e.get('value'))} | {_interval(e)} | {_cell(e.get('unit', ''))} | `{name}` |")
    grouped: dict[str, list[dict]] = {}
    for e in entries:
        grouped.setdefault(group_of(e["name"]), []).append(e)
    titles = {prefix: (title, how) for prefix, title, how in GROUPS}
    order = [p for p, _t, _h in GROUPS if p in grouped] + sorted(p for p in grouped if p not in titles)
    for prefix in order:
        rows = sorted(grouped[prefix], key=lambda e: e["name"])
        title, how = titles.get(prefix, (prefix, ""))
        out += ["", f"## {title} (`{prefix}.*`)", ""]
        if how:
            out += [how, ""]
        runs: dict[tuple[str, str], list[str]] = {}
        for e in rows:
            runs.setdefault((e.get("command", ""), e.get("note", "")), []).append(e.get("date", "")[:10])
        out.append("Commands:")
        out.append("")
        for (command, note), dates in sorted(runs.items(), key=lambda kv: (min(kv[1]), kv[0])):
            when = min(dates) if min(dates) == max(dates) else f"{min(dates)} to {max(dates)}"
            shown = _cell(command)
            shown = f"`{shown}`" if "`" not in shown else shown  # a command that quotes code is shown as prose
            line = f"- {shown} ({when}, {len(dates)} figures)"
            if note:
                line += f": {_cell(note)}"
            out.append(line)
        out += ["", f"<details><summary>{len(rows)} figures</summary>", ""]
        out += _table(rows, strip=prefix + ".")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the page; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="results.json to read")
    parser.add_argument("--out", type=Path, default=PAGE, help="page to write")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs from the page")
    args = parser.parse_args(argv)
    text = render(json.loads(args.results.read_text(encoding="utf-8")))
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m benchmarks.results_page", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
