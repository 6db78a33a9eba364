"""Prometheus metrics: every router and worker process serves its own ``/metrics``.

**One port per process**, ``[metrics] port`` + ``[metrics] offset`` (``laya up``
gives the router offset 0 and the worker offset 1; in containers every process
has a network namespace of its own and keeps offset 0), rather than
prometheus_client's multiprocess mode. The multiprocess mode needs a directory
shared by every process, named in an environment variable before
prometheus_client is imported, files that must be cleaned when a process dies,
one aggregating exporter per host, and it writes each update through an mmap,
which is slower than a Python integer. Laya's processes run on different hosts
and in different containers anyway, Prometheus labels each target with its
``instance``, and a process restarted by ``laya up`` starts its counters afresh,
which Prometheus's ``rate()`` and ``increase()`` are built to handle.

**The router's hot path touches no prometheus_client object.** It already
counts routes and keeps decision times for ``laya stats``; :class:`RouterMetrics`
folds those into plain integer buckets once per batch, after the batch is
committed, and builds the metric families only when Prometheus scrapes
(``bench/routing.py`` and ``bench/router_throughput.py`` measure what that
costs). Workers run one job at a time, milliseconds to minutes each, so they
use prometheus_client's own metric objects.

Every name is in :data:`METRIC_NAMES`; ``deploy/grafana-dashboard.json`` may
query only those (``tests/unit/test_metrics.py`` checks it).
"""

from __future__ import annotations

import logging
import math
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client import Counter as PromCounter
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from laya.config import MetricsConfig

__all__ = ["METRIC_NAMES", "Buckets", "RouterMetrics", "WorkerMetrics", "new_registry", "route_labels", "serve"]

log = logging.getLogger("laya.metrics")

# Bucket bounds. The router's are in nanoseconds (what it measures), exported in seconds.
DECISION_BUCKETS_NS = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 1_000_000, 10_000_000)
ROUND_TRIP_BUCKETS_NS = (100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000,
                         100_000_000, 1_000_000_000)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
JOB_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)

METRIC_NAMES: dict[str, str] = {
    # router
    "laya_router_requests_total": "counter",
    "laya_router_decision_seconds": "histogram",
    "laya_router_batch_route_seconds": "histogram",
    "laya_router_batch_size": "histogram",
    "laya_router_commit_seconds": "histogram",
    "laya_router_ingress_backlog": "gauge",
    "laya_router_ingress_pending": "gauge",
    "laya_router_rules": "gauge",
    "laya_queue_depth": "gauge",
    # worker
    "laya_worker_jobs_total": "counter",
    "laya_worker_queue_wait_seconds": "histogram",
    "laya_worker_ttft_seconds": "histogram",
    "laya_worker_decode_tokens_per_second": "histogram",
    "laya_worker_job_seconds": "histogram",
    "laya_worker_prompt_tokens_total": "counter",
    "laya_worker_prompt_cached_tokens_total": "counter",
    "laya_worker_completion_tokens_total": "counter",
    "laya_worker_busy": "gauge",
    "laya_worker_starts_total": "counter",
    "laya_worker_memory_planned_bytes": "gauge",
    "laya_worker_memory_used_bytes": "gauge",
    # the HTTP front door (laya serve)
    "laya_http_requests_total": "counter",
    "laya_http_request_seconds": "histogram",
    "laya_batch_lines_total": "counter",
    # prometheus_client's process collector, in every process
    "process_resident_memory_bytes": "gauge",
    "process_cpu_seconds_total": "counter",
    "process_start_time_seconds": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
}
"""Every metric a Laya process exports, with its type."""

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}


def sample_names() -> frozenset[str]:
    """The names of the samples a scrape can hold (a histogram's ``_bucket``, ``_sum`` and ``_count``)."""
    return frozenset(name + suffix for name, kind in METRIC_NAMES.items() for suffix in _SUFFIXES[kind])


def new_registry() -> CollectorRegistry:
    """A registry of this process's own (not prometheus_client's global one, so tests can hold several)."""
    # No `_created` series: they double the worker's sample count and no Laya panel or alert reads them
    # (prometheus_client's switch is process-wide; a Laya process serves Laya's metrics only).
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


def serve(registry: CollectorRegistry, config: MetricsConfig, role: str) -> int:
    """Serve ``registry`` on ``config``'s port in a daemon thread; the port, or 0 when off or taken.

    A port already taken is logged and the process runs on without metrics:
    routing and inference matter more than their figures.
    """
    port = config.serve_port
    if not port:
        return 0
    try:
        start_http_server(port, addr=config.bind, registry=registry)
    except OSError as exc:
        log.error("metrics: cannot listen on %s:%d (%s); this %s runs without metrics. Give each process on "
                  "a host its own port ([metrics] offset, or LAYA_METRICS__OFFSET), or set [metrics] port = 0 "
                  "to turn metrics off", config.bind, port, exc.strerror or exc, role)
        return 0
    log.info("metrics on http://%s:%d/metrics", config.bind, port)
    return port


class Buckets:
    """A histogram kept as plain integers: adding is one bisect and two additions, with no lock.

    Only one thread adds to a given instance; a scrape reads a copy of the
    counts, so at worst it misses the value being added.
    """

    __slots__ = ("bounds", "counts", "scale", "total")

    def __init__(self, bounds: Sequence[float], scale: float = 1.0) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.scale = scale
        """Exported value = measured value × scale (nanoseconds → seconds)."""
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bisect_left: a value equal to a bound is ≤ it
        self.total += value

    def family(self, name: str, doc: str, labels: dict[str, str] | None = None) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(labels or {}))
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), list(self.counts), strict=True):
            cumulative += count
            buckets.append((_le(bound * self.scale), float(cumulative)))
        family.add_metric(list((labels or {}).values()), buckets, self.total * self.scale)
        return family


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``+Inf``, ``1e-06``, ``0.25``)."""
    return "+Inf" if math.isinf(bound) else repr(float(f"{bound:.6g}"))


def route_labels(route: str) -> tuple[str, str]:
    """A router route (``model:default``, ``rule:greeting``, ``error:invalid_json``) as (route, model) labels.

    Rules are counted together (``rule``): a rule set may hold thousands, and
    each label value is a time series; ``laya stats`` shows them one by one.
    """
    kind, _, detail = route.partition(":")
    if kind == "model":
        return "model", detail
    if kind in ("rule", "rejected"):
        return kind, ""
    return route, ""


class RouterMetrics(Collector):
    """What one router exports, collected from figures the router keeps anyway."""

    def __init__(self) -> None:
        self.decision = Buckets(DECISION_BUCKETS_NS, 1e-9)
        self.batch_route = Buckets(ROUND_TRIP_BUCKETS_NS, 1e-9)
        self.batch_size = Buckets(BATCH_SIZE_BUCKETS)
        self.commit = Buckets(ROUND_TRIP_BUCKETS_NS, 1e-9)
        self._routes: Counter[str] = Counter()
        self._queue_depth: dict[tuple[str, str], int] = {}
        self._backlog = self._pending = self._rules = 0
        self._lock = threading.Lock()  # the published figures: the router thread writes, a scrape reads

    def routed(self, decisions_ns: Iterable[int], batch_ns: int, size: int) -> None:
        """A batch was routed: each request's decision time, and the batch's."""
        decision = self.decision
        counts, bounds, total = decision.counts, decision.bounds, 0
        for ns in decisions_ns:  # Buckets.add, inlined: this loop runs once per request
            counts[bisect_left(bounds, ns)] += 1
            total += ns
        decision.total += total
        self.batch_route.add(batch_ns)
        self.batch_size.add(size)

    def published(self, routes: Counter[str], *, queue_depth: dict[tuple[str, str], int], backlog: int,
                  pending: int, rules: int) -> None:
        """The counts since the last call, and the gauges the router read for ``laya stats``."""
        with self._lock:
            self._routes.update(routes)
            self._queue_depth = dict(queue_depth)
            self._backlog, self._pending, self._rules = backlog, pending, rules

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            routes = dict(self._routes)
            depths = dict(self._queue_depth)
            backlog, pending, rules = self._backlog, self._pending, self._rules
        requests = CounterMetricFamily("laya_router_requests", "Requests answered or enqueued, by route",
                                       labels=["route", "model"])
        totals: Counter[tuple[str, str]] = Counter()
        for route, count in routes.items():
            totals[route_labels(route)] += count
        for labels, count in sorted(totals.items()):
            requests.add_metric(labels, count)
        yield requests
        yield self.decision.family("laya_router_decision_seconds",
                                   "Routing decision per request (rules, cache, admission; not the batch wait)")
        yield self.batch_route.family("laya_router_batch_route_seconds",
                                      "Time to route one batch through the stages, its Redis cache read included")
        yield self.batch_size.family("laya_router_batch_size", "Stream entries per batch read")
        yield self.commit.family("laya_router_commit_seconds", "One batch's atomic write to Redis")
        depth = GaugeMetricFamily("laya_queue_depth", "Jobs waiting in a model queue", labels=["model", "lane"])
        for (model, lane), value in sorted(depths.items()):
            depth.add_metric([model, lane], value)
        yield depth
        yield GaugeMetricFamily("laya_router_ingress_backlog",
                                "Ingress entries no router has read yet (the consumer group's lag)", value=backlog)
        yield GaugeMetricFamily("laya_router_ingress_pending",
                                "Ingress entries read by a router and not yet committed", value=pending)
        yield GaugeMetricFamily("laya_router_rules", "Rules loaded by this router", value=rules)


class WorkerMetrics:
    """What one worker exports, and the state its presence in Redis reports (see laya.worker.presence)."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        label = ["model"]

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, label, buckets=buckets, registry=registry).labels(model)

        def counter(name: str, doc: str) -> PromCounter:
            return PromCounter(name, doc, label, registry=registry).labels(model)

        self.queue_wait = histogram("laya_worker_queue_wait_seconds", "From the router's enqueue to the job's start",
                                    QUEUE_WAIT_BUCKETS_S)
        self.ttft = histogram("laya_worker_ttft_seconds", "From the job's start to its first generated token",
                              TTFT_BUCKETS_S)
        self.decode_rate = histogram("laya_worker_decode_tokens_per_second",
                                     "Decode rate of a job (after its first token)", TOKENS_PER_S_BUCKETS)
        self.job_seconds = histogram("laya_worker_job_seconds", "Wall time of a job in the worker", JOB_BUCKETS_S)
        self.prompt_tokens = counter("laya_worker_prompt_tokens", "Prompt tokens of finished jobs")
        self.cached_tokens = counter("laya_worker_prompt_cached_tokens",
                                     "Prompt tokens taken from the prompt cache instead of evaluated")
        self.completion_tokens = counter("laya_worker_completion_tokens", "Tokens generated")
        self.starts = counter("laya_worker_starts", "Worker processes started for this model, counted in Redis "
                                                    "(it survives the process: a restart adds one)")
        self._jobs = PromCounter("laya_worker_jobs", "Jobs finished, by outcome (ok or the error code)",
                                 ["model", "outcome"], registry=registry)
        self.busy = Gauge("laya_worker_busy", "1 while a job runs, else 0", label, registry=registry).labels(model)
        memory = ["model", "device"]
        self.planned = Gauge("laya_worker_memory_planned_bytes", "Memory the plan predicts, per device", memory,
                             registry=registry)
        self.used = Gauge("laya_worker_memory_used_bytes", "Memory in use: resident set (ram), this process "
                                                           "on the GPUs (vram)", memory, registry=registry)
        self.busy.set(0)
        self.job_id: str | None = None
        self.job_started: float | None = None
        """Wall-clock start of the running job, for ``laya stats``."""
        self.jobs_done = 0
        self.recent_rates: list[float] = []
        """Decode rates of the last jobs, newest last."""

    def started(self, job_id: str, at: float) -> None:
        self.job_id, self.job_started = job_id, at
        self.busy.set(1)

    def stopped(self, seconds: float) -> None:
        self.job_id = self.job_started = None
        self.busy.set(0)
        self.job_seconds.observe(seconds)

    def finished(self, *, outcome: str, queue_wait_s: float | None, ttft_s: float | None, rate: float | None,
                 prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> None:
        """A job wrote its result (``outcome``: ``ok`` or its error code)."""
        self._jobs.labels(self.model, outcome).inc()
        self.jobs_done += 1
        if queue_wait_s is not None:
            self.queue_wait.observe(queue_wait_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if rate is not None:
            self.decode_rate.observe(rate)
            self.recent_rates = [*self.recent_rates[-9:], rate]
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.completion_tokens.inc(completion_tokens)

    def memory(self, device: str, *, planned: int | None = None, used: int | None = None) -> None:
        if planned is not None:
            self.planned.labels(self.model, device).set(planned)
        if used is not None:
            self.used.labels(self.model, device).set(used)
