"""Checks of the Kubernetes manifests (deploy/k8s) and of the Prometheus discovery of every replica.

Offline, no cluster: each overlay is rendered by ``kubectl kustomize`` (the real renderer), every
object is validated against the API schemas of named Kubernetes versions with
``kubernetes-validate`` (strict: unknown fields fail), and every ``prioreplay`` container's
arguments and environment are parsed by the real CLI (``parse_command`` of test_deploy.py, the
check the compose file gets). Then the shape: headless Service for round_robin clients, native
gRPC probes on the health service, the PodDisruptionBudget, one GPU per worker pod, weights over
HTTP from the learner's Service into each worker's emptyDir (the checkpoint claim the learner's
alone; shared read-only in overlays/shared-volume), Redis' maxmemory, the token Secret, pod
annotations and the ServiceMonitor that find every replica; and the dashboard's aggregation across server replicas.

kubectl must be on PATH (or named by ``PRIOREPLAY_KUBECTL``); without it these tests fail and say
how to install it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import self_signed
from tests.system.deploy.test_deploy import (
    DASHBOARD_FILE,
    DEPLOY_DOC,
    GRPC_PORT,
    METRICS_PORTS,
    PRIOREPLAY_SERVICES,
    REPO,
    parse_command,
)
from tests.system.deploy.test_metrics_exported import _scrape_server
from tests.system.security.test_auth_tls import _openssl

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "tls", "shared-volume")
#: The overlays that move weights over HTTP (all but shared-volume).
HTTP_OVERLAYS = ("cpu", "gpu", "tls")
#: The oldest version the manifests need (native gRPC probes are GA in 1.27) and a recent one.
KUBERNETES_VERSIONS = ("1.27.0", "1.33.0")
#: Workload name -> kind, for each prioreplay role (names as in compose: PRIOREPLAY_SERVICES).
WORKLOADS = {"priority-server": "Deployment", "loader": "Job", "rollout-worker": "Deployment", "learner": "StatefulSet"}
SCRAPED = ("priority-server", "rollout-worker", "learner")
AUTH_SECRET = ("prioreplay-auth", "token")
SERVER_TARGET = f"dns:///priority-server:{GRPC_PORT}"
INSTALL_HINT = (
    "install kubectl >= 1.21 (its `kubectl kustomize`, kustomize >= v4, renders the manifests' `resources` "
    "folders and `patches`; kustomize v5 form): https://kubernetes.io/docs/tasks/tools/; "
    "or set PRIOREPLAY_KUBECTL to its path"
)


# -- rendering -----------------------------------------------------------------------------------------


def _kubectl() -> str:
    path = os.environ.get("PRIOREPLAY_KUBECTL") or shutil.which("kubectl")
    if not path:
        pytest.fail(f"kubectl not found: {INSTALL_HINT}")
    return path


@functools.cache
def _render_text(folder: str) -> str:
    done = subprocess.run([_kubectl(), "kustomize", str(K8S / folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize deploy/k8s/{folder} failed: {done.stderr[-2000:]} ({INSTALL_HINT})"
    # kustomize v5 warns on stderr (`# Warning: 'bases' is deprecated ...`) for deprecated fields (`bases`,
    # `patchesStrategicMerge`, ...): the manifests are kept in the v5 form, so any warning fails
    warnings = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert not warnings, f"kubectl kustomize deploy/k8s/{folder} warns: {warnings}"
    return done.stdout


def render(folder: str) -> list[dict]:
    """The objects ``kubectl kustomize deploy/k8s/<folder>`` renders (fresh copies)."""
    return [d for d in yaml.safe_load_all(_render_text(folder)) if d]


def objects(folder: str) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in render(folder)}


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def container(objs: dict, role: str) -> dict:
    """The container named after ``role`` in its workload."""
    containers = {c["name"]: c for c in pod_spec(objs[(WORKLOADS[role], role)])["containers"]}
    assert role in containers, f"{role}: no container named {role!r}"
    return containers[role]


def as_service(c: dict) -> dict:
    """A container as the compose-shaped service ``parse_command`` reads: its args, and its env
    (a value from a Secret is passed through, i.e. unset here, as compose passes the token)."""
    return {"command": c["args"], "environment": {e["name"]: e.get("value") for e in c.get("env", [])}}


def mounts(objs: dict, role: str) -> dict[str, tuple[dict, dict]]:
    """mountPath -> (volumeMount, volume) of a role's container."""
    spec = pod_spec(objs[(WORKLOADS[role], role)])
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container(objs, role).get("volumeMounts", [])}


# -- every overlay renders, validates and parses -----------------------------------------------------------


def test_kubectl_renders_every_kustomization():
    for folder in ("base", *(f"overlays/{o}" for o in OVERLAYS), "monitoring"):
        assert render(folder), f"deploy/k8s/{folder} renders nothing"


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(overlay, version):
    import kubernetes_validate

    for obj in render(f"overlays/{overlay}"):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(
                f"{overlay}: {obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes {version}: "
                f"{e.message} at {'/'.join(map(str, e.path))}"
            )


def test_the_validator_refuses_a_wrong_field():
    import kubernetes_validate

    server = objects("overlays/gpu")[("Deployment", "priority-server")]
    server["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": GRPC_PORT}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(server, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_prioreplay_command_is_parsed_by_the_cli(overlay, monkeypatch):
    objs = objects(f"overlays/{overlay}")
    for role, command in PRIOREPLAY_SERVICES.items():
        c = container(objs, role)
        assert c["args"][0] == command, f"{role} runs {c['args'][0]!r}, not {command!r}"
        config = parse_command(as_service(c), monkeypatch)
        if role != "priority-server":
            assert config.server == SERVER_TARGET, f"{role} must reach every server replica ({SERVER_TARGET})"
        if role in SCRAPED:
            assert config.metrics_port == METRICS_PORTS[role]
        names = {e["name"] for e in c.get("env", [])}
        assert len(names) == len(c.get("env", [])), f"{role}: an environment variable is set twice"


# -- the priority server --------------------------------------------------------------------------------------


def test_server_service_is_headless_so_clients_round_robin():
    from prioreplay.channel import client_channel_options

    objs = objects("overlays/gpu")
    svc = objs[("Service", "priority-server")]
    assert svc["spec"].get("clusterIP") == "None", "a ClusterIP would pin each client connection to one replica"
    assert not svc["spec"].get("publishNotReadyAddresses"), "replicas that are not ready must leave DNS"
    assert {p["port"] for p in svc["spec"]["ports"]} == {GRPC_PORT, METRICS_PORTS["priority-server"]}
    opts = dict(client_channel_options(SERVER_TARGET, 64))
    assert "round_robin" in opts.get("grpc.service_config", ""), "dns:/// targets must use round_robin"
    deploy = objs[("Deployment", "priority-server")]
    assert deploy["spec"]["replicas"] >= 2
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_server_probes_are_native_grpc_health_checks(overlay, monkeypatch):
    c = container(objects(f"overlays/{overlay}"), "priority-server")
    port = parse_command(as_service(c), monkeypatch).port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe].get("grpc", {}).get("port") == port, f"{probe} must be a gRPC probe on {port}"
        assert c[probe]["grpc"].get("service", "") == "", "the server's overall health is the service ''"


def test_disruption_budget_keeps_a_server_replica():
    objs = objects("overlays/gpu")
    pdb = objs[("PodDisruptionBudget", "priority-server")]
    labels = objs[("Deployment", "priority-server")]["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("minAvailable", 0) >= 1
    assert pdb["spec"]["minAvailable"] < objs[("Deployment", "priority-server")]["spec"]["replicas"]


def _redis_bytes(size: str) -> int:
    """A Redis memory size (``4gb``, ``512mb``, ``100kb``, bytes): Redis' units are powers of 1024."""
    m = re.fullmatch(r"(\d+)(gb|mb|kb|b)?", size.lower())
    assert m, f"not a Redis memory size: {size!r}"
    return int(m.group(1)) * {"gb": 1 << 30, "mb": 1 << 20, "kb": 1 << 10}.get(m.group(2) or "b", 1)


def _k8s_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity with a binary suffix (``6Gi``, ``512Mi``)."""
    m = re.fullmatch(r"(\d+)(Gi|Mi|Ki)", quantity)
    assert m, f"give memory limits in Gi/Mi/Ki, not {quantity!r}"
    return int(m.group(1)) * {"Gi": 1 << 30, "Mi": 1 << 20, "Ki": 1 << 10}[m.group(2)]


def test_redis_is_persistent_bounded_as_in_compose_and_the_server_uses_it(monkeypatch):
    objs = objects("overlays/gpu")
    redis = objs[("StatefulSet", "redis")]
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    claims = {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))["services"]["redis"]["command"]
    compose_max = re.fullmatch(r"\$\{PRIOREPLAY_REDIS_MAXMEMORY:-(\w+)\}", compose[compose.index("--maxmemory") + 1])
    assert compose_max, "compose's --maxmemory is no longer ${PRIOREPLAY_REDIS_MAXMEMORY:-SIZE}"
    assert args[args.index("--maxmemory") + 1] == compose_max.group(1), "the same Redis bound as compose"
    limit = _k8s_bytes(redis["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])
    assert limit >= 1.25 * _redis_bytes(args[args.index("--maxmemory") + 1]), (
        "the memory limit must leave room above maxmemory (AOF rewrite, fragmentation), or the kernel "
        "kills Redis before it refuses a write"
    )
    data = [m for m in redis["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/data"]
    assert data and data[0]["name"] in claims, "Redis /data must be on a PersistentVolumeClaim"
    store = parse_command(as_service(container(objs, "priority-server")), monkeypatch).store
    host = re.match(r"rediss?://([^:/]+)", store).group(1)
    assert ("Service", host) in objs, f"--store {store} names no Service"


# -- workers and the learner -------------------------------------------------------------------------------------


def test_gpu_profile_requests_one_gpu_per_worker_and_learner(monkeypatch):
    objs = objects("overlays/gpu")
    for role in ("rollout-worker", "learner"):
        assert container(objs, role)["resources"]["limits"].get("nvidia.com/gpu") == 1, f"{role}: one GPU per pod"
    assert parse_command(as_service(container(objs, "rollout-worker")), monkeypatch).backend == "vllm"


def test_cpu_profile_requests_no_gpu(monkeypatch):
    text = _render_text("overlays/cpu")
    assert "nvidia.com/gpu" not in text, "the CPU profile must not request (or tolerate) GPUs"
    objs = objects("overlays/cpu")
    worker = parse_command(as_service(container(objs, "rollout-worker")), monkeypatch)
    assert worker.backend == "transformers" and worker.device == "cpu"
    assert worker.group_size * worker.batch_size * worker.max_new_tokens <= 4096, "a small budget"
    learner = parse_command(as_service(container(objs, "learner")), monkeypatch)
    assert learner.device == "cpu" and learner.batch_groups <= 8


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_match_the_roles(overlay):
    objs = objects(f"overlays/{overlay}")
    role_image = "prioreplay" if overlay == "cpu" else "prioreplay-gpu"
    for role in PRIOREPLAY_SERVICES:
        image = container(objs, role)["image"].rsplit(":", 1)[0]
        expected = "prioreplay-server" if role in ("priority-server", "loader") else role_image
        assert image == expected, f"{overlay}: {role} runs {image}, expected {expected}"


def _claim_mounts(objs: dict, claim: str) -> dict[str, list[dict]]:
    """Workload name -> the volumeMounts (any container) of the PersistentVolumeClaim ``claim``."""
    found: dict[str, list[dict]] = {}
    for (kind, name), obj in objs.items():
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        vols = {v["name"] for v in spec.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
        hits = [m for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] in vols]
        if hits:
            found[name] = hits
    return found


@pytest.mark.parametrize("overlay", HTTP_OVERLAYS)
def test_workers_fetch_weights_from_the_learners_service_into_an_empty_dir(overlay, monkeypatch):
    from prioreplay.weights_transport import is_remote, published_uri

    objs = objects(f"overlays/{overlay}")
    learner = parse_command(as_service(container(objs, "learner")), monkeypatch)
    assert learner.serve_weights_port > 0 and learner.serve_weights_host == "0.0.0.0", "serve weights to other nodes"
    uri = published_uri(learner.publish_root() / "v-3", learner.weights_base_url)
    assert is_remote(uri), f"the learner announces {uri!r}, a path workers cannot read without the claim"
    url = re.fullmatch(r"http://([a-z0-9-]+):(\d+)/v-3/", uri)
    assert url, f"{uri!r} is not http://SERVICE:PORT/v-N/"
    svc = objs.get(("Service", url.group(1)))
    assert svc, f"the weights URL names {url.group(1)!r}, which is no Service"
    sts = objs[("StatefulSet", "learner")]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == int(url.group(2))]
    target = {p.get("name"): p["containerPort"] for p in container(objs, "learner")["ports"]}.get(port["targetPort"])
    assert target == learner.serve_weights_port, f"Service port {port} does not reach --serve-weights-port"

    worker = parse_command(as_service(container(objs, "rollout-worker")), monkeypatch)
    cache = mounts(objs, "rollout-worker").get(str(worker.weights_cache_dir))
    assert cache and "emptyDir" in cache[1], f"the weights cache {worker.weights_cache_dir} must be a per-pod emptyDir"
    assert str(learner.checkpoint_dir) not in mounts(objs, "rollout-worker"), "workers must not mount the checkpoints"
    assert set(_claim_mounts(objs, "checkpoints")) == {"learner"}, "the checkpoints claim is the learner's alone"
    assert objs[("PersistentVolumeClaim", "checkpoints")]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert sts["spec"]["replicas"] == 1, "one learner (one consumer)"


@pytest.mark.parametrize("overlay", HTTP_OVERLAYS)
def test_only_workers_may_reach_the_unauthenticated_weights_port(overlay, monkeypatch):
    objs = objects(f"overlays/{overlay}")
    port = parse_command(as_service(container(objs, "learner")), monkeypatch).serve_weights_port
    policy = objs[("NetworkPolicy", "learner-weights")]["spec"]
    assert _selects(policy["podSelector"], objs[("StatefulSet", "learner")]["spec"]["template"]["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    worker_labels = objs[("Deployment", "rollout-worker")]["spec"]["template"]["metadata"]["labels"]
    open_to = [r for r in policy["ingress"] if port in {p["port"] for p in r.get("ports", [])}]
    assert open_to and all(r.get("from") for r in open_to), f"port {port} must not be open to every pod"
    for rule in open_to:
        assert all("namespaceSelector" not in f and "ipBlock" not in f for f in rule["from"])
        assert any(_selects(f["podSelector"], worker_labels) for f in rule["from"])
        assert not any(_selects(f["podSelector"], {"app.kubernetes.io/name": "loader"}) for f in rule["from"])
    metrics = METRICS_PORTS["learner"]
    assert any(metrics in {p["port"] for p in r.get("ports", [])} and not r.get("from") for r in policy["ingress"])


def test_shared_volume_overlay_mounts_the_checkpoints_read_only_in_every_worker(monkeypatch):
    objs = objects("overlays/shared-volume")
    learner_cfg = parse_command(as_service(container(objs, "learner")), monkeypatch)
    assert learner_cfg.serve_weights_port == 0 and learner_cfg.weights_base_url is None, "announce local paths"
    ckpt = str(learner_cfg.checkpoint_dir)
    learner, worker = mounts(objs, "learner").get(ckpt), mounts(objs, "rollout-worker").get(ckpt)
    assert learner and worker, f"learner and workers must both mount the checkpoints at {ckpt}"
    assert worker[1]["persistentVolumeClaim"]["claimName"] == learner[1]["persistentVolumeClaim"]["claimName"]
    assert not learner[0].get("readOnly") and worker[0].get("readOnly"), "the learner writes, workers only read"
    assert "ReadWriteMany" in objs[("PersistentVolumeClaim", "checkpoints")]["spec"]["accessModes"]
    assert 8000 not in {p["port"] for p in objs[("Service", "learner")]["spec"]["ports"]}
    assert "/weights-cache" not in mounts(objs, "rollout-worker")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_takes_the_token_from_the_secret(overlay):
    objs = objects(f"overlays/{overlay}")
    for role in PRIOREPLAY_SERVICES:
        env = {e["name"]: e for e in container(objs, role).get("env", [])}
        ref = env.get("PRIOREPLAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        assert (ref.get("name"), ref.get("key")) == AUTH_SECRET, f"{role}: PRIOREPLAY_AUTH_TOKEN from {AUTH_SECRET}"
        assert not ref.get("optional"), f"{role}: without the token Secret nothing may start with auth off"
    assert not any(kind == "Secret" for kind, _ in objs), "no token value may be committed: the Secret is created"
    assert (
        f"kubectl -n prioreplay create secret generic {AUTH_SECRET[0]} --from-literal={AUTH_SECRET[1]}="
        in DEPLOY_DOC.read_text(encoding="utf-8")
    )


def test_tls_overlay_serves_and_trusts_the_tls_secret(monkeypatch):
    objs = objects("overlays/tls")
    server = container(objs, "priority-server")
    config = parse_command(as_service(server), monkeypatch)
    secret_dirs = {
        path
        for path, (_m, vol) in mounts(objs, "priority-server").items()
        if vol.get("secret", {}).get("secretName") == "prioreplay-tls"
    }
    for f in (config.tls_cert_file, config.tls_key_file):
        assert f is not None and str(f.parent) in secret_dirs, f"{f} is not in the mounted prioreplay-tls Secret"
    for probe in ("readinessProbe", "livenessProbe"):
        assert "grpc" not in server[probe], "a native gRPC probe cannot speak TLS"
        code = server[probe]["exec"]["command"][2]
        compile(code, probe, "exec")
        assert f"127.0.0.1:{config.port}" in code and "ssl_channel_credentials" in code
    for role in ("loader", "rollout-worker", "learner"):
        ca = parse_command(as_service(container(objs, role)), monkeypatch).tls_ca_file
        vol = mounts(objs, role)[str(ca.parent)][1]
        assert vol["secret"]["secretName"] == "prioreplay-tls", f"{role}: {ca} is not from prioreplay-tls"


# -- Prometheus: every replica and process ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scraped_pods_are_annotated_with_their_metrics_port(overlay):
    objs = objects(f"overlays/{overlay}")
    for role in SCRAPED:
        ann = objs[(WORKLOADS[role], role)]["spec"]["template"]["metadata"].get("annotations", {})
        assert ann.get("prometheus.io/scrape") == "true", f"{role} pods are not annotated for scraping"
        assert int(ann["prometheus.io/port"]) == METRICS_PORTS[role]
        assert ann.get("prometheus.io/path", "/metrics") == "/metrics"
        ports = {p["containerPort"]: p.get("name") for p in container(objs, role)["ports"]}
        assert ports.get(METRICS_PORTS[role]) == "metrics"


def _selects(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics for matchLabels and In/NotIn/Exists/DoesNotExist."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    ops = {
        "In": lambda k, v: labels.get(k) in v,
        "NotIn": lambda k, v: labels.get(k) not in v,
        "Exists": lambda k, v: k in labels,
        "DoesNotExist": lambda k, v: k not in labels,
    }
    return all(ops[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", []))


def test_service_monitor_finds_every_role_on_its_metrics_port():
    (monitor,) = [d for d in render("monitoring") if d["kind"] == "ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    objs = objects("overlays/gpu")
    services = {name: svc for (kind, name), svc in objs.items() if kind == "Service"}
    selector = monitor["spec"]["selector"]
    selected = {name for name, svc in services.items() if _selects(selector, svc["metadata"]["labels"])}
    assert selected == set(SCRAPED), f"the ServiceMonitor selects {sorted(selected)}"
    port_names = {e["port"] for e in monitor["spec"]["endpoints"]}
    for name in SCRAPED:
        svc = services[name]
        assert svc["spec"].get("clusterIP") == "None", f"{name}: headless, so every pod is an endpoint"
        by_name = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        assert port_names & set(by_name) and by_name["metrics"] == METRICS_PORTS[name]
    assert monitor["metadata"].get("namespace") == objs[("Namespace", "prioreplay")]["metadata"]["name"]
    assert not _selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {"a": "y"})


def test_pod_discovery_scrape_job_keeps_only_annotated_pods():
    (job,) = yaml.safe_load((K8S / "monitoring" / "prometheus-scrape.yml").read_text(encoding="utf-8"))["scrape_configs"]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep and keep[0]["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    address = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
    joined = f"10.1.2.3:50051;{METRICS_PORTS['priority-server']}"  # the pod's first port; the annotation
    assert (
        re.sub(f"^(?:{address['regex']})$", address["replacement"].replace("$", "\\"), joined)
        == f"10.1.2.3:{METRICS_PORTS['priority-server']}"
    )


def test_compose_prometheus_finds_every_server_replica_by_dns():
    prometheus = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    dns = {sd["names"][0]: sd for job in prometheus["scrape_configs"] for sd in job.get("dns_sd_configs", [])}
    for name in ("priority-server", "rollout-worker"):
        assert dns.get(name, {}).get("type") == "A" and dns[name]["port"] == METRICS_PORTS[name], (
            f"{name} replicas (--scale) must be found by DNS, type A, port {METRICS_PORTS[name]}"
        )


def _store_metrics() -> set[str]:
    """Metric families every server replica exports with the same value: those of the store."""
    from prometheus_client.parser import text_string_to_metric_families

    from prioreplay.priority_server.metrics import ServerMetrics

    own = {f.name for f in text_string_to_metric_families(ServerMetrics().render().decode())}
    text, _port = _scrape_server()
    return {f.name for f in text_string_to_metric_families(text)} - own


def test_dashboard_aggregates_store_series_with_max_across_replicas():
    """Every server replica exports the store-derived series (pools, heap, queue, store counters):
    a `sum` over replicas multiplies them by the replica count. Process-local series (RPC latency
    and errors) are per replica and may be summed."""
    store = _store_metrics()
    assert {"prioreplay_pool_size", "prioreplay_trajectory_queue_depth"} <= store
    assert "prioreplay_rpc_errors" not in store and "prioreplay_rpc_latency_seconds" not in store
    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            used = {m for m in store if re.search(rf"\b{m}(_total|_bucket)?\b", expr)}
            if not used:
                continue
            assert not re.search(r"\b(sum|count)\b", expr), f"{panel['title']}: {expr!r} sums {sorted(used)} over replicas"
            assert re.match(r"(histogram_quantile\([^,]+,\s*)?(max|min)\b", expr), (
                f"{panel['title']}: {expr!r} shows {sorted(used)} once per replica: aggregate with max"
            )


# -- the TLS overlay's probe, run against a TLS server ------------------------------------------------------------


@pytest.fixture(scope="module")
def priority_server_certs(tmp_path_factory) -> dict[str, object]:
    """A CA, and a certificate for the name clients dial in the cluster (``priority-server``) only."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("k8s-tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1")
    self_signed(d, "ca.key", "ca.crt", "/CN=test CA")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-keyout",
        "tls.key",
        "-out",
        "tls.crt",
        "-subj",
        "/CN=priority-server",
        "-addext",
        "subjectAltName=DNS:priority-server",
        cwd=d,
    )
    return {"dir": d, "ca": d / "ca.crt", "cert": d / "tls.crt", "key": d / "tls.key"}


def test_tls_probe_passes_against_a_tls_server_and_fails_without_its_ca(priority_server_certs, tmp_path):
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store

    server = container(objects("overlays/tls"), "priority-server")
    code = server["readinessProbe"]["exec"]["command"][2]
    mount = "/etc/prioreplay/tls/"
    cfg = ServerConfig(
        metrics_port=0,
        snapshot_interval_s=0,
        tls_cert_file=priority_server_certs["cert"],
        tls_key_file=priority_server_certs["key"],
    )
    self_signed(tmp_path, "ca.key", "ca.crt", "/CN=another CA")

    def probe(ca_dir, port) -> int:
        local = code.replace(mount, f"{ca_dir}/").replace(f":{GRPC_PORT}'", f":{port}'")
        return subprocess.run([sys.executable, "-c", local], capture_output=True, timeout=30).returncode

    with BackgroundServer(lambda: create_store("memory", cfg.to_store_config()), cfg) as srv:
        port = int(srv.address.rsplit(":", 1)[1])
        assert probe(priority_server_certs["dir"], port) == 0, "the TLS health probe fails against a TLS server"
        assert probe(tmp_path, port) != 0, "the probe must verify the server against the mounted CA"
