"""What a request costs the Redis primary: its CPU time and commands, and the request rate at which the
primary's one main thread is full.

    python bench/redis_cost.py        # writes bench/results/redis_cost.md

Valkey executes commands on one main thread, so however many routers and
workers share a primary, it tops out at one core: 1 s divided by the main
thread's CPU per request is the ceiling. The CPU comes from Valkey's own
``used_cpu_user_main_thread`` + ``used_cpu_sys_main_thread`` (INFO), read
before and after each kind of traffic, the commands from INFO commandstats.

* short-circuit, pipelined producer: 50,000 rule and cache hits submitted with
  ``submit_many`` and drained by one ``Router.run()`` (``router_throughput.py``'s
  loop, whose requests/s is the router's throughput per process, measured here
  in the same run);
* short-circuit, ``Client.ask``: 3,000 requests one at a time (XADD and BLPOP
  per request) while a router serves;
* model: 1,000 requests that become RQ jobs, run by a worker (``--burst``, tiny
  generated model, 2 tokens each): submit, route, enqueue, dequeue, heartbeats,
  result.

Three runs each; medians. The ratio to the router's throughput says how many
router processes one primary can feed before it is the limit.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import start_valkey, write_results
from redis import Redis
from router_throughput import ROUTES, drain

RUNS = 3
ASKS = 3_000
JOBS = 1_000


def main_thread_cpu(redis: Redis) -> float:
    info = redis.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def commands(redis: Redis) -> int:
    return sum(int(stat["calls"]) for stat in redis.info("commandstats").values())


def measure(redis: Redis, traffic: object, count: int) -> tuple[float, float, float]:
    """(main-thread CPU µs per request, commands per request, requests/s) of ``traffic()`` on ``count`` requests."""
    redis.flushall()
    cpu, calls, started = main_thread_cpu(redis), commands(redis), time.perf_counter()
    traffic()  # type: ignore[operator]
    elapsed = time.perf_counter() - started
    return ((main_thread_cpu(redis) - cpu) * 1e6 / count, (commands(redis) - calls) / count, count / elapsed)


def asks(url: str, redis: Redis) -> None:
    from laya.client import Client
    from laya.config import Settings
    from laya.router.ingress import Router

    settings = Settings.model_validate({"redis": {"url": url}, "router": {"routes_file": str(ROUTES),
                                                                          "block_ms": 100}})
    router = Router(settings, redis, consumer="cost")
    loop = threading.Thread(target=router.run)
    loop.start()
    client = Client.from_url(url)
    for i in range(ASKS):
        assert client.ask("hello" if i % 2 else "echo: cost", timeout=30).ok
    router.stop()
    loop.join()


def jobs(url: str, redis: Redis, model: Path) -> None:
    from laya.client import Client
    from laya.config import Settings
    from laya.router.ingress import Router
    from laya.worker.backend import LlamaBackend
    from laya.worker.rqworker import run_worker

    settings = Settings.model_validate({"redis": {"url": url}, "model": {"path": str(model)},
                                        "router": {"block_ms": 100, "max_queue_depth": 100_000},
                                        "runtime": {"max_seq_len": 256}})
    client = Client.from_url(url)
    channel = client.new_channel()
    ids = client.submit_many(({"prompt": f"job {i}", "max_tokens": 2, "cache": False} for i in range(JOBS)),
                             reply_to=channel)
    router = Router(settings, redis, consumer="cost")
    loop = threading.Thread(target=router.run)
    loop.start()
    while redis.xlen("laya:ingress"):
        time.sleep(0.05)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    answers = list(client.wait_many(ids, channel, timeout=60))
    router.stop()
    loop.join()
    assert len(answers) == JOBS and all(a.route == "model:default" for a in answers)


def main() -> None:
    from laya.worker.tinymodel import write_tiny_model

    rows: dict[str, list[tuple[float, float, float]]] = {"short-circuit, pipelined producer": [],
                                                         "short-circuit, `Client.ask`": [], "model job": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        redis = Redis.from_url(url)
        router_rates: list[float] = []
        try:
            for _ in range(RUNS):
                cost = measure(redis, lambda: router_rates.append(drain(redis, url)), 50_000)
                rows["short-circuit, pipelined producer"].append(cost)
                rows["short-circuit, `Client.ask`"].append(measure(redis, lambda: asks(url, redis), ASKS))
                rows["model job"].append(measure(redis, lambda: jobs(url, redis, model), JOBS))
        finally:
            server.stop()
    router = statistics.median(router_rates)
    lines = [f"# What a request costs the Redis primary (median of {RUNS} runs)", "",
             (f"One router process drains {router:,.0f} short-circuit requests/s (runs "
              f"{', '.join(f'{r:,.0f}' for r in router_rates)})."), "",
             ("| traffic | primary main-thread CPU per request | commands per request | requests/s at a full "
              "main thread | routers (at the rate above) to reach it |"), "|---|---:|---:|---:|---:|"]
    summary = []
    for name, costs in rows.items():
        cpu = statistics.median(c[0] for c in costs)
        calls = statistics.median(c[1] for c in costs)
        ceiling = 1e6 / cpu
        # Only pipelined producers keep a router busy; `ask` producers wait a round trip per request.
        routers = f"{ceiling / router:.1f}" if name.endswith("pipelined producer") else "—"
        lines.append(f"| {name} | {cpu:.1f} µs | {calls:.2f} | {ceiling:,.0f} | {routers} |")
        summary.append(f"{name}: {cpu:.1f} µs, ceiling {ceiling:,.0f}/s")
    write_results("redis_cost.md", lines, run=f"router {router:,.0f}/s; " + "; ".join(summary))


if __name__ == "__main__":
    main()
