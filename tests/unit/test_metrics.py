"""The metric names Laya exports, the bucket arithmetic, and the Grafana dashboard that queries them."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from laya.metrics import (
    METRIC_NAMES,
    Buckets,
    RouterMetrics,
    WorkerMetrics,
    new_registry,
    route_labels,
    sample_names,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
PROMQL_WORDS = {"sum", "by", "rate", "max", "histogram_quantile", "le", "model", "lane", "route", "device",
                "outcome", "instance", "without", "avg", "increase"}


def exported_families() -> set[str]:
    """The families a router's, a worker's and the front door's registries hold (no traffic needed: all are
    declared up front)."""
    from laya.http.app import HttpMetrics

    registry = new_registry()
    registry.register(RouterMetrics())
    WorkerMetrics(registry, "default")
    text = generate_latest(registry).decode() + generate_latest(HttpMetrics().registry).decode()
    return {family.name + ("_total" if family.type == "counter" else "")
            for family in text_string_to_metric_families(text)}


def test_metric_names_list_exactly_what_the_processes_export() -> None:
    assert exported_families() == set(METRIC_NAMES)
    for name, kind in METRIC_NAMES.items():
        assert name.startswith(("laya_", "process_")), name
        assert (kind == "counter") == name.endswith("_total"), name  # Prometheus naming conventions


def test_every_dashboard_query_names_a_metric_laya_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 15
    known = sample_names()
    used: Counter[str] = Counter()
    for expr in exprs:
        names = {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", re.sub(r"\[[^\]]*\]|\{[^}]*\}", "", expr))
                 if w not in PROMQL_WORDS and not w.startswith("__")}
        assert names, f"query names no metric: {expr}"
        assert names <= known, f"{expr!r} names {sorted(names - known)}, which Laya does not export"
        used.update(names)
    # The five views: route mix, latency, queue depth, tok/s, memory.
    for needed in ("laya_router_requests_total", "laya_router_decision_seconds_bucket", "laya_queue_depth",
                   "laya_worker_completion_tokens_total", "laya_worker_memory_used_bytes"):
        assert used[needed], needed


def test_a_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    buckets = Buckets((1, 5, 10))
    for value in (0, 1, 2, 5, 11):
        buckets.add(value)
    family = buckets.family("x", "doc")
    counts = {s.labels["le"]: s.value for s in family.samples if s.name == "x_bucket"}
    assert counts == {"1.0": 2, "5.0": 4, "10.0": 4, "+Inf": 5}
    assert [s.value for s in family.samples if s.name in ("x_count", "x_sum")] == [5, 19]


def test_routes_become_bounded_labels() -> None:
    assert route_labels("model:default") == ("model", "default")
    assert route_labels("rule:greeting") == ("rule", "")
    assert route_labels("rejected:overloaded") == ("rejected", "")
    assert route_labels("error:invalid_json") == ("error:invalid_json", "")
    assert route_labels("cache") == ("cache", "")


def test_router_counts_add_up_across_publishes() -> None:
    metrics = RouterMetrics()
    metrics.published(Counter({"rule:a": 2, "rule:b": 1, "model:default": 4}), queue_depth={("default", ""): 3},
                      backlog=7, pending=2, rules=2)
    metrics.published(Counter({"rule:a": 1, "cache": 5}), queue_depth={("default", ""): 1}, backlog=0, pending=0,
                      rules=2)
    registry = CollectorRegistry()
    registry.register(metrics)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert samples[("laya_router_requests_total", (("model", ""), ("route", "rule")))] == 4
    assert samples[("laya_router_requests_total", (("model", "default"), ("route", "model")))] == 4
    assert samples[("laya_router_requests_total", (("model", ""), ("route", "cache")))] == 5
    assert samples[("laya_queue_depth", (("lane", ""), ("model", "default")))] == 1
    assert samples[("laya_router_ingress_backlog", ())] == 0
