"""Operating a running stack: Prometheus metrics, `laya stats`, `laya health`.

A real router and worker (``python -m laya ROLE``) on a real Valkey and the
tiny generated model, each serving its own metrics port; the test scrapes
them and parses the text with prometheus_client's own parser.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from laya.client import Client
from laya.codec import FIELD
from laya.config import Settings
from laya.metrics import sample_names
from laya.ops.health import check_health
from laya.router.ingress import Router

from ..conftest import Server, free_port
from ..processes import start_laya, stop_laya

BIN = Path(sys.executable).parent
HEARTBEAT_S = 0.2


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``http://127.0.0.1:port/metrics``: (name, labels) → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def eventually(check: Callable[[], Any], timeout: float = 20) -> Any:
    """``check()`` once it stops raising AssertionError (the router publishes once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def laya(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "laya"), *args], capture_output=True, text=True, timeout=60, env=env,
                          check=False)


@pytest.fixture
def stack(redis: Redis, redis_server: Server, tiny_model: Path,
          routes_file: Path) -> Iterator[tuple[dict[str, str], dict[str, int], dict[str, subprocess.Popen[bytes]]]]:
    ports = {"router": free_port(), "worker": free_port()}
    env = {**os.environ, "LAYA_REDIS_URL": redis_server.url, "LAYA_MODEL_PATH": str(tiny_model),
           "LAYA_ROUTES": str(routes_file), "LAYA_ROUTER__BLOCK_MS": "100",
           "LAYA_RUNTIME__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S)}
    procs = {role: start_laya(role, {**env, "LAYA_METRICS__PORT": str(port)}) for role, port in ports.items()}
    yield env, ports, procs
    stop_laya(*procs.values())


def test_counters_move_exactly_as_the_requests_sent_say(redis: Redis, stack: Any) -> None:
    env, ports, _ = stack
    client = Client(redis)
    assert client.ask("hello", timeout=30).route == "rule:greeting"  # the router serves; the worker has loaded
    eventually(lambda: assert_beating(env))
    before = {role: scrape(port) for role, port in ports.items()}
    sent = ["hello", "hi", "ping", "opening hours?", "jello", "kelp", "summarize: queues"]
    results = [client.wait(i, timeout=60) for i in [client.submit(t, max_tokens=4) for t in sent]]
    redis.xadd("laya:ingress", {FIELD: b"{not json"})
    redis.xadd("laya:ingress", {FIELD: orjson.dumps({"prompt": "x", "max_tokens": -1})})
    routes = [r.route for r in results]
    assert routes == ["rule:greeting", "rule:greeting", "rule:ping", "rule:hours", "model:default",
                      "model:default", "model:default"]

    def router_moved() -> dict[Any, float]:
        after = scrape(ports["router"])
        moved = {(route, model): value(after, "laya_router_requests_total", route=route, model=model)
                 - value(before["router"], "laya_router_requests_total", route=route, model=model)
                 for route, model in [("rule", ""), ("model", "default"), ("error:invalid_json", ""),
                                      ("error:invalid_request", ""), ("cache", "")]}
        assert moved == {("rule", ""): 4, ("model", "default"): 3, ("error:invalid_json", ""): 1,
                         ("error:invalid_request", ""): 1, ("cache", ""): 0}, moved
        return after

    after = eventually(router_moved)
    decisions = (value(after, "laya_router_decision_seconds_count")
                 - value(before["router"], "laya_router_decision_seconds_count"))
    assert decisions == 9  # one per request, the two bad ones included
    assert value(after, "laya_router_rules") == 4
    assert ("laya_queue_depth", frozenset({("model", "default"), ("lane", "bulk")})) in after
    assert value(after, "laya_queue_depth", model="default", lane="bulk") == 0

    def worker_moved() -> dict[Any, float]:
        after = scrape(ports["worker"])
        assert value(after, "laya_worker_busy", model="default") == 0  # the last job has finished

        def delta(name: str, **labels: str) -> float:
            return value(after, name, model="default", **labels) - value(before["worker"], name, model="default",
                                                                        **labels)

        assert delta("laya_worker_jobs_total", outcome="ok") == 3
        assert delta("laya_worker_job_seconds_count") == 3
        assert delta("laya_worker_queue_wait_seconds_count") == 3
        assert delta("laya_worker_ttft_seconds_count") == 3
        model_results = [r for r in results if r.route == "model:default"]
        assert delta("laya_worker_completion_tokens_total") == sum(r.usage.completion_tokens for r in model_results)
        assert delta("laya_worker_prompt_tokens_total") == sum(r.usage.prompt_tokens for r in model_results)
        cached = delta("laya_worker_prompt_cached_tokens_total")
        assert 0 <= cached < sum(r.usage.prompt_tokens for r in model_results)
        assert value(after, "laya_worker_starts_total", model="default") == 1
        assert value(after, "laya_worker_memory_used_bytes", model="default", device="ram") > 0
        assert value(after, "laya_worker_memory_planned_bytes", model="default", device="ram") > 0
        return after

    eventually(worker_moved)
    exported = {name for port in ports.values() for name, _ in scrape(port)
                if name.startswith(("laya_", "process_")) and not name.endswith("_created")}
    assert exported - sample_names() == set(), "metrics exported but not listed in laya.metrics.METRIC_NAMES"


def value_is(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], expected: float, name: str,
             **labels: str) -> None:
    assert value(samples, name, **labels) == expected, (name, labels, value(samples, name, **labels))


def assert_beating(env: dict[str, str]) -> dict[str, Any]:
    done = laya(env, "stats", "--json")
    assert done.returncode == 0, done.stderr
    snap: dict[str, Any] = orjson.loads(done.stdout)
    assert [w["state"] for w in snap["workers"]] == ["idle"], snap["workers"]
    return snap


def test_stats_health_and_a_worker_that_dies(redis: Redis, stack: Any) -> None:
    env, _, procs = stack
    client = Client(redis)
    assert client.ask("hello", timeout=30).route == "rule:greeting"
    assert client.ask("jello", timeout=30, max_tokens=4).route == "model:default"

    def published() -> dict[str, Any]:
        snap = assert_beating(env)
        assert {r["route"]: r["count"] for r in snap["routes"]} == {"rule:greeting": 1, "model:default": 1}
        return snap

    snap = eventually(published)
    assert snap["schema"] == 1 and snap["router"]["rules"] == 4
    assert snap["queues"] == [{"model": "default", "lane": lane, "queue": f"laya:llm:default:{lane}", "depth": 0,
                               "oldest_age_s": None} for lane in ("high", "normal", "bulk")]
    worker = snap["workers"][0]
    assert worker["jobs_done"] == 1 and worker["plan"] == "fits" and worker["ram_used_bytes"] > 0
    # The decision is the request's own, as `bench/routing.py` times it: not the batch wait around it.
    assert 0 < snap["decision_us"]["p50"] < snap["batch_us"]["p50"]

    text = laya(env, "stats").stdout
    assert "rule:greeting" in text and "50.0 %" in text and "idle" in text and "MiB" in text

    healthy = laya(env, "health")
    assert healthy.returncode == 0, healthy.stderr
    assert "1 router(s) reading" in healthy.stdout and "model default: 1 worker(s) beating" in healthy.stdout
    quiet = laya(env, "health", "--role", "router", "--quiet")
    assert (quiet.returncode, quiet.stdout) == (0, "")
    assert laya(env, "health", "--role", "worker").returncode == 0
    other = laya(env, "health", "--model", "other")
    assert other.returncode == 1 and "model other: no worker has beaten; start `laya worker`" in other.stderr

    procs["worker"].send_signal(signal.SIGKILL)
    procs["worker"].wait()

    def gone() -> None:
        snap = orjson.loads(laya(env, "stats", "--json").stdout)
        assert [w["state"] for w in snap["workers"]] == ["gone"], snap["workers"]

    eventually(gone)
    sick = laya(env, "health")
    assert sick.returncode == 1
    assert "FAIL model default: its last worker" in sick.stderr and "stopped beating" in sick.stderr
    assert laya(env, "health", "--role", "worker").returncode == 1
    assert laya(env, "health", "--role", "router").returncode == 0  # the router's container stays healthy

    # With no worker, jobs wait: one row per model and lane, with the age of the oldest job.
    client.submit("kelp", max_tokens=4, priority="bulk", cache=False)
    client.submit("jelly", max_tokens=4, priority="bulk", cache=False)

    def queued() -> dict[str, Any]:
        snap = orjson.loads(laya(env, "stats", "--json").stdout)
        depths = {q["lane"]: q["depth"] for q in snap["queues"]}
        assert depths == {"high": 0, "normal": 0, "bulk": 2}, depths
        return snap

    time.sleep(0.5)
    bulk = eventually(queued)["queues"][2]
    assert bulk["oldest_age_s"] is not None and 0 <= bulk["oldest_age_s"] < 60
    assert re.search(r"^default\s+bulk\s+2\s+\d+\.\d s$", laya(env, "stats").stdout, re.MULTILINE)
    router_port = stack[1]["router"]
    eventually(lambda: value_is(scrape(router_port), 2, "laya_queue_depth", model="default", lane="bulk"))



def test_a_worker_that_stops_cleanly_leaves_the_list(redis: Redis, stack: Any) -> None:
    env, _, procs = stack
    eventually(lambda: assert_beating(env))
    watch = subprocess.Popen([str(BIN / "laya"), "stats", "--watch", "0.2"], env=env, stdout=subprocess.PIPE)
    time.sleep(1.5)
    watch.send_signal(signal.SIGINT)
    out = watch.communicate(timeout=20)[0].decode()
    assert watch.returncode == 130
    frames = out.split("\x1b[H")[1:]  # each refresh homes the cursor, draws, and clears the rest
    assert len(frames) >= 2 and all(f.endswith("Ctrl-C stops)\x1b[J") and "Workers" in f for f in frames), out
    stop_laya(procs["worker"])
    snap = orjson.loads(laya(env, "stats", "--json").stdout)
    assert snap["workers"] == []


def test_health_names_what_is_missing(redis: Redis, settings: Settings) -> None:
    health = check_health(redis, settings)
    assert not health.ok
    assert health.problems == [
        "no router has read laya:ingress: its consumer group does not exist; start `laya router`",
        "model default: no worker has beaten; start `laya worker` for it"]
    Router(settings, redis).ensure_group()  # a router that created the group but never read
    health = check_health(redis, settings, models=[])
    assert health.problems == ["no router has tried to read laya:ingress within 5.3 s; start `laya router`"]


def test_a_router_that_stopped_reading_counts_as_gone(redis: Redis, settings: Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from laya.ops import health

    monkeypatch.setattr(health, "router_silence_s", lambda _settings: 0.3)
    Router(settings, redis).ensure_group()
    redis.xreadgroup("routers", "r1", {"laya:ingress": ">"}, count=1)
    assert check_health(redis, settings, models=[]).ok
    time.sleep(0.5)
    assert check_health(redis, settings, models=[]).problems == [
        "no router has tried to read laya:ingress within 0.3 s; start `laya router`"]
    redis.xreadgroup("routers", "r1", {"laya:ingress": ">"}, count=1)
    assert check_health(redis, settings, models=[]).ok
