"""GPU claims: each process on a node takes its own GPU(s) with a kernel lock on a shared directory.

Every container of a node sees all of the node's GPUs. A process that needs K GPUs opens
``<claims_dir>/gpu-<id>.lock`` for each visible device ``id`` in order and takes an exclusive,
non-blocking :func:`fcntl.flock` on it; the first K it gets are its devices. The lock belongs to
the open file, so the kernel drops it when the process exits for any reason (a crash or
``SIGKILL`` included) and the next process can claim that GPU: no lease, no heartbeat, no
clean-up. ``claims_dir`` must be one directory on one host shared by every process that claims
(a Docker volume mounted in every GPU container).

The learner's GPUs are named by one shared setting (``learner_gpus``, e.g. ``"0"``): the learner
claims exactly those, and workers never try them, so the outcome does not depend on which
container starts first.

After a claim, :meth:`DeviceClaim.apply` writes ``CUDA_VISIBLE_DEVICES`` (and
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA numbers devices as NVML does) into the process
environment. It must run before torch or vLLM initialise CUDA; the process then sees its claimed
devices as ``cuda:0 … cuda:K-1``.

This module imports only the standard library (and ``pynvml`` from ``nvidia-ml-py``, lazily).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from prioreplay.errors import InvalidArgument, ResourceExhausted

log = logging.getLogger("prioreplay.devices")

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class NoFreeDevice(ResourceExhausted):
    """Every candidate GPU is claimed by another process (or too few are visible)."""


class GpuClaimSettings(BaseModel):
    """The GPU-claim settings shared by ``prioreplay worker`` and ``prioreplay learner``.

    Composed into both commands' configurations, so each is declared once
    (``--gpu-claims-dir`` / ``PRIOREPLAY_GPU_CLAIMS_DIR`` and so on).
    """

    gpu_claims_dir: Path | None = Field(
        None,
        description="directory shared by every GPU process of the node (a volume): each process claims its "
        "GPU(s) with a lock file gpu-<id>.lock there and sets CUDA_VISIBLE_DEVICES to them (unset: no claiming, "
        "the process uses the GPUs it sees)",
    )
    learner_gpus: str = Field(
        "",
        description="comma-separated GPU ids the learner holds (e.g. '0' or '0,1'); the learner claims exactly "
        "these, workers never claim them (set the same value for both)",
    )
    gpu_wait_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="when no GPU is free: seconds to wait for one (polling each second) before "
        "exiting with an error (0: exit at once)",
    )

    @field_validator("gpu_claims_dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v  # PRIOREPLAY_GPU_CLAIMS_DIR= turns claiming off

    @field_validator("learner_gpus")
    @classmethod
    def _check_ids(cls, v: str) -> str:
        parse_ids(v, "learner_gpus")
        return v


class DeviceClaim:
    """GPUs held by this process through open, locked files; released on :meth:`release` or exit.

    Attributes:
        devices: the claimed device ids (strings as in ``CUDA_VISIBLE_DEVICES`` / NVML indices).
    """

    def __init__(self, devices: Sequence[str], fds: Sequence[int]):
        self.devices: tuple[str, ...] = tuple(devices)
        self._fds = list(fds)

    def apply(self, env: MutableMapping[str, str] | None = None) -> None:
        """Make the claimed devices the only ones CUDA sees (``cuda:0`` … ``cuda:K-1``).

        Call before torch/vLLM initialise CUDA: a CUDA context created earlier keeps every device.
        """
        env = os.environ if env is None else env
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)

    def release(self) -> None:
        """Unlock and close the lock files (the kernel does the same when the process dies)."""
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []

    def __enter__(self) -> DeviceClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"DeviceClaim(devices={self.devices!r})"


def parse_ids(text: str, setting: str) -> list[str]:
    """Split ``"0,1"`` into ``["0", "1"]`` (blanks dropped).

    Raises:
        InvalidArgument: an id with characters other than letters, digits and ``_.:-``, or a repeat.
    """
    ids = [s.strip() for s in text.split(",") if s.strip()]
    for i in ids:
        if not _ID.match(i):
            raise InvalidArgument(f"{setting} ({text!r}): device id {i!r} must be an index such as 0 or a GPU UUID")
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"{setting} ({text!r}) names a device twice")
    return ids


def visible_devices(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as ids: ``CUDA_VISIBLE_DEVICES`` when set, else NVML's indices.

    Reads no CUDA state (safe before torch initialises CUDA). NVML comes from ``nvidia-ml-py``
    (module ``pynvml``); without it, or without a driver, and without ``CUDA_VISIBLE_DEVICES``,
    the list is empty.
    """
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return parse_ids(cvd, "CUDA_VISIBLE_DEVICES")
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # non-inheritable across exec (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    os.ftruncate(fd, 0)  # who holds it, for people reading the directory
    os.write(fd, f"pid {os.getpid()} host {os.uname().nodename}\n".encode())
    return fd


def claim_devices(
    count: int,
    claims_dir: Path,
    devices: Sequence[str],
    *,
    exclude: Iterable[str] = (),
    exact: bool = False,
    wait_s: float = 0.0,
    poll_s: float = 1.0,
) -> DeviceClaim:
    """Claim ``count`` GPUs among ``devices`` (minus ``exclude``), in order, with one lock file each.

    Args:
        count: GPUs to claim (>= 1): 1 for a worker, K for ``--tensor-parallel-size K``.
        claims_dir: the shared directory of lock files (created if missing).
        devices: candidate ids, e.g. :func:`visible_devices` (tests pass stand-ins).
        exclude: ids never claimed here (the learner's, for a worker).
        exact: claim exactly ``devices`` (all of them, ``count == len(devices)``), as the learner does.
        wait_s: keep trying this many seconds when too few are free (0: try once).
        poll_s: seconds between tries.

    Raises:
        InvalidArgument: ``count`` < 1; ``claims_dir`` cannot be created or written.
        NoFreeDevice: fewer than ``count`` candidates exist or are free after ``wait_s``.
    """
    if count < 1:
        raise InvalidArgument(f"count ({count}) must be >= 1")
    if exact and count != len(devices):
        raise InvalidArgument(f"an exact claim takes every device it names: count ({count}) must be {len(devices)}")
    excluded = set(exclude)
    candidates = [d for d in devices if d not in excluded]
    if len(candidates) < count:
        raise NoFreeDevice(
            f"{count} GPU(s) needed but only {len(candidates)} visible outside the learner's "
            f"({', '.join(sorted(excluded)) or 'none'}) among {list(devices)}"
        )
    try:
        Path(claims_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidArgument(f"gpu_claims_dir ({str(claims_dir)!r}) cannot be created: {e.strerror}") from None
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        claim = _try_claim(count, Path(claims_dir), candidates, exact)
        if claim is not None:
            return claim
        if time.monotonic() + poll_s > deadline:
            raise NoFreeDevice(f"{count} free GPU(s) needed among {candidates}, fewer are free in {str(claims_dir)!r}")
        if not waiting:
            log.warning("no %d free GPU(s) among %s in %s; waiting up to gpu_wait_s=%g s", count, candidates, claims_dir, wait_s)
            waiting = True
        time.sleep(poll_s)


def _try_claim(count: int, claims_dir: Path, candidates: Sequence[str], exact: bool) -> DeviceClaim | None:
    """One pass of :func:`claim_devices`: the first ``count`` free ``candidates`` (every one when
    ``exact``), or None, with no lock kept, when too few are free.

    Raises:
        InvalidArgument: a lock file cannot be written in ``claims_dir``.
    """
    got: list[tuple[str, int]] = []
    for dev in candidates:
        try:
            fd = _try_lock(claims_dir / f"gpu-{dev}.lock")
        except OSError as e:
            for _, f in got:
                os.close(f)
            raise InvalidArgument(f"gpu_claims_dir ({str(claims_dir)!r}) is not writable: {e.strerror}") from None
        if fd is not None:
            got.append((dev, fd))
            if len(got) == count:
                return DeviceClaim([d for d, _ in got], [f for _, f in got])
        elif exact:
            break
    for _, f in got:
        os.close(f)
    return None


def claim_for_role(
    settings: GpuClaimSettings, role: str, count: int, device: str = "auto", env: MutableMapping[str, str] | None = None
) -> DeviceClaim | None:
    """Claim this process's GPUs from its settings and point CUDA at them; None when not claiming.

    Claims nothing (returns None) when ``gpu_claims_dir`` is unset or ``device`` is ``cpu``.
    A ``learner`` claims exactly ``learner_gpus``; a ``worker`` claims ``count`` GPUs that are not
    the learner's. Logs one line with the devices, or raises with one line naming the setting.

    Raises:
        InvalidArgument: a learner with an empty ``learner_gpus``; an unwritable ``gpu_claims_dir``;
            ``device`` ``cuda:N`` with N > 0 (the claimed GPUs are ``cuda:0`` onwards).
        NoFreeDevice: no free GPU after ``gpu_wait_s`` (the message names the settings to change).
    """
    env = os.environ if env is None else env
    if settings.gpu_claims_dir is None or device == "cpu":
        return None
    if device.startswith("cuda:") and device != "cuda:0":
        raise InvalidArgument(
            f"device ({device!r}) with gpu_claims_dir: the claimed GPUs are cuda:0 onwards in this "
            "process; pass --device cuda (or auto), or unset gpu_claims_dir to pick a GPU yourself"
        )
    learner = parse_ids(settings.learner_gpus, "learner_gpus")
    try:
        if role == "learner":
            if not learner:
                raise InvalidArgument(
                    "gpu_claims_dir is set but learner_gpus is empty: name the learner's GPUs "
                    "(PRIOREPLAY_LEARNER_GPUS=0), the same value the workers get"
                )
            claim = claim_devices(len(learner), settings.gpu_claims_dir, learner, exact=True, wait_s=settings.gpu_wait_s)
        else:
            claim = claim_devices(
                count, settings.gpu_claims_dir, visible_devices(env), exclude=learner, wait_s=settings.gpu_wait_s
            )
    except NoFreeDevice as e:
        raise NoFreeDevice(
            f"{role}: no free GPU ({e}); waited gpu_wait_s={settings.gpu_wait_s:g} s. Start fewer "
            "replicas, free a GPU, or raise PRIOREPLAY_GPU_WAIT_S; GPUs are never shared"
        ) from None
    claim.apply(env)
    log.info(
        "%s: claimed GPU(s) %s in %s (CUDA_VISIBLE_DEVICES=%s)",
        role,
        ",".join(claim.devices),
        settings.gpu_claims_dir,
        env["CUDA_VISIBLE_DEVICES"],
    )
    return claim
