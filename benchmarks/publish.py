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
    steps = [json.loads(x) for x in (run_dir / "learner.jsonl").read_text().splitlines() if x.strip()]
    compute = sum(float(r.get("compute_s") or 0.0) for r in steps)
    publish = sum(float(r.get("publish_s") or 0.0) for r in steps)
    ckpt_in_steps = sum(float(r.get("checkpoint_s") or 0.0) for r in steps)
    log = run_dir / "logs" / "learner.log"
    ckpts = [float(m.group(1)) for m in _CKPT_RE.finditer(log.read_text())] if log.exists() else []
    out = {"steps": float(len(steps)), "compute_s_mean": compute / len(steps), "publish_s_mean": publish / len(steps),
           "publish_share": publish / (compute + publish + ckpt_in_steps)}
    if ckpts:
        c = sum(ckpts) / len(ckpts)
        out["checkpoint_s"] = c
        per_step = compute / len(steps) + publish / len(steps)
        out["checkpoint_share_amortised"] = (c / checkpoint_every) / (per_step + c / checkpoint_every)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--label", default="run", help="name part of the figures: learner.publish.<label>.*")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--command", default="", help="the command that produced the run (recorded)")
    ap.add_argument("--note", default="", help="measurement conditions (recorded)")
    ap.add_argument("--out", default=None, help="append the figures to this results.json (default: print only)")
    a = ap.parse_args(argv)
    figs = publish_figures(a.run_dir, a.checkpoint_every)
    print(json.dumps(figs, indent=1))
    if a.out:
        path = Path(a.out)
        results: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        names = {f"learner.publish.{a.label}.{k}" for k in figs}
        results = [r for r in results if r.get("name") not in names]
        units = {"steps": "steps", "publish_share": "fraction", "checkpoint_share_amortised": "fraction"}
        for k, v in figs.items():
            results.append({"name": f"learner.publish.{a.label}.{k}", "value": round(v, 4), "unit": units.get(k, "s"),
                            "command": a.command, "date": now, "machine_cores": os.cpu_count(), "note": a.note})
        path.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
