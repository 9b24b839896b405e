"""Reports where people read their runs: TensorBoard event files and Weights & Biases runs.

``--report-to tensorboard,wandb`` on ``prioreplay learner``, ``demo`` and ``compare`` opens one
:class:`Reporter` per process, which writes through the libraries themselves
(``torch.utils.tensorboard.SummaryWriter``; ``wandb.init`` / ``run.log``). Tags, all at the
learner step:

* ``learner/<key>``: every finite number of the learner's JSON line (``learner.jsonl``): loss,
  pg_loss, kl, entropy, grad_norm, lr, clip_frac_low / clip_frac_high / dual_clip_frac,
  tokens_per_s, staleness_mean / staleness_max, reward_mean, the ``*_s`` phase seconds and the
  group counts;
* ``server/<key>`` (demo and compare, from the GetStats RPC they read after each step): the pool
  sizes heap, solved, unsolved, leased, unseen; effective_group_fraction (cumulative) and its
  window since the previous step; mean_reward_window; completions; forgetting_events and
  breakthroughs; ``server/priority`` is the heap's priority histogram;
* ``eval/<key>`` (demo): held-out accuracy before and after, and the change.

TensorBoard writes under ``DIR/tensorboard`` (``tensorboard --logdir DIR``); wandb writes its run
folder under ``DIR`` and follows the ``WANDB_*`` environment (``WANDB_MODE=offline`` writes
locally only, for ``wandb sync`` later; ``WANDB_PROJECT``, default ``prioreplay``).

The top of this module imports only pydantic(-settings) and the standard library (settings modules import
:data:`ReportTo`); torch and wandb are imported by :func:`open_reporter`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from pydantic_settings import NoDecode

#: The targets ``--report-to`` takes.
REPORT_TARGETS = ("tensorboard", "wandb")
#: The install extra that brings each target's library.
_EXTRA = {"tensorboard": "learner", "wandb": "wandb"}


def _targets(value: object) -> object:
    """``value`` as a list of target names: a comma list, a JSON list or a list of them, in any
    case, duplicates dropped; ``none`` or empty means no target.

    Raises:
        ValueError: an unknown target (named) or unparsable JSON.
    """
    if value is None:
        return []
    if isinstance(value, str) and value.strip().startswith("["):
        value = json.loads(value)  # a JSON list, as pydantic-settings writes lists elsewhere
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value  # pydantic's type error names it
    names = [str(v).strip().lower() for item in items for v in str(item).split(",")]
    names = [n for n in names if n and n != "none"]
    unknown = [n for n in names if n not in REPORT_TARGETS]
    if unknown:
        raise ValueError(f"report_to ({', '.join(unknown)}) must be a comma list of {', '.join(REPORT_TARGETS)} (or none)")
    return list(dict.fromkeys(names))


#: ``--report-to``: where a run's scalars go besides /metrics and the JSON lines.
#: (``NoDecode``: an environment variable is the same comma list, not JSON.)
ReportTo = Annotated[list[Literal["tensorboard", "wandb"]], NoDecode, BeforeValidator(_targets)]

#: The demo's per-step keys (``prioreplay.apps.demo``) reported as ``server/<key>``.
SERVER_KEYS = (
    "heap",
    "solved",
    "unsolved",
    "leased",
    "unseen",
    "policy_version",
    "groups",
    "groups_mixed",
    "completions",
    "effective_group_fraction_window",
    "mean_reward_window",
    "forgetting_events",
    "breakthroughs",
)


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``values`` (bools, strings, None, NaN and inf left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class Reporter:
    """One process's TensorBoard writer and wandb run (either or both; neither: every call does
    nothing). Build it with :func:`open_reporter`. Each call writes at once (TensorBoard is flushed
    after each step), so a crashed run keeps what it reported; :meth:`close` runs at exit too."""

    def __init__(self, writer: Any = None, run: Any = None):
        self.writer, self.run = writer, run

    def scalars(self, prefix: str, values: Mapping[str, Any], step: int) -> None:
        """Write every finite number of ``values`` as ``prefix/<key>`` at ``step`` (a learner step)."""
        if self.writer is None and self.run is None:
            return
        nums = {f"{prefix}/{k}": v for k, v in numbers(values).items()}
        if self.writer is not None:
            for tag, v in nums.items():
                self.writer.add_scalar(tag, v, step)
            self.writer.flush()
        if self.run is not None and nums:
            self.run.log(nums, step=step)

    def histogram(self, tag: str, edges: Sequence[float], counts: Sequence[float], step: int) -> None:
        """Write a histogram given as bucket counts: ``counts[i]`` values in ``[edges[i], edges[i+1])``
        (``len(edges) == len(counts) + 1``; the GetStats priority histogram). An empty one is skipped.

        TensorBoard takes each bucket's right edge as its limit; its sum and sum of squares use the
        bucket midpoints (the counts are all the RPC gives).

        Raises:
            ValueError: ``edges`` is not one longer than ``counts``.
        """
        if len(edges) != len(counts) + 1:
            raise ValueError(f"a histogram of {len(counts)} buckets needs {len(counts) + 1} edges, got {len(edges)}")
        num = float(sum(counts))
        if num <= 0 or (self.writer is None and self.run is None):
            return
        mids = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
        used = [i for i, c in enumerate(counts) if c]
        if self.writer is not None:
            self.writer.add_histogram_raw(
                tag,
                min=float(edges[used[0]]),
                max=float(edges[used[-1] + 1]),
                num=num,
                sum=sum(c * m for c, m in zip(counts, mids, strict=True)),
                sum_squares=sum(c * m * m for c, m in zip(counts, mids, strict=True)),
                bucket_limits=[float(e) for e in edges[1:]],
                bucket_counts=[float(c) for c in counts],
                global_step=step,
            )
            self.writer.flush()
        if self.run is not None:
            import numpy as np
            import wandb

            self.run.log({tag: wandb.Histogram(np_histogram=(np.asarray(counts), np.asarray(edges)))}, step=step)

    def demo_step(self, rec: Mapping[str, Any]) -> None:
        """Write one step record of ``prioreplay demo`` (its ``report.json`` ``steps`` entry): the
        learner's line as ``learner/*``, the server's figures as ``server/*`` and the priority
        histogram as ``server/priority``."""
        step = int(rec["step"])
        self.scalars("learner", rec.get("learner") or {}, step)
        server = {k: rec.get(k) for k in SERVER_KEYS}
        server["effective_group_fraction"] = rec["groups_mixed"] / rec["groups"] if rec.get("groups") else None
        self.scalars("server", server, step)
        if rec.get("priority_histogram"):
            self.histogram("server/priority", rec["priority_bucket_edges"], rec["priority_histogram"], step)

    def close(self) -> None:
        """Flush and close the writer and finish the wandb run (safe to call twice)."""
        writer, run, self.writer, self.run = self.writer, self.run, None, None
        if writer is not None:
            writer.close()
        if run is not None:
            run.finish()


def open_reporter(
    targets: Sequence[str], log_dir: str | os.PathLike, name: str, config: Mapping[str, Any] | None = None
) -> Reporter:
    """Open the writers of ``targets`` (a subset of :data:`REPORT_TARGETS`; empty: a reporter that
    writes nothing, and nothing is imported).

    Args:
        targets: ``tensorboard`` and/or ``wandb``.
        log_dir: TensorBoard events go to ``log_dir/tensorboard``, the wandb run folder under
            ``log_dir`` (created).
        name: the run's name in wandb (e.g. the demo's run directory name).
        config: the run's settings, stored with the wandb run.

    Raises:
        InvalidArgument: a target's library is not installed (the message gives the extra to
            install), or ``wandb.init`` failed (not logged in: ``wandb login`` or ``WANDB_MODE=offline``).
    """
    from prioreplay.errors import InvalidArgument

    unknown = [t for t in targets if t not in REPORT_TARGETS]
    if unknown:
        raise InvalidArgument(f"report_to ({', '.join(unknown)}) must be among {', '.join(REPORT_TARGETS)}")
    root = Path(log_dir)
    writer = run = None
    target = "tensorboard"
    try:
        if "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(root / "tensorboard"))
        if "wandb" in targets:
            target = "wandb"
            run = _init_wandb(root, name, config)
    except ImportError as e:
        if writer is not None:
            writer.close()
        raise InvalidArgument(
            f"--report-to {target} needs the {e.name or target!r} package, which this install lacks; "
            f"install it with: pip install 'prioreplay[{_EXTRA[target]}]'"
        ) from None
    except InvalidArgument:
        if writer is not None:
            writer.close()
        raise
    reporter = Reporter(writer, run)
    atexit.register(reporter.close)
    return reporter


def _init_wandb(root: Path, name: str, config: Mapping[str, Any] | None) -> Any:
    """``wandb.init`` of one run under ``root`` (project ``WANDB_PROJECT``, default prioreplay).

    Raises:
        ImportError: wandb is not installed.
        InvalidArgument: ``wandb.init`` failed (e.g. online without a login).
    """
    import wandb

    from prioreplay.errors import InvalidArgument

    root.mkdir(parents=True, exist_ok=True)
    try:
        return wandb.init(
            project=os.environ.get("WANDB_PROJECT", "prioreplay"), name=name, dir=str(root), config=dict(config or {})
        )
    except Exception as e:  # noqa: BLE001 - wandb raises many kinds (UsageError, CommError, ...)
        raise InvalidArgument(
            f"--report-to wandb: wandb.init failed ({e}); log in with `wandb login`, or set WANDB_MODE=offline "
            "to write the run locally (upload it later with `wandb sync`)"
        ) from None
