"""Router throughput, one process, short-circuit traffic (rule and cache hits).

    python bench/router_throughput.py       # writes bench/results/router_throughput.md

The ingress stream is filled with N requests first; then one router drains it
with `Router.run()`, the loop `laya router` runs (read, route, commit, the
counters it publishes each second and the reaper's pass every
`router.reap_interval_s`), in a thread of this process; the time runs from
starting the loop to the answer of the last request. Left out: only the signal
handlers `laya router` installs. Three runs, median. Baselines in the same
run, on the same server: RQ's `enqueue_many` (one pipeline per 1,000 jobs) and
single `enqueue` calls — what a router that turned every request into a job
would be bound by.

Target: ≥ 30,000 requests/s.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from common import start_valkey, write_results
from redis import Redis

N = 50_000
RUNS = 3
ROUTES = Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml"


def drain(redis: Redis, url: str) -> float:
    import threading

    from laya.cache import cache_key
    from laya.client import Client
    from laya.config import Settings
    from laya.router import Router
    from laya.schema import Request

    redis.flushall()
    settings = Settings.model_validate({"redis": {"url": url}, "router": {"routes_file": str(ROUTES)}})
    router = Router(settings, redis, consumer="bench")
    cached = Request(prompt="what is laya?", max_tokens=64)
    redis.set(f"laya:cache:{cache_key(cached, 'default', 64)}", b'{"text":"a router","model":"default"}')
    texts = ["hello", "ping", "echo: batch", "what are the opening hours", "what is laya?"]
    client = Client(redis)
    client.submit_many({"prompt": texts[i % 5], "max_tokens": 64} for i in range(N - 1))
    last = client.submit_many([{"id": "the-last-one", "prompt": "hello", "max_tokens": 64}])[0]
    loop = threading.Thread(target=router.run)
    started = time.perf_counter()
    loop.start()
    client.wait(last, timeout=600)  # entries are committed in order: the last answer comes last
    elapsed = time.perf_counter() - started
    router.stop()
    loop.join()
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
            queue.enqueue_many([Queue.prepare_data("laya.jobs.generate", args=[{"i": i}])
                                for i in range(chunk, chunk + 1000)], pipeline=pipe)
            pipe.execute()
    many = 20_000 / (time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(3000):
        queue.enqueue("laya.jobs.generate", {"i": i})
    single = 3000 / (time.perf_counter() - started)
    return many, single


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        redis = Redis.from_url(url)
        try:
            rates = [drain(redis, url) for _ in range(RUNS)]
            many, single = rq_rates(redis)
        finally:
            server.stop()
    laya = statistics.median(rates)
    lines = [f"# Router throughput, one process, short-circuit traffic ({N:,} requests, median of {RUNS})", "",
             "| method | requests/s | vs Laya |", "|---|---:|---:|",
             (f"| Laya router (rule and cache hits; runs: {', '.join(f'{r:,.0f}' for r in rates)}) "
              f"| {laya:,.0f} | 1.00x |"),
             f"| RQ enqueue_many, 1,000 per pipeline | {many:,.0f} | {many / laya:.2f}x |",
             f"| RQ enqueue, one call each | {single:,.0f} | {single / laya:.2f}x |", "",
             f"Target ≥ 30,000 requests/s: {'met' if laya >= 30_000 else 'NOT met'}."]
    write_results("router_throughput.md", lines,
                  run=(f"Laya {laya:,.0f} requests/s (runs {', '.join(f'{r:,.0f}' for r in rates)}); "
                       f"RQ enqueue_many {many:,.0f} jobs/s, enqueue {single:,.0f} jobs/s; "
                       f"target {'met' if laya >= 30_000 else 'NOT met'}"))


if __name__ == "__main__":
    main()
