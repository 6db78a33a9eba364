"""`laya serve` through the official `openai` package, on real processes: a router, a worker, the front door."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx2 as httpx  # the HTTP client the openai package itself uses
import openai
import pytest
from pydantic import BaseModel
from redis import Redis

from tests.conftest import Server, free_port
from tests.processes import start_laya, stop_laya

KEY = "test-key-0123456789"


@dataclass
class Door:
    url: str
    redis: Redis
    prefix: str
    pids: list[int] = field(default_factory=list)
    """The front door's process (`laya serve`)."""

    def client(self, key: str = KEY, **options: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, **options)  # type: ignore[arg-type]


def _env(url: str, prefix: str, port: int, model: Path, routes: Path, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}, "LAYA_REDIS_URL": url,
            "LAYA_REDIS__PREFIX": prefix, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes),
            "LAYA_ROUTER__BLOCK_MS": "100", "LAYA_METRICS__PORT": "0", "LAYA_HTTP__PORT": str(port),
            "LAYA_HTTP__API_KEYS": KEY, "LAYA_RUNTIME__HEARTBEAT_INTERVAL_S": "0.2", **extra}


def _wait_for_port(port: int, proc: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert getattr(proc, "poll")() is None, "laya serve exited"  # noqa: B009
        time.sleep(0.05)
    raise AssertionError(f"laya serve did not listen on {port}")


@pytest.fixture(scope="module")
def door(redis_server: Server, tiny_model: Path, routes_file: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Door]:
    port = free_port()
    env = _env(redis_server.url, "http", port, tiny_model, routes_file)
    yield from _running(redis_server, env, port, "http", tmp_path_factory.mktemp("http-logs"),
                        ("router", "worker"))


def _running(redis_server: Server, env: dict[str, str], port: int, prefix: str, logs: Path,
             roles: tuple[str, ...]) -> Iterator[Door]:
    """Start ``roles`` and a front door on ``port``; the door once it listens; everything stopped after."""
    procs = [start_laya(role, env, logs / f"{role}.log") for role in (*roles, "serve")]
    try:
        _wait_for_port(port, procs[-1])
        yield Door(f"http://127.0.0.1:{port}", redis_server.client(), prefix, [procs[-1].pid])
    finally:
        stop_laya(*procs)


def test_a_rule_answers_a_chat_completion_with_its_route(door: Door) -> None:
    raw = door.client().chat.completions.with_raw_response.create(
        model="default", messages=[{"role": "user", "content": "hello"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert raw.headers["x-laya-route"] == "rule:greeting"
    assert raw.headers["x-request-id"] == completion.id


def test_the_model_answers_a_completion_with_usage(door: Door) -> None:
    completion = door.client().completions.create(model="default", prompt="jello", max_tokens=4,
                                                  extra_body={"cache": False})
    assert completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    assert completion.choices[0].finish_reason == "length"
    assert completion.model_extra is not None and completion.model_extra["laya"]["route"] == "model:default"


def test_a_stream_s_chunks_join_into_the_answer(door: Door) -> None:
    client = door.client()
    whole = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "kello"}],
                                           max_tokens=12, extra_body={"cache": False})
    chunks = list(client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "kello"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache": False}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_a_streamed_rule_answer_is_one_chunk(door: Door) -> None:
    chunks = list(door.client().chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hello"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello!"


class Colour(BaseModel):
    name: Literal["red", "green", "blue"]
    bright: bool


def test_structured_output_from_a_pydantic_model(door: Door) -> None:
    completion = door.client().chat.completions.parse(
        model="default", messages=[{"role": "user", "content": "pick a colour"}], response_format=Colour,
        max_tokens=200)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Colour) and parsed.name in ("red", "green", "blue")


def test_models_are_listed_with_their_context_and_plan(door: Door) -> None:
    [model] = door.client().models.list()
    assert model.id == "default"
    assert model.model_extra is not None and model.model_extra["laya"]["plan"] == "fits"
    assert isinstance(model.model_extra["laya"]["n_ctx"], int) and model.model_extra["laya"]["n_ctx"] > 0


def test_a_client_that_leaves_mid_stream_breaks_nothing(door: Door) -> None:
    body = {"model": "default", "prompt": "jello", "max_tokens": 64, "stream": True, "cache": False}
    with httpx.Client(base_url=door.url, timeout=30) as http, http.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as reply:
        assert reply.status_code == 200 and next(reply.iter_lines()).startswith("data: ")
        request_id = reply.headers["x-request-id"]
    deadline = time.monotonic() + 30
    while not door.redis.exists(f"{door.prefix}:result:{request_id}"):  # the job ran on and left its record
        assert time.monotonic() < deadline, "the request's result was never written"
        time.sleep(0.05)
    again = door.client().completions.create(model="default", prompt="hello")
    assert again.choices[0].text == "Hello!"


def test_a_wrong_key_is_refused_before_anything_reaches_redis(door: Door) -> None:
    before = door.redis.xlen(f"{door.prefix}:ingress")
    with pytest.raises(openai.AuthenticationError):
        door.client(key="wrong-key-000").chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hello"}])
    assert door.redis.xlen(f"{door.prefix}:ingress") == before


def test_a_bad_request_names_its_param(door: Door) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        door.client().chat.completions.create(model="default", n=2, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        door.client().chat.completions.create(model="default", messages=[{"role": "tool", "content": "x"}])
    assert caught.value.body["param"] == "messages.0.role"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        door.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


def _jobs_done(door: Door) -> int:
    """The workers' finished-job count, from a beat taken after this call began with every worker idle
    (a beat comes each heartbeat interval, so an earlier one may not count a job that just ended)."""
    import orjson

    asked = time.time()
    deadline = time.monotonic() + 30
    while True:
        beats = [orjson.loads(raw) for raw in door.redis.hvals(f"{door.prefix}:stats:worker")]
        if beats and all(b["beat_at"] > asked and b["state"] == "idle" for b in beats):
            return sum(b.get("jobs_done", 0) for b in beats)
        assert time.monotonic() < deadline, f"no current idle beat from the workers: {beats}"
        time.sleep(0.05)


def test_an_idempotency_key_sent_twice_runs_the_model_once(door: Door) -> None:
    client = door.client()
    body = {"model": "default", "prompt": "mello", "max_tokens": 3, "cache": False}
    headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "twice-1"}
    before = _jobs_done(door)
    first = httpx.post(f"{door.url}/v1/completions", json=body, headers=headers, timeout=60)
    second = httpx.post(f"{door.url}/v1/completions", json=body, headers=headers, timeout=60)
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] == second.json()["id"] == "twice-1"
    assert first.json()["choices"] == second.json()["choices"]
    assert _jobs_done(door) - before == 1
    del client


def test_malformed_bodies_get_a_4xx_each_and_the_server_lives(door: Door) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bodies: list[bytes] = [b"", b"{", b"[]", b"null", b'"text"', b"\xff\xfe", b'{"messages": 5}',
                           b'{"prompt": 5}', b"[" * 5000 + b"]" * 5000, b'{"prompt": "' + b"x" * 2_000_000 + b'"}',
                           b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                           b'{"model": "default", "prompt": "hi", "temperature": "hot"}',
                           b'{"model": "default", "prompt": "hi", "stream": "yes"}',
                           b'{"model": "default", "prompt": "hi", "frequency_penalty": 1}']
    bodies += [b'{"prompt": ' + str(i).encode() + b"}" for i in range(1000 - len(bodies))]
    with httpx.Client(base_url=door.url, timeout=30) as http:
        for body in bodies:
            for path in ("/v1/chat/completions", "/v1/completions"):
                reply = http.post(path, content=body, headers=headers)
                assert 400 <= reply.status_code < 500, (path, body[:60], reply.status_code, reply.text[:200])
                assert reply.json()["error"]["message"]
        wrong_type = http.post("/v1/completions", content=b'{"prompt": "hi"}',
                               headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
        assert wrong_type.status_code == 400 and "application/json" in wrong_type.json()["error"]["message"]
        assert http.post("/v1/completions", json={"model": "default", "prompt": "hello"},
                         headers=headers).status_code == 200  # still serving


@pytest.fixture
def full_lane(redis_server: Server, tiny_model: Path, routes_file: Path, tmp_path: Path) -> Iterator[Door]:
    """A front door and a router with no worker, whose lanes hold one job."""
    port = free_port()
    env = _env(redis_server.url, "http429", port, tiny_model, routes_file, LAYA_ROUTER__MAX_QUEUE_DEPTH="1",
               LAYA_ROUTER__RETRY_AFTER_S="7")
    yield from _running(redis_server, env, port, "http429", tmp_path, ("router",))


def test_a_full_lane_is_a_429_with_retry_after(full_lane: Door) -> None:
    client = full_lane.client(max_retries=0, timeout=2)
    with pytest.raises(openai.APITimeoutError):  # queued: no worker runs it
        client.completions.create(model="default", prompt="first", max_tokens=2, extra_body={"cache": False})
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model="default", prompt="second", max_tokens=2, extra_body={"cache": False})
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["code"] == "overloaded"  # type: ignore[index]


def _wait_busy(redis: Redis, prefix: str, timeout: float = 30) -> None:
    import orjson

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(orjson.loads(raw).get("state") == "busy" for raw in redis.hvals(f"{prefix}:stats:worker")):
            return
        time.sleep(0.005)
    raise AssertionError("the worker never took the job")


def test_the_client_gets_its_answer_though_the_worker_and_the_router_die(
        redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    env = _env(redis_server.url, "httpkill", port, endless_model, routes_file, LAYA_RUNTIME__HEARTBEAT_TTL_S="5",
               LAYA_ROUTER__REAP_INTERVAL_S="0.3", LAYA_RUNTIME__MAX_TOKENS_LIMIT="8192",
               LAYA_RUNTIME__MAX_SEQ_LEN="8192")
    procs = {"router": start_laya("router", env, tmp_path / "router.log"),
             "worker": start_laya("worker", env, tmp_path / "worker.log"),
             "serve": start_laya("serve", env, tmp_path / "serve.log")}
    redis = redis_server.client()
    body = {"model": "default", "prompt": "jello", "max_tokens": 8000, "cache": False}
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        _wait_for_port(port, procs["serve"])
        with ThreadPoolExecutor(2) as pool:
            reply = pool.submit(httpx.post, f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers,
                                timeout=120)
            _wait_busy(redis, "httpkill")
            procs["worker"].kill()  # SIGKILL mid-generation: the reaper requeues the job once its heartbeat stops
            procs["router"].kill()
            procs["worker"].wait()
            procs["router"].wait()
            later = pool.submit(httpx.post, f"http://127.0.0.1:{port}/v1/completions", headers=headers, timeout=120,
                                json={"model": "default", "prompt": "hello"})  # sent while no router runs
            time.sleep(0.5)
            procs["router"] = start_laya("router", env, tmp_path / "router2.log")
            procs["worker"] = start_laya("worker", env, tmp_path / "worker2.log")
            answered, greeted = reply.result(), later.result()
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == 8000
        from rq.job import Job

        job = Job.fetch(answered.json()["id"], connection=redis, serializer="json")
        assert job.retries_left == 0, "the job ran once: the worker was not killed mid-generation"
        assert greeted.status_code == 200 and greeted.json()["choices"][0]["text"] == "Hello!"
    finally:
        stop_laya(*procs.values())
