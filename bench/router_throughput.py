"""Router throughput, one process, short-circuit traffic (rule and cache hits).

    python bench/router_throughput.py       # writes bench/results/router_throughput.md

The ingress stream is filled with N requests first; then one router drains it
with `Router.run()`, the loop `laya router` runs (read, route, commit, the
counters it publishes each second and the reaper's pass every
`router.reap_interval_s`), in a thread of this process; the time runs from
starting the loop to the answer of the last request. Left out: only the signal
handlers `laya router` installs. Seven runs, median. Baselines in the same
run, on the same server: RQ's `enqueue_many` (one pipeline per 1,000 jobs) and
single `enqueue` calls — what a router that turned every request into a job
would be bound by.

With and without Prometheus metrics in the same run, runs alternating: with
them, the router keeps its metrics (laya.metrics), serves them over HTTP, and a
scraper reads them every second while the router drains (Prometheus's default
is every 15 s). ``--no-metrics`` leaves that part out.

Targets: ≥ 30,000 requests/s; metrics cost ≤ 3 % of it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import start_valkey, write_results
from redis import Redis

N = 50_000
RUNS = 7
ROUTES = Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml"


def scrape_every_second(port: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            response.read()


def drain(redis: Redis, url: str, metrics: bool = False) -> float:
    from laya.client import Client
    from laya.config import Settings
    from laya.router.cache import cache_key
    from laya.router.ingress import Router
    from laya.schema import Request

    redis.flushall()
    settings = Settings.model_validate({"redis": {"url": url}, "router": {"routes_file": str(ROUTES)}})
    router_metrics = scraper = None
    stop_scraping = threading.Event()
    if metrics:
        from prometheus_client import start_http_server

        from laya.metrics import RouterMetrics, new_registry

        router_metrics = RouterMetrics()
        registry = new_registry()
        registry.register(router_metrics)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        scraper = threading.Thread(target=scrape_every_second, args=(server.server_port, stop_scraping))
    router = Router(settings, redis, consumer="bench", metrics=router_metrics)
    cached = Request(prompt="what is laya?", max_tokens=64)
    redis.set(f"laya:cache:{cache_key(cached, 'default', 64)}", b'{"text":"a router","model":"default"}')
    texts = ["hello", "ping", "echo: batch", "what are the opening hours", "what is laya?"]
    client = Client(redis)
    client.submit_many({"prompt": texts[i % 5], "max_tokens": 64} for i in range(N - 1))
    last = client.submit_many([{"id": "the-last-one", "prompt": "hello", "max_tokens": 64}])[0]
    loop = threading.Thread(target=router.run)
    started = time.perf_counter()
    loop.start()
    if scraper is not None:
        scraper.start()
    client.wait(last, timeout=600)  # entries are committed in order: the last answer comes last
    elapsed = time.perf_counter() - started
    router.stop()
    loop.join()
    stop_scraping.set()
    if scraper is not None:
        scraper.join()
        server.shutdown()
    assert redis.xlen("laya:ingress") == 0, "entries left unrouted"
    stats = redis.hgetall("laya:stats:router")
    assert not any(k.startswith(b"count:model:") for k in stats), stats
    return N / elapsed


def rq_rates(redis: Redis) -> tuple[float, float]:
    from rq import Queue

    redis.flushall()
    queue = Queue("bench", connection=redis, serializer="json")
    started = time.perf_counter()
    for chunk in range(0, 20_000, 1000):
        with redis.pipeline() as pipe:
            queue.enqueue_many([Queue.prepare_data("laya.worker.jobs.generate", args=[{"i": i}])
                                for i in range(chunk, chunk + 1000)], pipeline=pipe)
            pipe.execute()
    many = 20_000 / (time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(3000):
        queue.enqueue("laya.worker.jobs.generate", {"i": i})
    single = 3000 / (time.perf_counter() - started)
    return many, single


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        redis = Redis.from_url(url)
        with_metrics = "--no-metrics" not in sys.argv[1:]
        try:
            rates, metric_rates = [], []
            for _ in range(RUNS):  # alternating, so a change in the machine's load falls on both sides
                rates.append(drain(redis, url))
                if with_metrics:
                    metric_rates.append(drain(redis, url, metrics=True))
            many, single = rq_rates(redis)
        finally:
            server.stop()
    laya = statistics.median(rates)
    lines = [f"# Router throughput, one process, short-circuit traffic ({N:,} requests, median of {RUNS})", "",
             "| method | requests/s | vs Laya |", "|---|---:|---:|",
             (f"| Laya router (rule and cache hits, no metrics; runs: {', '.join(f'{r:,.0f}' for r in rates)}) "
              f"| {laya:,.0f} | 1.00x |"),
             f"| RQ enqueue_many, 1,000 per pipeline | {many:,.0f} | {many / laya:.2f}x |",
             f"| RQ enqueue, one call each | {single:,.0f} | {single / laya:.2f}x |", "",
             f"Target ≥ 30,000 requests/s: {'met' if laya >= 30_000 else 'NOT met'}."]
    run = (f"Laya {laya:,.0f} requests/s (runs {', '.join(f'{r:,.0f}' for r in rates)}); "
           f"RQ enqueue_many {many:,.0f} jobs/s, enqueue {single:,.0f} jobs/s; "
           f"target {'met' if laya >= 30_000 else 'NOT met'}")
    if metric_rates:
        on = statistics.median(metric_rates)
        # Each run with metrics against the run without just before it: the load of a shared machine
        # drifts between runs more than metrics cost, and a pair sees the same load.
        pairs = [(off - with_) / off * 100 for off, with_ in zip(rates, metric_rates, strict=True)]
        cost = statistics.median(pairs)
        verdict = "met" if cost <= 3 else "NOT met"
        lines[5:5] = [(f"| Laya router with metrics, scraped every second (runs "
                       f"{', '.join(f'{r:,.0f}' for r in metric_rates)}) | {on:,.0f} | {on / laya:.2f}x |")]
        lines.append(f"Metrics cost {cost:+.1f} % of the throughput, median of {RUNS} pairs of runs one after the "
                     f"other (target ≤ 3 %): {verdict}. The pairs: {', '.join(f'{p:+.1f} %' for p in pairs)}; "
                     "where they spread wider than the target, the machine's load decided them, not metrics.")
        run += f"; with metrics {on:,.0f} requests/s ({cost:+.1f} % in pairs, target {verdict})"
    write_results("router_throughput.md", lines, run=run)


if __name__ == "__main__":
    main()
