"""Every dashboard query answers on a healthy, freshly started stack (no Docker needed).

A labelled counter has no series until its first child is created, so a panel over one alone
shows "No data" on a healthy stack (the compose smoke test found it live for
``prioreplay_store_errors_total``). Each metric a dashboard expression names must therefore have
a sample on a fresh server's, worker's and learner's ``/metrics`` (its bounded label values
created at zero), or the expression must carry an explicit fallback (``or on() vector(0)``).
"""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.system.deploy.test_deploy import _METRIC_RE, _dashboard_exprs
from tests.system.deploy.test_metrics_exported import _learner_exposition, _scrape_server, _worker_exposition

pytestmark = pytest.mark.slow

FALLBACK_RE = re.compile(r"\bor on\(\)\s*(label_replace\()?vector\(0\)")


def sample_names(text: str) -> set[str]:
    """Names of the samples (not merely the families) in a text exposition."""
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def queries_without_data(exprs: dict[str, list[dict]], samples: set[str]) -> list[str]:
    """ "panel: expr (names)" for each expression that names a metric with no sample and has no fallback."""
    out = []
    for title, targets in exprs.items():
        for target in targets:
            missing = sorted(n for n in set(_METRIC_RE.findall(target["expr"])) if n not in samples)
            if missing and not FALLBACK_RE.search(target["expr"]):
                out.append(f"{title}: {target['expr']} ({', '.join(missing)})")
    return out


def test_every_dashboard_query_has_data_on_a_fresh_stack():
    server_text, _port = _scrape_server()
    samples = sample_names(server_text) | sample_names(_worker_exposition()) | sample_names(_learner_exposition())
    empty = queries_without_data(_dashboard_exprs(), samples)
    assert not empty, (
        "dashboard queries with no data on a healthy stack: create the label values at zero "
        "or append `or on() vector(0)`:\n" + "\n".join(empty)
    )


def test_the_check_catches_a_labelled_counter_without_children():
    text = "# HELP a_total x\n# TYPE a_total counter\n# HELP b x\n# TYPE b gauge\nb 1.0\n"
    exprs = {
        "p": [
            {"expr": "sum(rate(prioreplay_a_total[1m]))"},
            {"expr": "prioreplay_b"},
            {"expr": "sum(rate(prioreplay_a_total[1m])) or on() vector(0)"},
        ]
    }
    samples = {"prioreplay_" + n for n in sample_names(text)}
    assert queries_without_data(exprs, samples) == ["p: sum(rate(prioreplay_a_total[1m])) (prioreplay_a_total)"]
