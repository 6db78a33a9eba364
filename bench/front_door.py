"""`laya serve`, the OpenAI-compatible front door: what HTTP adds over `Client`, with baselines in the same run.

    python bench/front_door.py    # writes bench/results/front_door.md

A throwaway Valkey, a `laya router` and a `laya serve` process (started by
environment, as a user would, metrics off), and for part 3 a `laya worker` on
the tiny generated model. Baselines are measured in the same run, on the same
stack, interleaved or alternating with Laya's requests:

1. a rule-answered ``POST /v1/chat/completions`` ("hello"), one keep-alive
   httpx2 client (the client the openai package uses), one request at a time,
   against ``Client.ask("hello")``; a minimal Starlette endpoint (one POST route,
   a fixed JSON answer, served by uvicorn with `laya serve`'s options) shows the
   HTTP stack's own share, and a plain-socket client sending the same bytes the
   share of httpx2. Targets: p50 ≤ 1.0 ms and ≤ 2.5x `Client.ask`.
2. 64 concurrent keep-alive clients (64 httpx2.AsyncClient tasks in a load
   generator process of their own), rule-answered: requests/s from one `laya
   serve`, rounds alternating with the minimal endpoint, and the same with 64
   plain-socket clients (for reference: httpx2 itself costs a core's worth of
   CPU at these rates); the CPU each process spent per request. Targets:
   ≥ 3,000 requests/s and ≥ 0.5x the minimal endpoint, judged with httpx2.
3. model requests (``cache: false``): wall per job through HTTP against
   ``Client.ask``, pairs in alternating order (target: ≤ 2 ms added); and, for
   streaming requests, the first chunk at the HTTP client after the first chunk
   entry appeared in Redis (the worker writes its first token at once), seen by
   a reader blocked on the request's stream (target ≤ 5 ms p50), against the
   same gap for ``Client.stream``.

The script is also its own load generator (``--load``) and minimal endpoint
(``--minimal``), run as subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import checkout, cpu_name, host_speed_ms, start_valkey, summary_us, write_results

BENCH = Path(__file__).resolve()
ROUTES = """
[[rule]]
name = "greeting"
match = "exact"
patterns = ["hello"]
reply = "Hello!"
"""
JSON = {"content-type": "application/json"}
HELLO = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hello"}]}).encode()
SEQUENTIAL = 2000
WARMUP = 200
CLIENTS = 64
LOAD_S = 5.0
LOAD_WARMUP_S = 1.0
LOAD_ROUNDS = 3
MODEL_JOBS = 50
CONCURRENT = ("laya", "minimal", "raw laya", "raw minimal")
MODEL_TOKENS = 16


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args} did not listen on port {port} within {timeout:g} s")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")




def code_state() -> str:
    """Whether the code under test (laya/) is as committed: the benchmark itself may be the only change."""
    try:
        changed = subprocess.run(["git", "status", "--porcelain", "--", "laya"], cwd=BENCH.parent.parent,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return " (laya/ changed too)" if changed else " (laya/ as committed)"


def ms(value_us: float) -> str:
    return f"{value_us / 1000:.3f}"


# --- the minimal endpoint and the load generator (subprocesses of this script) ---------------------------------

def serve_minimal(port: int) -> None:
    """One POST route answering a fixed JSON, on uvicorn with the options `run_serve` passes."""
    import orjson
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    answer = orjson.dumps({"id": "r-0123456789abcdef", "object": "chat.completion", "created": 0, "model": "default",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                                        "finish_reason": "stop", "logprobs": None}],
                           "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    async def chat(request: Request) -> Response:
        await request.body()
        return Response(answer, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")


def request_bytes(url: str) -> bytes:
    """The POST of ``HELLO`` to ``url``, as bytes on the wire (HTTP/1.1, keep-alive)."""
    path = "/" + url.split("/", 3)[3]
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(HELLO)}\r\n\r\n").encode() + HELLO


def answer_ok(head: bytes, route: str | None) -> bool:
    lines = head.lower().split(b"\r\n")
    return lines[0].startswith(b"http/1.1 200") and (route is None or f"x-laya-route: {route}".encode() in lines)


def content_length(head: bytes) -> int:
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    raise ValueError(f"no content-length in {head!r:.300}")


class RawClient:
    """A keep-alive HTTP/1.1 client on a plain socket: next to no client cost, to show the server's own."""

    def __init__(self, url: str) -> None:
        import socket

        port = int(url.split("/")[2].split(":")[1])
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = request_bytes(url)

    def post(self, route: str | None) -> None:
        self.sock.sendall(self.request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        for _ in range(1000):
            if len(body) >= content_length(head):
                break
            body += self.sock.recv(65536)
        assert answer_ok(head, route), head

    def close(self) -> None:
        self.sock.close()


async def _load(url: str, route: str | None, raw: bool) -> dict[str, Any]:
    import httpx2

    started = time.perf_counter()
    measure_from = started + LOAD_WARMUP_S
    end = measure_from + LOAD_S
    done: list[tuple[float, float]] = []
    errors: list[str] = []

    async def one_raw_client() -> None:
        import socket

        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.split("/")[2].split(":")[1]))
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = request_bytes(url)
        while (sent := time.perf_counter()) < end:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.readexactly(content_length(head))
            if not answer_ok(head, route):
                errors.append(f"{head!r:.200} {body!r:.200}")
            else:
                done.append((sent, time.perf_counter()))
        writer.close()

    async def one_client() -> None:
        limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx2.AsyncClient(limits=limits, timeout=30) as client:
            while (sent := time.perf_counter()) < end:
                response = await client.post(url, content=HELLO, headers=JSON)
                if response.status_code != 200 or (route and response.headers.get("x-laya-route") != route):
                    errors.append(f"{response.status_code} {response.text[:200]}")
                else:
                    done.append((sent, time.perf_counter()))

    await asyncio.gather(*((one_raw_client if raw else one_client)() for _ in range(CLIENTS)))
    window = [(sent, got) for sent, got in done if measure_from <= got <= end]
    latencies = sorted(int((got - sent) * 1e9) for sent, got in window)
    figures = summary_us(latencies)
    times = os.times()
    return {"rate": len(window) / LOAD_S, "total": len(done), "errors": len(errors), "first_error": errors[:1],
            "p50_us": figures["p50"], "p99_us": figures["p99"], "cpu_s": times.user + times.system}


def load(url: str, route: str | None, raw: bool) -> None:
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(_load(url, route, raw))
    else:
        result = uvloop.run(_load(url, route, raw))
    print(json.dumps(result), flush=True)


# --- the measurements ------------------------------------------------------------------------------------------

def sequential(http: Any, laya_url: str, minimal_url: str, client: Any) -> dict[str, dict[str, float]]:
    """Part 1: one request at a time, the paths interleaved so a noisy moment hits all alike."""
    def laya_http() -> None:
        response = http.post(laya_url, content=HELLO, headers=JSON)
        assert response.status_code == 200 and response.headers["x-laya-route"] == "rule:greeting", response.text

    def laya_ask() -> None:
        assert client.ask("hello", timeout=10).route == "rule:greeting"

    def minimal() -> None:
        assert http.post(minimal_url, content=HELLO, headers=JSON).status_code == 200

    raw_laya, raw_minimal = RawClient(laya_url), RawClient(minimal_url)
    paths: dict[str, Callable[[], None]] = {
        "http": laya_http, "ask": laya_ask, "minimal": minimal,
        "raw": lambda: raw_laya.post("rule:greeting"), "raw minimal": lambda: raw_minimal.post(None)}
    samples: dict[str, list[int]] = {name: [] for name in paths}
    for _ in range(WARMUP):
        for one in paths.values():
            one()
    for _ in range(SEQUENTIAL):
        for name, one in paths.items():
            started = time.perf_counter_ns()
            one()
            samples[name].append(time.perf_counter_ns() - started)
    raw_laya.close()
    raw_minimal.close()
    return {name: summary_us(values) for name, values in samples.items()}


def concurrent(url: str, route: str | None, raw: bool, watched: dict[str, int], redis: Any) -> dict[str, Any]:
    """Part 2, one round: the load generator against ``url``; the CPU each watched process spent meanwhile."""
    def valkey_cpu() -> float:
        info = redis.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    before = {name: cpu_s(pid) for name, pid in watched.items()} | {"valkey": valkey_cpu()}
    command = [sys.executable, str(BENCH), "--load", url, *(["--route", route] if route else []),
               *(["--raw"] if raw else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    after = {name: cpu_s(pid) for name, pid in watched.items()} | {"valkey": valkey_cpu()}
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} failed requests against {url}: {result['first_error']}")
    result["cpu_us_per_request"] = {name: (after[name] - before[name]) / result["total"] * 1e6 for name in before}
    result["cpu_us_per_request"]["load generator"] = result["cpu_s"] / result["total"] * 1e6
    return result


def model_requests(http: Any, url: str, client: Any, redis: Any) -> dict[str, Any]:
    """Part 3: wall per model job, HTTP against ``Client.ask``; then the first streamed chunk's delay."""
    from laya.keys import Keys
    from laya.streaming import TEXT

    keys = Keys("laya")

    def body(prompt: str, **extra: Any) -> bytes:
        return json.dumps({"model": "default", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": MODEL_TOKENS, "cache": False, **extra}).encode()

    def by_http(prompt: str) -> None:
        response = http.post(url, content=body(prompt), headers=JSON)
        assert response.status_code == 200 and response.headers["x-laya-route"] == "model:default", response.text

    def by_ask(prompt: str) -> None:
        result = client.ask(messages=[{"role": "user", "content": prompt}], model="default",
                            max_tokens=MODEL_TOKENS, cache=False, timeout=60)
        assert result.ok and result.route == "model:default", result

    for i in range(5):
        by_http(f"warm up {i}")
        by_ask(f"warm up {i}")
    walls: dict[str, list[int]] = {"http": [], "ask": []}
    added: list[int] = []
    for i in range(MODEL_JOBS):
        pair = {}
        for name in (("http", "ask") if i % 2 == 0 else ("ask", "http")):  # alternating: the order costs neither
            one = by_http if name == "http" else by_ask
            started = time.perf_counter_ns()
            one(f"{name} question {i:03d}")
            pair[name] = time.perf_counter_ns() - started
            walls[name].append(pair[name])
        added.append(pair["http"] - pair["ask"])

    def watch(request_id: str, ready: threading.Event, seen: list[float]) -> threading.Thread:
        """A reader blocked on the request's stream: when its first chunk entry is in Redis."""
        def run() -> None:
            ready.set()
            reply = redis.xread({keys.stream(request_id): "0-0"}, count=1, block=60_000)
            assert reply and TEXT in reply[0][1][0][1], reply
            seen.append(time.perf_counter())

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def stream_http(i: int) -> float:
        request_id = uuid.uuid4().hex
        ready, seen = threading.Event(), []
        thread = watch(request_id, ready, seen)
        ready.wait()
        first = None
        headers = {**JSON, "idempotency-key": request_id}
        with http.stream("POST", url, content=body(f"stream {i:03d}", stream=True), headers=headers) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if (first is None and line.startswith("data: {")
                        and json.loads(line[6:])["choices"][0]["delta"].get("content")):
                    first = time.perf_counter()
        thread.join()
        assert first is not None and seen
        return first - seen[0]

    def stream_client(i: int) -> float:
        from laya.client import Chunk, make_request

        request = make_request(messages=[{"role": "user", "content": f"stream {i:03d}"}], model="default",
                               max_tokens=MODEL_TOKENS, cache=False, stream=True)
        ready, seen = threading.Event(), []
        thread = watch(request.id, ready, seen)
        ready.wait()
        client.submit_request(request)
        first = None
        for item in client.follow(request.id, timeout=60):
            if first is None and isinstance(item, Chunk) and item.text:
                first = time.perf_counter()
        thread.join()
        assert first is not None and seen
        return first - seen[0]

    for i in range(3):
        stream_http(-1 - i)
        stream_client(-1 - i)
    gaps: dict[str, list[int]] = {"http": [], "client": []}
    for i in range(MODEL_JOBS):
        gaps["http"].append(int(stream_http(i) * 1e9))
        gaps["client"].append(int(stream_client(i) * 1e9))
    return {"wall": {name: summary_us(values) for name, values in walls.items()}, "added": summary_us(added),
            "added_median_us": statistics.median(added) / 1000,
            "first_chunk": {name: summary_us(values) for name, values in gaps.items()}}


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process still running, then wait; one that will not stop in 20 s is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(tmp: Path) -> dict[str, Any]:
    import httpx2
    from redis import Redis

    from laya.client import Client
    from laya.worker.tinymodel import write_tiny_model

    server = start_valkey(tmp)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(tmp / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(command, env=env, stderr=log, stdout=log)
        procs.append(proc)
        return proc

    try:
        url = f"{server.connection_url}/0"
        routes = tmp / "routes.toml"
        routes.write_text(ROUTES)
        model = write_tiny_model(tmp / "tiny.gguf")
        port, minimal_port = free_port(), free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")},
               "LAYA_REDIS_URL": url, "LAYA_ROUTES": str(routes), "LAYA_MODEL_PATH": str(model),
               "LAYA_HTTP__PORT": str(port), "LAYA_METRICS__PORT": "0", "LAYA_ROUTER__BLOCK_MS": "100",
               "LAYA_RUNTIME__MAX_SEQ_LEN": "512"}
        laya = [sys.executable, "-m", "laya", "--log-level", "WARNING"]
        router = start("router", [*laya, "router"], env)
        serve = start("serve", [*laya, "serve"], env)
        minimal = start("minimal", [sys.executable, str(BENCH), "--minimal", str(minimal_port)], env)
        wait_for_port(port, serve, tmp / "serve.log")
        wait_for_port(minimal_port, minimal, tmp / "minimal.log")
        laya_url = f"http://127.0.0.1:{port}/v1/chat/completions"
        minimal_url = f"http://127.0.0.1:{minimal_port}/v1/chat/completions"
        redis = Redis.from_url(url)
        client = Client(redis)
        while client.ask("hello", timeout=10).route != "rule:greeting":  # router up
            pass
        figures: dict[str, Any] = {}
        with httpx2.Client(timeout=60) as http:
            print("1/3: one client, one request at a time", flush=True)
            figures["sequential"] = sequential(http, laya_url, minimal_url, client)
            print(f"2/3: {CLIENTS} concurrent clients, {LOAD_ROUNDS} rounds", flush=True)
            rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in CONCURRENT}
            for _ in range(LOAD_ROUNDS):  # alternating, so a change in the machine's load falls on all alike
                for raw in (False, True):
                    prefix = "raw " if raw else ""
                    rounds[prefix + "laya"].append(concurrent(laya_url, "rule:greeting", raw, {
                        "laya serve": serve.pid, "router": router.pid}, redis))
                    rounds[prefix + "minimal"].append(concurrent(minimal_url, None, raw, {
                        "minimal endpoint": minimal.pid}, redis))
            figures["concurrent"] = rounds
            print("3/3: model requests on the tiny model", flush=True)
            start("worker", [*laya, "worker"], env)
            client.ask("warm up", cache=False, max_tokens=4, timeout=120)
            figures["model"] = model_requests(http, laya_url, client, redis)
        return figures
    except Exception:
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name} ---\n{log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        stop_all(procs)
        server.stop()


def report(figures: dict[str, Any], load: str) -> None:
    seq = figures["sequential"]
    http, ask, minimal, raw, raw_minimal = (seq[k] for k in ("http", "ask", "minimal", "raw", "raw minimal"))

    def one_ok(p50: float) -> bool:
        return p50 <= 1000 and p50 <= 2.5 * ask["p50"]

    conc = figures["concurrent"]
    rate = {key: statistics.median(r["rate"] for r in conc[key]) for key in CONCURRENT}

    def many_ok(kind: str) -> bool:
        return rate[kind + "laya"] >= 3000 and rate[kind + "laya"] >= 0.5 * rate[kind + "minimal"]

    model = figures["model"]
    wall, added, chunk = model["wall"], model["added_median_us"], model["first_chunk"]
    added_ok = added <= 2000
    chunk_ok = chunk["http"]["p50"] <= 5000

    def verdict(ok: bool) -> str:
        return "met" if ok else "**NOT met**"

    def rates(key: str) -> str:
        return ", ".join(f"{r['rate']:,.0f}" for r in conc[key])

    def under_load(key: str) -> str:
        return (f"{ms(statistics.median(r['p50_us'] for r in conc[key]))} / "
                f"{ms(statistics.median(r['p99_us'] for r in conc[key]))} ms")

    def row_one(name: str, lat: dict[str, float], target: str) -> str:
        return (f"| {name} | {ms(lat['p50'])} | {ms(lat['p99'])} | `Client.ask(\"hello\")`: {ms(ask['p50'])}, "
                f"{ms(ask['p99'])} | {lat['p50'] / ask['p50']:.2f}x | {target} | {verdict(one_ok(lat['p50']))} |")

    def row_many(name: str, kind: str, target: str) -> str:
        return (f"| {name} | {rate[kind + 'laya']:,.0f} | – | minimal Starlette endpoint, same uvicorn options, same "
                f"client: {rate[kind + 'minimal']:,.0f} | {rate[kind + 'laya'] / rate[kind + 'minimal']:.2f}x "
                f"| {target} | {verdict(many_ok(kind))} |")

    lines = [
        "# `laya serve`: the HTTP front door against `Client` on the same stack", "",
        (f"Machine: {cpu_name()}, {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}). Python "
         f"{sys.version.split()[0]}; Valkey, `laya router`, `laya serve` (and for part 3 `laya worker` on the tiny "
         "generated model) each a process on loopback; the load generator a process of its own. "
         "`python bench/front_door.py` reproduces it."), "",
        f"Commit: {checkout()}{code_state()}.", "",
        f"Load: {load}.", "",
        ("The targets are judged with httpx2 (the openai package's client), as the issue asks. The rows \"raw "
         "client\" send the same bytes from a plain socket, for reference: they show the server's share "
         "without the client's cost (httpx2 costs about as much CPU per request as `laya serve` and the minimal "
         "endpoint together, and it shares these cores)."), "",
        "| measurement | median | p99 | baseline (same run): median, p99 | ratio | target | verdict |",
        "|---|---:|---:|---|---:|---|---|",
        row_one(f"1. rule answer, one keep-alive httpx2 client, POST /v1/chat/completions ({SEQUENTIAL:,} requests), "
                "ms", http, "p50 ≤ 1.0 ms and ≤ 2.5x"),
        row_one("1r. the same, raw client (reference)", raw, "same"),
        row_many(f"2. rule answer, {CLIENTS} concurrent keep-alive httpx2 clients, requests/s (median of "
                 f"{LOAD_ROUNDS} rounds of {LOAD_S:g} s)", "", "≥ 3,000/s and ≥ 0.5x"),
        row_many(f"2r. the same, {CLIENTS} raw clients (reference)", "raw ", "same"),
        (f"| 3a. model job (tiny model, {MODEL_TOKENS} tokens, `cache: false`), wall per job, httpx2, ms "
         f"({MODEL_JOBS} pairs) | {ms(wall['http']['p50'])} | {ms(wall['http']['p99'])} | `Client.ask`: "
         f"{ms(wall['ask']['p50'])}, {ms(wall['ask']['p99'])} | {added / 1000:+.3f} ms (median of pairs) "
         f"| ≤ 2 ms added | {verdict(added_ok)} |"),
        (f"| 3b. first streamed chunk at the httpx2 client after the chunk entry is in Redis, ms ({MODEL_JOBS} "
         f"streams) | {ms(chunk['http']['p50'])} | {ms(chunk['http']['p99'])} | `Client.stream`: "
         f"{ms(chunk['client']['p50'])}, {ms(chunk['client']['p99'])} | – | ≤ 5 ms p50 | {verdict(chunk_ok)} |"),
        "",
        "Details:", "",
        (f"- 1: the minimal endpoint through the same httpx2 client answered in {ms(minimal['p50'])} ms p50, "
         f"{ms(minimal['p99'])} ms p99, through the raw client in {ms(raw_minimal['p50'])} ms p50 (uvicorn and "
         f"Starlette alone); so httpx2 costs {ms(minimal['p50'] - raw_minimal['p50'])} ms of each request, and "
         f"`laya serve` {ms(raw['p50'] - raw_minimal['p50'])} ms more than the minimal endpoint, where "
         f"`Client.ask`'s whole round trip is {ms(ask['p50'])} ms. The five paths were timed interleaved, one of "
         "each in turn."),
        (f"- 2: rounds, requests/s, alternating: httpx2 clients: laya serve {rates('laya')}, minimal endpoint "
         f"{rates('minimal')}; raw clients: laya serve {rates('raw laya')}, minimal endpoint {rates('raw minimal')}. "
         f"Latency under load, median of the rounds' p50 / p99: httpx2: laya serve {under_load('laya')}, minimal "
         f"{under_load('minimal')}; raw: laya serve {under_load('raw laya')}, minimal {under_load('raw minimal')}."),
    ]
    cpu: dict[tuple[str, str], list[float]] = {}
    for key, label in (("laya", "`laya serve`, httpx2"), ("minimal", "minimal endpoint, httpx2"),
                       ("raw laya", "`laya serve`, raw"), ("raw minimal", "minimal endpoint, raw")):
        for r in conc[key]:
            for name, value in r["cpu_us_per_request"].items():
                cpu.setdefault((label, name), []).append(value)
    lines += ["", ("- 2, CPU per request, user + system, counted over each whole round (warm-up included), median "
                   "of the rounds:"), "",
              "| rounds against, client | process | CPU µs per request |", "|---|---|---:|"]
    lines += [f"| {label} | {name} | {statistics.median(values):,.0f} |" for (label, name), values in cpu.items()]
    lines += ["",
              (f"- 3a: added per job, all pairs: p50 {ms(model['added']['p50'])} ms, p99 {ms(model['added']['p99'])} "
               "ms (each pair one job by HTTP, one by `Client.ask`, the order alternating)."),
              ("- 3b: a reader blocked on the request's stream (XREAD from a thread of this process) stamps the "
               "first chunk entry; the worker XADDs its first token at once (later ones every "
               "`runtime.stream_flush_ms`), so this is the front door's delay after the worker's first token, less "
               "the worker's one XADD. `Client.stream`'s gap is the floor of this measurement (below zero where "
               "the client's thread woke before the watcher's).")]
    run = (f"one httpx2 client p50 {ms(http['p50'])} ms / p99 {ms(http['p99'])} ms vs Client.ask {ms(ask['p50'])} ms "
           f"({http['p50'] / ask['p50']:.2f}x), target {verdict(one_ok(http['p50']))} (raw client {ms(raw['p50'])} "
           f"ms); {CLIENTS} httpx2 clients {rate['laya']:,.0f} req/s vs minimal {rate['minimal']:,.0f} "
           f"({rate['laya'] / rate['minimal']:.2f}x), target {verdict(many_ok(''))} (raw clients "
           f"{rate['raw laya']:,.0f} vs {rate['raw minimal']:,.0f}); model wall {added / 1000:+.3f} ms per job, "
           f"target {verdict(added_ok)}; first chunk {ms(chunk['http']['p50'])} ms p50 after Redis, target "
           f"{verdict(chunk_ok)}; {load}")
    write_results("front_door.md", lines, run=run.replace("**", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minimal", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--route", help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.minimal is not None:
        serve_minimal(args.minimal)
        return
    if args.load is not None:
        load(args.load, args.route, args.raw)
        return
    load_before, speed_before = os.getloadavg()[0], host_speed_ms()
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(Path(tmp))
    load_after, speed_after = os.getloadavg()[0], host_speed_ms()
    # After the run the average counts this benchmark's own processes; before it, only the machine's other work.
    busy = (" (high: the cores were busy with other work when it started)" if load_before > 0.5 else
            " (low before it started; the figure after counts this benchmark's own processes)")
    report(figures, f"1-minute load average {load_before:.1f} before, {load_after:.1f} after{busy}; a million Python "
                    f"additions took {speed_before} ms before, {speed_after} ms after (the host's speed)")


if __name__ == "__main__":
    main()
