"""The RQ worker in-process, on the real tiny model: results, cache fill, refusals."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue, Retry
from rq.job import JobStatus

from laya.backend import LlamaBackend
from laya.client import Client
from laya.config import Settings
from laya.jobs import JOB_FUNCTION
from laya.router import Router
from laya.tinymodel import TinyModelSpec, expected_completion, write_tiny_model
from laya.worker import run_worker


def route_all(settings: Settings, redis: Redis) -> None:
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    while entries := router.read_batch():
        router.handle(entries)


def test_model_jobs_run_and_fill_the_cache(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    first = client.submit("jello", max_tokens=32, metadata={"batch": "b1"})
    chat = client.submit(messages=[{"role": "user", "content": "Say the alphabet"}], max_tokens=5)
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))

    result = client.wait(first, timeout=5)
    assert result.route == "model:default" and result.ok
    assert result.text == expected_completion("jello", 32) == "pqrstuvwxyz"
    assert result.finish_reason == "stop" and result.usage.completion_tokens == 11
    assert result.metadata == {"batch": "b1"}
    timings = result.timings
    assert timings.queue_wait_ms is not None and timings.ttft_ms is not None and timings.generation_ms is not None
    assert timings.route_us is not None and timings.total_ms is not None
    assert client.wait(chat, timeout=5).text == "abcde"

    again = client.submit("JELLO ", max_tokens=32)
    route_all(settings, redis)
    cached = client.wait(again, timeout=5)
    assert cached.route == "cache" and cached.text == "pqrstuvwxyz"


def test_context_too_long_is_an_error_result_counted_by_the_worker(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    long = client.submit("word " * 200, max_tokens=4)  # fits the router's byte limit, not the 512-token window
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.wait(long, timeout=5)
    assert result.route == "error:context_too_long"
    assert "max_seq_len" in result.error.message  # type: ignore[union-attr]


def test_a_job_naming_another_function_does_not_run(settings: Settings, redis: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    queue = Queue("laya:llm:default", connection=redis, serializer="json")
    job = queue.enqueue("os.system", f"touch {marker}")
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert not marker.exists()
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "not a Laya job function" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert os.path.exists(tmp_path)


def test_a_timed_out_job_gets_an_error_result(settings: Settings, redis: Redis, endless_model: Path) -> None:
    slow = settings.model_copy(update={
        "model": settings.model.model_copy(update={"path": endless_model}),
        "runtime": settings.runtime.model_copy(update={"job_timeout_s": 1, "max_seq_len": 65536}),
    })
    client = Client(redis)
    request_id = client.submit("a", max_tokens=4096, cache=False)
    route_all(slow, redis)
    backend = LlamaBackend(slow)
    # 4096 tokens of the tiny model take well under a second here; make each one slow enough.
    original = backend.llm.detokenize

    def slow_detokenize(tokens: list[int], *args: object, **kwargs: object) -> bytes:
        time.sleep(0.001)
        return original(tokens, *args, **kwargs)  # type: ignore[arg-type]

    backend.llm.detokenize = slow_detokenize  # type: ignore[method-assign]
    run_worker(slow, redis, burst=True, backend=backend)
    result = client.wait(request_id, timeout=5)
    assert result.route == "error:timeout"
    assert "job_timeout_s" in result.error.message  # type: ignore[union-attr]
    job = Queue("laya:llm:default", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None and job.get_status() == JobStatus.FINISHED  # a handled failure is an answer


REFUSING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must come first') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
)


def test_messages_the_chat_template_refuses_get_an_error_result(settings: Settings, redis: Redis,
                                                                  tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "chat.gguf", TinyModelSpec(chat_template=REFUSING_TEMPLATE))
    settings = settings.model_copy(update={"model": settings.model.model_copy(update={"path": model})})
    client = Client(redis)
    refused = client.submit(messages=[{"role": "user", "content": "hi there"},
                                      {"role": "system", "content": "be brief"}], max_tokens=3)
    fine = client.submit(messages=[{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hi there"}], max_tokens=3)
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    error = client.wait(refused, timeout=5).error
    assert error is not None and error.code == "invalid_request" and error.field == "messages"
    assert "System message must come first" in error.message
    assert client.wait(fine, timeout=5).route == "model:default"


def test_an_unexpected_worker_failure_still_answers_the_producer(settings: Settings, redis: Redis) -> None:
    queue = Queue("laya:llm:default", connection=redis, serializer="json")
    # A Laya job whose payload lacks what the job function needs (a router of another version, say).
    queue.enqueue(JOB_FUNCTION, {"request": {"id": "broken", "prompt": "a"}, "model": "default"},
                  job_id="broken", retry=Retry(max=1))
    queue.enqueue(JOB_FUNCTION, {"request": "not an object", "model": 5}, job_id="garbled")
    client = Client(redis)
    after = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.wait("broken", timeout=5)
    assert result.route == "error:internal" and "KeyError" in result.error.message  # type: ignore[union-attr]
    assert client.wait("garbled", timeout=5).route == "error:internal"
    assert client.wait(after, timeout=5).route == "model:default"  # the worker went on


def test_the_heartbeat_keeps_only_its_own_lock(settings: Settings, redis: Redis, endless_model: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    endless = settings.model_copy(update={"model": settings.model.model_copy(update={"path": endless_model})})
    client = Client(redis)
    request_id = client.submit("a", max_tokens=400, cache=False)
    route_all(endless, redis)
    backend = LlamaBackend(endless)
    original = backend.llm.detokenize
    emitted = 0

    def steal_the_lock_midway(tokens: list[int], *args: object, **kwargs: object) -> bytes:
        nonlocal emitted
        emitted += 1
        if emitted == 100:  # as if this worker had stalled past the lock's TTL and another took it
            redis.set(f"laya:lock:{request_id}", "another-worker", ex=1000)
        time.sleep(0.001)  # 400 tokens take ~0.4 s: several heartbeats after the theft
        return original(tokens, *args, **kwargs)  # type: ignore[arg-type]

    backend.llm.detokenize = steal_the_lock_midway  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="laya.worker"):
        run_worker(endless, redis, burst=True, backend=backend)
    assert client.wait(request_id, timeout=5).route == "model:default"
    # Neither the heartbeat (which would cut the TTL to lock_ttl_s) nor the release touched it.
    assert redis.get(f"laya:lock:{request_id}") == b"another-worker"
    assert redis.ttl(f"laya:lock:{request_id}") > endless.runtime.lock_ttl_s
    assert caplog.text.count(f"lost the lock on request {request_id}") == 1
