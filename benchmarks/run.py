"""``python -m benchmarks.run`` (``make bench``): run the benchmarks, write results.json and plots.

Parts (docs/METHOD.md says how each is measured; benchmarks/RESULTS.md shows every figure):
  service   1. throughput and latency of the gRPC service vs the in-process ceiling, both stores
               (``--processes 1,2``: also 2 server processes on Redis); Redis memory per problem
               and time to register 10^6 problems
  openloop  1b. open-loop latency at fixed offered loads (not in the default parts)
  reportpath 1c. ReportOutcomes handling, per-field vs lean path (not in the default parts)
  replicaacks 1d. the report path's cost of --min-replica-acks 1 (Redis WAIT; not in the default parts)
  pulllatency 1f. report-to-learner latency of a waiting pull, polled vs woken (not in the default parts)
  simulate  2. learning efficiency of the samplers in a simulated GRPO learner (many seeds)
  samplers  2b. the samplers beyond the paper in four populations, paired seeds
  calibrate 2c. the simulator fitted to real runs' outcome histories (``--calib-runs``), then
               uniform vs heap projected at ``--project-problems`` (not in the default parts)
  overhead  4. priority-RPC share of the worker's and learner's step time, from a demo run dir
  integration 5. what the TRL integration adds to a GRPOTrainer step (tiny model, CPU)
  --real    3. real GRPO on CPU, heap vs uniform (``prioreplay demo``; long; off by default)

``--quick`` runs tiny versions of each part in seconds and writes nothing unless ``--out`` or
``--plot-dir`` is given. Every figure written to ``results.json`` carries its name, value, unit,
the command that produced it, the date and the machine's core count.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.results import DOCS, REPO, RESULTS, Results
from benchmarks.results import log as _log
from benchmarks.service_figures import part_openloop, part_pulllatency, part_replicaacks, part_reportpath, part_service

SHARED_NOTE = ""  # set with --note, e.g. what else ran on the machine during the measurement


# -- part 2b: the samplers beyond the paper across populations-------------------------------
#: (key, unit) of the per-method figures of part 2b, in the order written.
SAMPLER_FIGURES = (
    ("rollouts_to_target", "rollouts"),
    ("effective_group_fraction", "fraction"),
    ("useful_rollout_fraction", "fraction"),
    ("final_success", "pass@1"),
    ("probes", "groups"),
    ("rollouts_ratio_vs_uniform", "ratio"),
    ("rollouts_ratio_vs_heap", "ratio"),
    ("efg_ratio_vs_uniform", "ratio"),
    ("pool_misfiled_share", "fraction"),
    ("misfiled_change_vs_heap", "fraction"),
)
#: (key, unit) of the per-method figures of part 2.
SIM_FIGURES = (
    ("rollouts_to_target", "rollouts"),
    ("effective_group_fraction", "fraction"),
    ("final_success", "pass@1"),
    ("forgetting_events", "events"),
    ("breakthroughs", "events"),
    ("forgotten_at_end", "problems"),
    ("rollouts_ratio_vs_uniform", "ratio"),
    ("efg_ratio_vs_uniform", "ratio"),
)


def add_method_figures(res: Results, prefix: str, r: dict[str, Any], figures: tuple[tuple[str, str], ...]) -> None:
    """``<prefix>.<method>.<key>`` for each method of a simulation result ``r`` and each of
    ``figures`` it has: the mean, with its 95% interval, n, seeds and whether it reached the target."""
    for name, m in r["methods"].items():
        for key, unit in figures:
            if key in m:
                s = m[key]
                res.add(
                    f"{prefix}.{name}.{key}",
                    s["mean"],
                    unit,
                    ci95=[s["lo"], s["hi"]],
                    n=s["n"],
                    seeds=len(r["seeds"]),
                    reached=m["reached"],
                )


def part_samplers(args: argparse.Namespace, res: Results) -> dict[str, Any]:  # type: ignore[return]  # every branch returns or raises
    """Every candidate sampler against ``heap`` and ``uniform`` in each population of
    ``simulate.POPULATIONS``, paired seeds; figures ``samplers.<population>.<method>.<metric>``."""
    from benchmarks import simulate

    out = {}
    names = [m.strip() for m in args.methods.split(",")] if args.methods else None
    methods = [
        m
        for m in (*simulate.METHODS, *simulate.CANDIDATES)
        if (m.name in names if names else m.name in ("uniform", "heap") or m in simulate.CANDIDATES)
    ]
    pops = ["default"] if args.quick else args.populations.split(",")
    for v in pops:
        params = simulate.quick_params() if args.quick else replace(simulate.SimParams(), **simulate.POPULATIONS[v])
        seeds = range(args.seeds if args.seeds else (2 if args.quick else 10))
        r = simulate.run_simulation(params, seeds, methods=methods, progress=_log)
        out[v] = r
        add_method_figures(res, f"samplers.{v}", r, SAMPLER_FIGURES)
        res.add(f"samplers.{v}.wall_s", r["wall_s"], "s", params=r["params"])


# -- part 2 -----------------------------------------------------------------------------------
SIM_VARIANTS = {
    "default": {},
    # sensitivity: a harder dataset for the model (mean logit −2: about half the problems start below 10%)
    "hard": {"logit_mean": -2.0, "target_success": 0.45},
}


def part_simulate(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    from benchmarks import simulate

    out = {}
    variants = ["default"] if args.quick else args.sim_variants.split(",")
    for v in variants:
        params = simulate.quick_params() if args.quick else simulate.SimParams()
        if not args.quick:
            params = replace(params, **SIM_VARIANTS[v])  # type: ignore[arg-type]  # the keyword dict holds exactly the callee's fields
        seeds = range(args.seeds if args.seeds else (2 if args.quick else 20))
        plot = str(Path(args.plot_dir) / f"bench_simulation{'' if v == 'default' else '_' + v}.png") if args.plot_dir else None
        r = simulate.run_simulation(params, seeds, plot_path=plot, progress=_log)
        if "plot_error" in r:
            res.plot_errors.append(r["plot_error"])
        out[v] = r
        pre = "sim" if v == "default" else f"sim_{v}"
        add_method_figures(res, pre, r, SIM_FIGURES)
        res.add(f"{pre}.wall_s", r["wall_s"], "s", params=r["params"])
    return out


# -- part 2c: the simulator calibrated to real runs --------------------------------------------
#: Projections of part 2c: name -> (θ terms kept from the fit, SimParams batch_size, forget_scale,
#: epochs). "fitted": every fitted term, leases of 8 as the demo's, a simulated step one of the
#: runs' steps; "problem_only": the per-visit learning alone (transfer and drift set to 0), B = 64.
PROJECTIONS: dict[str, tuple[tuple[str, ...], int, float, float]] = {
    "fitted": (("lr_skill", "forget_drift"), 8, 1.0, 10.0),
    "problem_only": ((), 64, 1.0, 50.0),
}


def part_calibrate(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Part 2c: fit the simulator to the outcome histories of ``--calib-runs`` (``--quick``: to a
    simulated run with known parameters), then project uniform vs heap at ``--project-problems``."""
    from benchmarks import calibrate, simulate

    if args.quick:
        truth = replace(simulate.quick_params(), n_skills=1, skill_sd=0.0, group_size=4)
        rows, trained = calibrate.synthetic_rows(truth, simulate.METHODS[0], 0), {}
        resamples, sizes, seeds = 3, [400], range(1)
    else:
        if not args.calib_runs:
            raise SystemExit("calibrate: give --calib-runs DIR,DIR (run directories with outcomes.jsonl)")
        dirs = [Path(d) for d in args.calib_runs.split(",")]
        rows, trained = calibrate.read_outcomes(dirs), calibrate.read_trained(dirs)
        resamples, sizes = args.resamples, [int(n) for n in args.project_problems.split(",")]
        seeds = range(args.seeds if args.seeds else 5)
    fit = calibrate.calibrate(calibrate.build_histories(rows, trained), resamples)
    extra = {
        "runs": fit["runs"],
        "trained_from_learner_log": sorted(trained),
        "groups": fit["groups"],
        "problems": fit["problems"],
        "resamples": resamples,
    }
    for name, value in fit["theta"].items():
        res.add(f"calib.fit.{name}", value, "logits" if "logit" in name else "logits per unit", ci95=fit["ci95"][name], **extra)
    if math.isfinite(fit["corr_lr_skill_forget"]):  # NaN when η_z is held fixed
        corr = fit["corr_lr_skill_forget"]
        res.add("calib.fit.corr_lr_skill_forget", corr, "correlation", how="over bootstrap fits", **extra)
    ho = fit["held_out"]
    how = "fit on a random half of the problems, log-likelihood per group of the other half, fitted minus defaults"
    res.add(
        "calib.fit.held_out_gain",
        ho["gain"],
        "nats/group",
        fitted=ho["fitted_nats_per_group"],
        default=ho["default_nats_per_group"],
        held_out_groups=ho["groups"],
        how=how,
    )
    res.add("calib.fit.check", None, "", by_visit=fit["check"], by_visit_default=fit["check_default"])
    projections: dict[str, Any] = {}
    chosen = args.projections.split(",") if args.projections else list(PROJECTIONS)
    for variant, (kept, batch, scale, epochs) in ((v, PROJECTIONS[v]) for v in chosen):
        theta = dict(fit["theta"])
        theta.update({k: 0.0 for k in ("lr_skill", "forget_drift") if k not in kept})
        for n in sizes:
            t = calibrate.projection_target(fit["theta"])
            r = calibrate.project(theta, n, 1.0 if args.quick else epochs, seeds, t, batch_size=batch, forget_scale=scale)
            projections[f"{variant}.{n}"] = r
            add_method_figures(res, f"calib.project.{variant}.n{n}", r, SIM_FIGURES)
            res.add(f"calib.project.{variant}.n{n}.wall_s", r["wall_s"], "s", params=r["params"])
            _log(f"calibrate: {variant} n={n} done ({r['wall_s']:.0f} s)")
    return {"fit": fit, "projections": projections}


# -- part 4 -----------------------------------------------------------------------------------
def part_overhead(args: argparse.Namespace, res: Results) -> dict[str, Any] | None:
    from benchmarks import overhead

    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is None:
        cands = sorted((REPO / "runs").glob("*/report.json"), key=lambda p: p.stat().st_mtime)
        run_dir = cands[-1].parent if cands else None
    if run_dir is None:
        _log("overhead: no demo run directory (pass --run-dir or run `prioreplay demo` first); skipped")
        return None
    out = overhead.rpc_share(run_dir)
    for role in ("worker", "learner"):
        if out[role]:
            res.add(f"overhead.{role}_rpc_share", out[role]["share"], "fraction", run_dir=run_dir.name, **out[role])
    _log(f"overhead: {json.dumps(out)}")
    return out


# -- part 5 -----------------------------------------------------------------------------------
def part_integration(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    from benchmarks import integration

    params = integration.QUICK if args.quick else integration.IntegrationParams()
    out = integration.run_trl_overhead(params, progress=_log)
    p = out["params"]
    res.add(
        "integration.trl.overhead_share",
        out["share"],
        "fraction",
        params=p,
        how="(lease + report seconds of PrioritySampler) / train_runtime, prioreplay arm",
    )
    res.add("integration.trl.lease_ms_per_step", out["lease_ms_per_step"], "ms", params=p)
    res.add("integration.trl.report_ms_per_step", out["report_ms_per_step"], "ms", params=p)
    for arm, s in out["step_s"].items():
        res.add(f"integration.trl.step_s.{arm}", s, "s", params=p, how="median over repeats of train_runtime / steps")
    r = out["step_ratio"]
    res.add(
        "integration.trl.step_ratio",
        r["mean"],
        "ratio",
        min=r["min"],
        max=r["max"],
        repeats=p["repeats"],
        how="prioreplay / trl step time, paired by repeat (noisy on a shared machine)",
    )
    for k, v in out["bare_rpc_ms"].items():
        res.add(
            f"integration.trl.bare_{k}_ms",
            v,
            "ms",
            rounds=p["rpc_rounds"],
            how="SampleProblems(B) / rewards-only ReportOutcomes round trips, no training running",
        )
    return out


# -- part 3: real GRPO (long; only with --real or --real-from) ------------------------------------
def real_grpo(
    run_root: Path,
    extra_args: list[str] | None = None,
    samplers: tuple[str, ...] = ("heap", "uniform"),
    res: Results | None = None,
) -> dict[str, Any]:
    """Part 3, real GRPO on CPU: run ``prioreplay demo`` once per sampler (only with ``--real``).

    Runs ``prioreplay demo --sampler S --run-dir RUN_ROOT/S`` for each sampler (same seed and
    settings otherwise), then reads each ``report.json``: held-out accuracy before/after, the
    final effective-group fraction, forgetting events, and the RPC share of the step (part 4).

    Args:
        run_root: folder that receives one run directory per sampler.
        extra_args: more ``prioreplay demo`` flags (e.g. ``["--steps", "40"]``), the same for both.
    """
    for s in samplers:
        run_dir = run_root / s
        cmd = [
            sys.executable,
            "-m",
            "prioreplay.apps.cli",
            "demo",
            "--sampler",
            s,
            "--run-dir",
            str(run_dir),
            *(extra_args or []),
        ]
        _log(f"real: {' '.join(cmd[1:])}")
        subprocess.run(cmd, check=True)
    return collect_real(run_root, samplers, res)


def collect_real(run_root: Path, samplers: tuple[str, ...] = ("heap", "uniform"), res: Results | None = None) -> dict[str, Any]:
    """Read the ``report.json`` of finished demo runs ``RUN_ROOT/<sampler>`` (part 3 and 4 figures).

    Raises:
        FileNotFoundError: a sampler's run directory has no report.json.
    """
    out: dict[str, Any] = {}
    for s in samplers:
        run_dir = run_root / s
        rep = json.loads((run_dir / "report.json").read_text())
        from benchmarks import overhead

        out[s] = {
            "accuracy_before": rep.get("accuracy_before"),
            "accuracy_after": rep.get("accuracy_after"),
            "effective_group_fraction": rep.get("final", {}).get("effective_group_fraction"),
            "forgetting_events": rep.get("forgetting_events"),
            "duration_s": rep.get("duration_s"),
            "completions": rep.get("final", {}).get("completions_reported"),
            "groups_mixed": rep.get("final", {}).get("groups_mixed"),
            "overhead": overhead.rpc_share(run_dir),
        }
        if res is not None:
            for k in ("accuracy_before", "accuracy_after", "effective_group_fraction"):
                res.add(f"real.{s}.{k}", out[s][k], "fraction", run_dir=str(run_dir.name))
            res.add(f"real.{s}.completions", out[s]["completions"], "rollouts", run_dir=str(run_dir.name))
            ov = out[s]["overhead"]
            if ov.get("worker"):
                res.add(f"overhead.{s}.worker_rpc_share", ov["worker"]["share"], "fraction", run_dir=str(run_dir.name))
            if ov.get("learner"):
                res.add(f"overhead.{s}.learner_rpc_share", ov["learner"]["share"], "fraction", run_dir=str(run_dir.name))
    return out


#: The parts of ``--parts`` by name, in the order they run.
PARTS: dict[str, Callable[[argparse.Namespace, Results], Any]] = {
    "simulate": part_simulate,
    "samplers": part_samplers,
    "calibrate": part_calibrate,
    "service": part_service,
    "reportpath": part_reportpath,
    "replicaacks": part_replicaacks,
    "openloop": part_openloop,
    "pulllatency": part_pulllatency,
    "overhead": part_overhead,
    "integration": part_integration,
}


def run_parts(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Run the parts named in ``--parts`` (in a fixed order), then part 3 if asked; returns each part's summary."""
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    summary: dict[str, Any] = {}
    for name, part in PARTS.items():  # a fixed order, whatever the order of --parts
        if name in parts:
            summary[name] = part(args, res)
    if args.real_from:
        summary["real"] = collect_real(Path(args.real_from), res=res)
    elif args.real:
        summary["real"] = real_grpo(REPO / "runs" / "bench-real", args.real_args.split() or None, res=res)
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.run``: which parts to run and their sizes."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny versions of every part (seconds)")
    ap.add_argument("--prefix", default="", help="prepended to every figure name (keeps a side run's figures apart)")
    ap.add_argument("--note", default=SHARED_NOTE, help="a note stored with every figure (measurement conditions)")
    ap.add_argument(
        "--parts",
        default="service,simulate,overhead,integration",
        help="comma-separated: service, simulate, samplers, calibrate, overhead, integration, openloop, reportpath, "
        "replicaacks, pulllatency",
    )
    ap.add_argument("--real", action="store_true", help="also part 3: two `prioreplay demo` runs (long)")
    ap.add_argument("--real-args", default="", help="extra `prioreplay demo` flags for --real, one string")
    ap.add_argument(
        "--real-from", default=None, help="read part 3 from finished runs DIR/heap and DIR/uniform instead of running them"
    )
    ap.add_argument("--stores", default="memory,redis", help="stores of part 1")
    ap.add_argument("--processes", default="1", help="part 1 / openloop: server process counts, e.g. 1,2 (>1: Redis)")
    ap.add_argument("--open-loads", default="1,2,4,6,8,10", help="openloop: multiples of the base offered load")
    ap.add_argument("--open-workers", type=int, default=64, help="openloop: simulated workers at load 1")
    ap.add_argument("--open-period-s", type=float, default=10.0, help="openloop: seconds between a worker's leases")
    ap.add_argument("--redis-url", default=None, help="Redis of part 1 (default PRIOREPLAY_BENCH_REDIS_URL or local)")
    ap.add_argument("--server", choices=("subprocess", "inprocess"), default=None, help="how part 1 runs the server")
    ap.add_argument("--duration-s", type=float, default=None, help="measured seconds per part-1 configuration")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="part 1: interleaved rounds (each C's gRPC rows then its in-process row, repeated): every figure is the "
        "rounds' mean with a 95%% t-interval (default 3)",
    )
    ap.add_argument("--no-big-register", action="store_true", help="skip the 10^6-problem Redis test")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per method in part 2 (default 20; quick 2)")
    ap.add_argument("--sim-variants", default="default,hard", help="part-2 populations: default, hard")
    ap.add_argument(
        "--populations", default="default,hard,forgetting,dilute", help="part samplers: populations of simulate.POPULATIONS"
    )
    ap.add_argument("--methods", default=None, help="part samplers: method names (default uniform, heap and every candidate)")
    ap.add_argument("--calib-runs", default=None, help="part calibrate: run directories with outcomes.jsonl, comma-separated")
    ap.add_argument("--resamples", type=int, default=200, help="part calibrate: bootstrap resamples over problems")
    ap.add_argument("--project-problems", default="10000", help="part calibrate: population sizes of the projection")
    ap.add_argument("--projections", default=None, help="part calibrate: names of run.PROJECTIONS (default all)")
    ap.add_argument("--run-dir", default=None, help="demo run directory for part 4 (default: newest runs/*)")
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results.json; quick: none)")
    ap.add_argument("--plot-dir", default=None, help="where PNGs go (default docs/; quick: none)")
    return ap


def prepare_outputs(out: str | None, plot_dir: str | None) -> None:
    """Make the output folders before anything is measured: ``plot_dir`` and the folder of the
    results file ``out`` are created when missing (a measurement of minutes must not end in a
    FileNotFoundError).

    Raises:
        SystemExit: a path is taken by a file, or a folder cannot be created (the message names it).
    """
    for folder, what in ((Path(plot_dir) if plot_dir else None, "--plot-dir"), (Path(out).parent if out else None, "--out")):
        if folder is None:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"benchmarks.run: {what}: cannot create the folder {folder} ({e}); give a writable folder") from None


def main(argv: list[str] | None = None) -> int:
    """Run the parts, print the figures and write them (also those measured before a part failed).

    Returns 0, or 1 when a plot failed (its error is logged; every figure is still written).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from benchmarks.service_load import DEFAULT_REDIS_URL

    args.redis_url = args.redis_url or DEFAULT_REDIS_URL
    if not args.quick:
        args.out = args.out or str(RESULTS)
        args.plot_dir = args.plot_dir or str(DOCS)
    prepare_outputs(args.out, args.plot_dir)
    res = Results("python -m benchmarks.run" + (" " + " ".join(argv) if argv else ""), note=args.note, prefix=args.prefix)
    try:
        run_parts(args, res)
    finally:  # a part that raised keeps the figures of the parts before it
        for item in res.items:
            v = item["value"]
            print(f"{item['name']:<60} {v if not isinstance(v, float) else round(v, 4)!s:>14} {item['unit']}")
        if args.out:
            res.write(Path(args.out))
            _log(f"wrote {len(res.items)} figures to {args.out}")
    for error in res.plot_errors:
        _log(f"plot failed: {error}")
    return 1 if res.plot_errors else 0


if __name__ == "__main__":
    sys.exit(main())
