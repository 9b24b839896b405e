"""`docker compose up` for real: the CPU profile with its workers on vLLM's CPU build
(``make compose-smoke-vllm``).

:func:`test_compose_stack_cpu_vllm_profile` runs the command of docs/VLLM.md ("Compose"):
``docker-compose.yml`` + ``deploy/compose.cpu.yml`` + ``deploy/compose.cpu-vllm.yml``, the workers
from deploy/Dockerfile's ``cpu-vllm`` target, the learner on the ``cpu`` image, under its own
project name and free host ports (:mod:`.compose_stack`). It checks that the workers run on vLLM for
real (issue 44: the worker looked for a GPU, exited 2 and restarted for ever):

1. every service turns healthy, which means ready: the worker's vLLM engine is up and it leases;
   the learner can train; the loader registered the default dataset;
2. the worker leases, generates with vLLM and reports (the learner's first step trains on them);
3. the learner publishes policy versions 1 and 2 and the worker loads version >= 2 into its engine;
4. Prometheus scrapes every target and every PromQL expression of the Grafana dashboard returns a
   number (not only NaN);
5. no store error counted or logged ("unreachable"), no store alert pending or firing;
6. teardown with the volumes and the run's image tags; no untagged image left behind.

One worker replica (the command as docs/VLLM.md writes it, with its default scale). Skipped, with the
reason, without Docker, Compose v2 or the base images; ``make compose-smoke-vllm`` turns the skip
into a failure. Bounded: 20 minutes on 2 cores (a cold build of the vLLM image takes about 4 of them).
"""

from __future__ import annotations

import pytest

from .compose_stack import (
    REPO,
    Profile,
    Stack,
    bring_up,
    check_dashboard_queries,
    check_no_false_alarms,
    check_prometheus_targets,
    docker_ready,  # noqa: F401 - the fixture
    run,
    smoke_run,
    wait_first_learner_step,
    wait_versions_published_and_loaded,
)

VLLM_DOC = REPO / "docs" / "VLLM.md"
#: The CPU profile's workers on vLLM, on the CPU smoke test's budget (B=4, 32 new tokens, 2 groups
#: per learner step).
VLLM_PROFILE = Profile(
    files=("docker-compose.yml", "deploy/compose.cpu.yml", "deploy/compose.cpu-vllm.yml"),
    workers=1,
    images=("prioreplay", "prioreplay-server", "prioreplay-vllm-cpu"),
    env={"PRIOREPLAY_BATCH_SIZE": "4", "PRIOREPLAY_MAX_NEW_TOKENS": "32", "PRIOREPLAY_BATCH_GROUPS": "2"},
    budget_s=20 * 60,
)


@pytest.mark.compose
@pytest.mark.slow
@pytest.mark.timeout(VLLM_PROFILE.bound_s + 300)  # + the teardown
def test_compose_stack_cpu_vllm_profile(docker_ready, tmp_path):  # noqa: F811 - the fixture
    with smoke_run(VLLM_PROFILE, tmp_path) as stack:
        bring_up(stack)
        _check_the_worker_runs_vllm_on_the_cpu(stack)
        stack.wait(
            "first completions reported",
            lambda: stack.server_metric("prioreplay_completions_reported_total") > 0,
            timeout=900,
        )
        wait_first_learner_step(stack)
        wait_versions_published_and_loaded(stack)
        check_prometheus_targets(stack)
        check_dashboard_queries(stack)
        check_no_false_alarms(stack)


def _check_the_worker_runs_vllm_on_the_cpu(stack: Stack) -> None:
    """The worker's log names the vLLM backend and no GPU claim, and its container never restarted."""
    log = stack.logs("rollout-worker", tail="all", limit=10**6)
    assert ": vllm backend" in log, f"the worker must say it runs on vLLM:\n{log[-4000:]}"
    assert "claimed GPU" not in log and "no free GPU" not in log, log[-4000:]
    ids = [c["ID"] for c in stack.containers() if c["Service"] == "rollout-worker"]
    restarts = run("docker", "inspect", "--format", "{{.RestartCount}}", *ids).stdout.split()
    assert restarts == ["0"] * stack.profile.workers, f"worker restarts: {restarts}"


# -- static checks that need no daemon ---------------------------------------------------------------------
def test_the_vllm_doc_gives_the_command_of_the_smoke_test():
    """docs/VLLM.md's compose command is the one this smoke test runs (with its default scale)."""
    text = VLLM_DOC.read_text(encoding="utf-8")
    assert f"docker compose {' '.join(VLLM_PROFILE.file_args)} up -d --build" in text
    assert "make compose-smoke-vllm" in text
