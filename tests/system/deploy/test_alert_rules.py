"""The alerting rules (deploy/prometheus/alerts.yml) and their copies, tests and runbook.

``promtool check rules`` and ``promtool test rules`` (deploy/prometheus/tests/alerts_test.yml: each
alert fires on made-up series of a failure and stays quiet on healthy ones) run here; so do the
checks that keep the rules honest: every series they read is one the code exports (scraped from a
real server, and the worker's and learner's registries), the PrometheusRule of
deploy/k8s/monitoring carries the same groups, compose's Prometheus loads the file, and every alert
links to its section of docs/RUNBOOK.md.

promtool must be on PATH (or named by ``PRIOREPLAY_PROMTOOL``); ``make prometheus-tools`` installs
Debian's ``prometheus`` package, which has it. Without it these tests fail and say so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.system.deploy.test_metrics_exported import REPO, _scrape_server

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests" / "alerts_test.yml"
PROMETHEUS_RULE = REPO / "deploy" / "k8s" / "monitoring" / "prometheusrule.yaml"
RUNBOOK = REPO / "docs" / "RUNBOOK.md"
INSTALL_HINT = (
    "install promtool: `make prometheus-tools` as root (Debian/Ubuntu `apt-get install -y prometheus`), or "
    "https://prometheus.io/download/; or set PRIOREPLAY_PROMTOOL to its path"
)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    path = os.environ.get("PRIOREPLAY_PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.fail(f"promtool not found: {INSTALL_HINT}")
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def _groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]


def _alerts() -> list[dict]:
    return [rule for group in _groups() for rule in group["rules"] if "alert" in rule]


def prometheus_rule_text() -> str:
    """deploy/k8s/monitoring/prometheusrule.yaml as generated from deploy/prometheus/alerts.yml."""
    head = (
        "# The alerting rules of deploy/prometheus/alerts.yml as a Prometheus Operator PrometheusRule: the same\n"
        "# groups, copied (tests/system/deploy/test_alert_rules.py fails when the two differ; regenerate with\n"
        "# `make prometheus-rule`). Runbook: docs/RUNBOOK.md. If your Prometheus selects rules by label\n"
        "# (its ruleSelector, e.g. `release: <name>`), add that label under metadata.labels.\n"
    )
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "prioreplay", "labels": {"app.kubernetes.io/part-of": "prioreplay"}},
        "spec": {"groups": _groups()},
    }
    return head + yaml.safe_dump(rule, sort_keys=False, width=120)


def write_prometheus_rule() -> None:
    """Regenerate deploy/k8s/monitoring/prometheusrule.yaml (``make prometheus-rule``)."""
    PROMETHEUS_RULE.write_text(prometheus_rule_text(), encoding="utf-8")


# -- promtool -----------------------------------------------------------------------------------------


def test_promtool_checks_the_rules():
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, f"promtool check rules {RULES.name}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, f"promtool test rules failed:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_fail_against_a_broken_rule(tmp_path):
    """The unit tests can fail: with one alert's condition inverted, promtool reports a failure."""
    broken = RULES.read_text(encoding="utf-8").replace("prioreplay_store_healthy == 0", "prioreplay_store_healthy == 1")
    assert broken != RULES.read_text(encoding="utf-8")
    (tmp_path / "alerts.yml").write_text(broken, encoding="utf-8")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "alerts_test.yml").write_text(RULE_TESTS.read_text(encoding="utf-8"), encoding="utf-8")
    done = _promtool("test", "rules", str(tests / "alerts_test.yml"))
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "PrioreplayServerNotServing" in out, out[-2000:]


def test_every_alert_is_tested_firing_and_quiet():
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fires, quiet = set(), set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fires == set(), f"no test where these fire: {sorted(names - fires)}"
    assert names - quiet == set(), f"no test where these stay quiet: {sorted(names - quiet)}"


# -- the rules read real series, and every copy agrees ---------------------------------------------------------


def test_rules_use_only_series_the_code_exports():
    """Every ``prioreplay_*`` name in an expression is exported: by a real server (scraped once its
    store statistics are in), by the parent of ``--processes N`` (its per-process series, here for one
    child that does not answer), or by the worker's or learner's registry."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from prioreplay.learner.metrics import LearnerMetrics
    from prioreplay.priority_server.multiprocess import AggregateCollector
    from prioreplay.rollout_worker.metrics import WorkerMetrics
    from tests.conftest import free_port

    text, _port = _scrape_server()
    text += generate_latest(WorkerMetrics().registry).decode() + generate_latest(LearnerMetrics().registry).decode()
    parent = CollectorRegistry()
    aggregate = AggregateCollector([f"http://127.0.0.1:{free_port()}/metrics"], timeout_s=0.5)
    parent.register(aggregate)
    try:
        text += generate_latest(parent).decode()
    finally:
        aggregate.close()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for alert in _alerts():
        used = set(re.findall(r"\bprioreplay_\w+", alert["expr"]))
        assert used, f"{alert['alert']} reads no prioreplay series"
        assert used <= exported, f"{alert['alert']} reads series no process exports: {sorted(used - exported)}"


def test_server_exports_its_queue_bound():
    """``prioreplay_trajectory_queue_bound`` is the server's --max-queue-depth (the queue alert's bound)."""
    from prometheus_client.parser import text_string_to_metric_families

    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store

    for depth in (7, 0):
        cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, max_queue_depth=depth)
        with BackgroundServer(lambda cfg=cfg: create_store("memory", cfg.to_store_config()), cfg) as srv:
            text = srv.runtime.metrics.render().decode()
        values = {
            s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name.endswith("queue_bound")
        }
        assert values == {"prioreplay_trajectory_queue_bound": depth}


def test_prometheus_rule_for_kubernetes_carries_the_same_rules():
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == prometheus_rule_text(), (
        "deploy/k8s/monitoring/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: `make prometheus-rule`"
    )
    kustomization = yaml.safe_load((PROMETHEUS_RULE.parent / "kustomization.yaml").read_text(encoding="utf-8"))
    assert PROMETHEUS_RULE.name in kustomization["resources"]


def test_compose_prometheus_loads_the_rules():
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    volumes = compose["services"]["prometheus"]["volumes"]
    for path in config["rule_files"]:
        mounted = [v for v in volumes if v.endswith(f":{path}:ro")]
        assert mounted, f"compose mounts nothing at {path}"
        source = REPO / mounted[0].split(":", 1)[0]
        assert source.is_file() and source.suffix == ".yml", f"{mounted[0]}: no rules file there"
    assert f"./deploy/prometheus/{RULES.name}:/etc/prometheus/{RULES.name}:ro" in volumes


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_to_its_runbook_section():
    anchors = {_anchor(m) for m in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(encoding="utf-8"), flags=re.M)}
    for alert in _alerts():
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/RUNBOOK.md" and anchor == alert["alert"].lower(), f"{alert['alert']}: runbook_url {url}"
        assert anchor in anchors, f"docs/RUNBOOK.md has no section {alert['alert']!r} ({url})"
        for key in ("summary", "description"):
            assert alert["annotations"].get(key), f"{alert['alert']}: no {key}"
        assert alert["labels"].get("severity") in ("warning", "critical")
