"""The learner's publishing cost against its step time, from ``prioreplay demo`` run directories.

Target (issue 15): publish time <= 10% of step time in the CPU demo.

Per run directory: ``learner.jsonl`` (one line per optimizer step: ``compute_s``, ``publish_s``,
``checkpoint_s`` where present, ``wait_s``) and ``logs/learner.log`` (the full checkpoint the
learner writes when it stops: "checkpoint ... in X s"). Figures:

* ``publish_share`` = Σ publish_s / Σ (compute_s + publish_s + checkpoint_s): the learner's own
  work, waiting for groups left out (on 2 cores the learner mostly waits for the one worker);
* ``publish_s_mean``: seconds per publish;
* ``checkpoint_s``: seconds of the full checkpoint (weights + optimizer + scheduler + RNG), written
  every ``checkpoint_every`` steps (and at stop), and its share amortised over ``checkpoint_every``.

Usage: ``python -m benchmarks.publish RUN_DIR [--label NAME] [--checkpoint-every 10] [--out FILE]``.

Weights across nodes (``--fetch MODEL``, ``tiny`` or any ``--model`` name such as ``smollm2-135m``):
one version published as the learner does, then loaded into a worker's transformers backend two
ways, ``--repeats`` times each, medians reported (``weights.<model>.*``):

* ``shared_load_s``: the worker reads the publish directory itself (a shared volume): verify the
  manifest, copy the tensors into the model;
* ``http_fetch_s`` / ``http_load_s`` / ``http_total_s``: no shared path; the learner's HTTP server
  (:func:`prioreplay.weights_transport.serve_published`, loopback) serves it, the worker fetches
  it into its cache and verifies it (:class:`~prioreplay.weights_transport.WeightsFetcher`), then
  the backend loads the cached copy (verified again) as above;
* ``bytes``: the version's size; ``publish_s``: the publish itself, for scale.

Usage: ``python -m benchmarks.publish --fetch tiny --fetch smollm2-135m [--repeats 3] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
from pathlib import Path
from typing import Any

_CKPT_RE = re.compile(r"checkpoint \S+ in ([0-9.]+) s")


def publish_figures(run_dir: str | os.PathLike, checkpoint_every: int = 10) -> dict[str, float]:
    """The figures above for one run directory.

    Raises:
        FileNotFoundError: no learner.jsonl in ``run_dir``.
    """
    run_dir = Path(run_dir)
    lines = [json.loads(x) for x in (run_dir / "learner.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in lines if not r.get("end")]  # the run's end line is not a step
    compute = sum(float(r.get("compute_s") or 0.0) for r in steps)
    publish = sum(float(r.get("publish_s") or 0.0) for r in steps)
    ckpt_in_steps = sum(float(r.get("checkpoint_s") or 0.0) for r in steps)
    log = run_dir / "logs" / "learner.log"
    ckpts = [float(m.group(1)) for m in _CKPT_RE.finditer(log.read_text())] if log.exists() else []
    out = {
        "steps": float(len(steps)),
        "compute_s_mean": compute / len(steps),
        "publish_s_mean": publish / len(steps),
        "publish_share": publish / (compute + publish + ckpt_in_steps),
    }
    if ckpts:
        c = sum(ckpts) / len(ckpts)
        out["checkpoint_s"] = c
        per_step = compute / len(steps) + publish / len(steps)
        out["checkpoint_share_amortised"] = (c / checkpoint_every) / (per_step + c / checkpoint_every)
    return out


def fetch_figures(model: str, repeats: int = 3, workdir: str | os.PathLike | None = None) -> dict[str, float]:
    """The ``--fetch`` figures above for one model (seconds, medians over ``repeats``)."""
    import statistics
    import tempfile
    import time

    from prioreplay import models
    from prioreplay.learner.checkpoint import publish_weights
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
    from prioreplay.tiny_model import make_tiny_model
    from prioreplay.weights_transport import WeightsFetcher, published_uri, serve_published

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp_path = Path(tmp)
        src = make_tiny_model(tmp_path / "tiny", seed=0) if model == "tiny" else models.resolve_model(model)
        lm, tok = models.load_causal_lm(src), models.load_tokenizer(src)
        backend = TransformersBackend(src, device="cpu")
        server = serve_published(tmp_path / "learner", "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rows: dict[str, list[float]] = {k: [] for k in ("publish_s", "shared_load_s", "http_fetch_s", "http_load_s")}
        try:
            for version in range(1, repeats + 1):
                t0 = time.perf_counter()
                path = publish_weights(tmp_path / "learner", version, version, lm, tok)
                rows["publish_s"].append(time.perf_counter() - t0)
                rows["shared_load_s"].append(backend.load_weights(str(path), version))
                fetcher = WeightsFetcher(tmp_path / f"worker-{version}")  # a cold cache each time
                t0 = time.perf_counter()
                local = fetcher.fetch(published_uri(path, url), version)
                rows["http_fetch_s"].append(time.perf_counter() - t0)
                rows["http_load_s"].append(backend.load_weights(str(local), version))
            size = sum(f.stat().st_size for f in path.iterdir())
        finally:
            server.shutdown()
            server.server_close()
    figs = {k: statistics.median(v) for k, v in rows.items()}
    figs["http_total_s"] = figs["http_fetch_s"] + figs["http_load_s"]
    figs["bytes"] = float(size)
    return figs


def record(path: Path, prefix: str, figs: dict[str, float], units: dict[str, str], command: str, note: str) -> None:
    """Replace the figures named ``prefix.<key>`` in the results file ``path`` by ``figs``."""
    results: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    names = {f"{prefix}.{k}" for k in figs}
    results = [r for r in results if r.get("name") not in names]
    for k, v in figs.items():
        results.append(
            {
                "name": f"{prefix}.{k}",
                "value": round(v, 4),
                "unit": units.get(k, "s"),
                "command": command,
                "date": now,
                "machine_cores": os.cpu_count(),
                "note": note,
            }
        )
    path.write_text(json.dumps(results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", nargs="?", help="a demo run directory (the publish share figures)")
    ap.add_argument("--label", default="run", help="name part of the figures: learner.publish.<label>.*")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument(
        "--fetch",
        action="append",
        default=[],
        metavar="MODEL",
        help="measure fetch + load over HTTP beside the shared-volume load for MODEL (tiny, smollm2-135m, ...)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="versions published and loaded per --fetch model")
    ap.add_argument("--command", default="", help="the command that produced the run (recorded)")
    ap.add_argument("--note", default="", help="measurement conditions (recorded)")
    ap.add_argument("--out", default=None, help="append the figures to this results.json (default: print only)")
    a = ap.parse_args(argv)
    if not a.run_dir and not a.fetch:
        ap.error("give a RUN_DIR, or --fetch MODEL")
    out = Path(a.out) if a.out else None
    if a.run_dir:
        figs = publish_figures(a.run_dir, a.checkpoint_every)
        print(json.dumps(figs, indent=1))
        if out:
            units = {"steps": "steps", "publish_share": "fraction", "checkpoint_share_amortised": "fraction"}
            record(out, f"learner.publish.{a.label}", figs, units, a.command, a.note)
    for model in a.fetch:
        figs = fetch_figures(model, a.repeats)
        print(json.dumps({model: figs}, indent=1))
        if out:
            record(out, f"weights.{model}", figs, {"bytes": "bytes"}, a.command, a.note)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
