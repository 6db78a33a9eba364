"""The RQ worker in-process, on the real tiny model: results, cache fill, refusals."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis import Redis
from rq import Queue, Retry
from rq.job import Job, JobStatus

from laya.client import Client
from laya.config import Settings
from laya.contract import JOB_FUNCTION
from laya.keys import Keys
from laya.router.ingress import Router
from laya.schema import Request
from laya.worker.backend import Controls, Generation, LlamaBackend
from laya.worker.rqworker import run_worker
from laya.worker.tinymodel import TinyModelSpec, expected_completion, write_tiny_model


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


def test_total_ms_runs_from_the_producer_s_submit_time_and_never_goes_below_zero(settings: Settings,
                                                                                redis: Redis) -> None:
    client = Client(redis)
    submitted = time.time() - 2.0
    earlier = client.submit_request(Request(prompt="jello", max_tokens=4, submitted_at=submitted))
    # A producer whose clock runs an hour ahead of the worker's.
    ahead = client.submit_request(Request(prompt="jelly", max_tokens=4, submitted_at=time.time() + 3600))
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.wait(earlier, timeout=5)
    assert result.finished_at is not None and result.timings.total_ms is not None
    assert result.timings.total_ms == pytest.approx((result.finished_at - submitted) * 1000, rel=1e-9)
    assert result.timings.total_ms >= 2000
    assert client.wait(ahead, timeout=5).timings.total_ms == 0.0


def test_context_too_long_is_an_error_result_counted_by_the_worker(settings: Settings, redis: Redis,
                                                                  counted_jobs: list[dict[str, Any]],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    client = Client(redis)
    # Fits the router's byte limit, not the 512-token window.
    long = client.submit("word " * 200, max_tokens=4, metadata={"line": 7})
    route_all(settings, redis)
    with caplog.at_level(logging.WARNING, logger="laya.worker"):
        run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.wait(long, timeout=5)
    assert result.route == "error:context_too_long" and result.model == "default"
    assert result.metadata == {"line": 7}
    assert "max_seq_len" in result.error.message  # type: ignore[union-attr]
    assert result.timings.queue_wait_ms is not None and result.timings.total_ms is not None
    [count] = counted_jobs
    assert count.pop("queue_wait_s") == pytest.approx(result.timings.queue_wait_ms / 1000, rel=1e-9)
    assert count == {"outcome": "context_too_long", "ttft_s": None, "rate": None, "prompt_tokens": 0,
                     "cached_tokens": 0, "completion_tokens": 0}
    assert f"request {long} failed: context_too_long" in caplog.messages
    assert Job.fetch(long, connection=redis, serializer="json").return_value() == {"route": "error:context_too_long"}


class Recorded(LlamaBackend):
    """The real backend; keeps what each generation returned, for the test to compare with the result."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.generations: list[Generation] = []

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        self.generations.append(super().generate(request, max_tokens=max_tokens, controls=controls))
        return self.generations[-1]


def test_a_result_s_timings_and_the_count_are_the_generation_s(settings: Settings, redis: Redis,
                                                               counted_jobs: list[dict[str, Any]]) -> None:
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=8)
    route_all(settings, redis)
    backend = Recorded(settings)
    run_worker(settings, redis, burst=True, backend=backend)
    result = client.wait(request_id, timeout=5)
    [gen] = backend.generations
    assert result.timings.ttft_ms == pytest.approx(gen.ttft_s * 1000, rel=1e-9)
    assert result.timings.generation_ms == pytest.approx(gen.generation_s * 1000, rel=1e-9)
    assert result.usage.prompt_tokens == gen.prompt_tokens and result.usage.completion_tokens == gen.completion_tokens
    [count] = counted_jobs
    assert count.pop("queue_wait_s") == pytest.approx(result.timings.queue_wait_ms / 1000, rel=1e-9)
    assert count == {"outcome": "ok", "ttft_s": gen.ttft_s, "rate": gen.decode_tokens_per_s,
                     "prompt_tokens": gen.prompt_tokens, "cached_tokens": gen.cached_tokens,
                     "completion_tokens": gen.completion_tokens}
    assert Job.fetch(request_id, connection=redis, serializer="json").return_value() == {
        "route": "model:default", "completion_tokens": gen.completion_tokens}


def test_a_job_naming_another_function_does_not_run(settings: Settings, redis: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    job = queue.enqueue("os.system", f"touch {marker}")
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert not marker.exists()
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "not a Laya job function" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]


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
    job = Queue("laya:llm:default:normal", connection=redis, serializer="json").fetch_job(request_id)
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
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    # A Laya job whose payload lacks what the job function needs (a router of another version, say).
    queue.enqueue(JOB_FUNCTION, {"request": {"id": "broken", "prompt": "a"}, "model": "default"},
                  job_id="broken", retry=Retry(max=1))
    queue.enqueue(JOB_FUNCTION, {"request": "not an object", "model": 5}, job_id="garbled")
    queue.enqueue(JOB_FUNCTION, "not an object at all", job_id="stringly")
    queue.enqueue(JOB_FUNCTION, job_id="argless")
    queue.enqueue(JOB_FUNCTION, {"request": {"id": "odd", "prompt": "a", "reply_to": 5, "metadata": {"k": [1, 2]}},
                                 "model": "default"}, job_id="odd")
    client = Client(redis)
    after = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.wait("broken", timeout=5)
    assert result.route == "error:internal" and result.error is not None
    assert "not a Laya job payload (max_tokens: Field required" in result.error.message  # the fields it lacks
    assert result.model == "default" and result.finished_at is not None
    for job_id in ("garbled", "stringly", "argless", "odd"):
        answer = client.result(job_id)
        assert answer is not None and answer.route == "error:internal" and answer.metadata == {}, job_id
        assert redis.llen(f"laya:done:{job_id}") == 1, job_id  # its waiter was woken where it waits
    assert client.result("garbled").model is None  # type: ignore[union-attr]
    # "odd" carries metadata a result may not hold: answered without it, but with everything else.
    odd = client.result("odd")
    assert odd is not None and odd.model == "default" and odd.finished_at is not None
    assert odd.error is not None and odd.error.message.startswith("the worker failed on this request (")
    assert client.wait(after, timeout=5).route == "model:default"  # the worker went on


def test_a_model_answer_wakes_the_producer_s_reply_channel(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    channel = client.new_channel()
    before = time.time()
    [request_id, uncached] = client.submit_many(
        [{"prompt": "jello", "max_tokens": 4, "submitted_at": before, "metadata": {"n": 1}},
         {"prompt": "kello", "max_tokens": 4, "cache": False}], reply_to=channel)
    route_all(settings, redis)
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    results = {r.id: r for r in client.poll_channel(channel, timeout=5)}
    result = results[request_id]
    assert result.text == "pqrs" and not redis.exists(f"laya:done:{request_id}")
    assert result.model == "default" and result.metadata == {"n": 1} and result.finish_reason == "length"
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens == 4
    timings = result.timings
    assert timings.total_ms is not None and timings.generation_ms is not None and timings.ttft_ms is not None
    assert timings.queue_wait_ms is not None and timings.tokens_per_s is not None and timings.tokens_per_s > 0
    assert timings.ttft_ms <= timings.generation_ms <= timings.total_ms <= (time.time() - before) * 1000
    assert timings.queue_wait_ms <= timings.total_ms
    # Its answer was cached, with the fields the cache stage answers from and the cache's TTL; the
    # request that asked for no cache left nothing there.
    [key] = redis.keys("laya:cache:*")
    cached = orjson.loads(redis.get(key))  # type: ignore[arg-type]
    assert cached == {"text": "pqrs", "model": "default", "finish_reason": "length",
                      "usage": result.usage.model_dump()}
    assert 0 < redis.ttl(key) <= settings.router.cache_ttl_s
    assert results[uncached].route == "model:default"


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


def test_a_worker_skips_a_request_that_already_has_a_result(settings: Settings, redis: Redis,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    from laya.results import ResultStore
    from laya.schema import Result

    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    # Another worker answered it first (the job was delivered twice): this delivery must not run the model.
    ResultStore(redis, Keys("laya"), ttl_s=3600).write(Result(id=request_id, route="model:default", ok=True,
                                                            text="first answer"), None)
    with caplog.at_level(logging.INFO, logger="laya.worker"):
        run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    job = Queue("laya:llm:default:normal", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None and job.return_value() == {"route": "duplicate"}
    assert f"request {request_id} already has a result; not running it again" in caplog.text
    assert client.result(request_id).text == "first answer"  # type: ignore[union-attr]
    assert not redis.exists(f"laya:lock:{request_id}")


def test_a_worker_does_not_run_a_request_another_worker_holds(settings: Settings, redis: Redis,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    lock = f"laya:lock:{request_id}"
    redis.set(lock, "the-other-worker", ex=5)  # it is running there right now: its heartbeat renews the lock
    running = threading.Event()

    def holder() -> None:
        while not running.wait(0.2):
            redis.expire(lock, 5)

    renewing = threading.Thread(target=holder)
    renewing.start()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="laya.worker"):
            run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    finally:
        running.set()
        renewing.join()
    assert time.monotonic() - started < 10  # it saw the renewal, not the end of its lock_ttl_s (58 s) watch
    job = Queue("laya:llm:default:normal", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None and job.return_value() == {"route": "duplicate"}
    assert f"request {request_id} is running on b'the-other-worker'; not running it twice" in caplog.text
    assert client.result(request_id) is None  # the holder answers it
    assert redis.get(lock) == b"the-other-worker"  # and keeps its lock


def test_a_lock_its_holder_stopped_renewing_is_taken_and_the_request_answered(settings: Settings, redis: Redis,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    # A job retried after a failover cut its first attempt short: that attempt could not release the lock, and
    # nobody renews it. Returning "duplicate" would finish the job with no result; the lock is waited out instead.
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    redis.set(f"laya:lock:{request_id}", "laya-default-gone-1", px=1500)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="laya.worker"):
        run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    result = client.result(request_id)
    assert result is not None and result.ok and result.route.startswith("model:"), result
    assert time.monotonic() - started >= 1.0  # it waited for the lock to expire
    assert "took over the lock" in caplog.text and "not running it twice" not in caplog.text
    assert not redis.exists(f"laya:lock:{request_id}")


class SlowFirstChunk(LlamaBackend):
    """A first chunk of prompt that takes 2.5 s: less than the 5 s heartbeat_ttl_s the test sets, more than what is
    left of it after a wait of lock_ttl_s (4 s)."""

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        time.sleep(2.5)
        return super().generate(request, max_tokens=max_tokens, controls=controls)


def test_a_job_that_waited_out_a_stale_lock_is_not_reaped_while_it_runs(settings: Settings, redis: Redis) -> None:
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(
        update={"heartbeat_ttl_s": 5, "job_retries": 0})})
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    while entries := router.read_batch():
        router.handle(entries)
    redis.set(f"laya:lock:{request_id}", "laya-default-gone-1", px=3000)  # renewed just before its holder went
    done = threading.Event()

    def reap() -> None:  # a router's reaper, as it runs every reap_interval_s
        while not done.wait(0.2):
            router.reaper.run_once()

    reaper = threading.Thread(target=reap)
    reaper.start()
    try:
        run_worker(settings, redis, burst=True, backend=SlowFirstChunk(settings))
    finally:
        done.set()
        reaper.join()
    result = client.result(request_id)
    assert result is not None and result.ok and result.route.startswith("model:"), result  # not error:worker_lost


class OneLongStep(LlamaBackend):
    """One call that does not return for ``seconds``, as a prompt chunk on a busy CPU or a stuck GPU would."""

    seconds = 7.0

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        time.sleep(self.seconds)
        return super().generate(request, max_tokens=max_tokens, controls=controls)


def run_with_reaper(settings: Settings, redis: Redis, backend: LlamaBackend, request_id: str) -> float:
    """Route ``request_id``, then run a burst worker on ``backend`` while a reaper runs as routers run it;
    the seconds the worker took."""
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    while entries := router.read_batch():
        router.handle(entries)
    done = threading.Event()

    def reap() -> None:
        while not done.wait(0.2):
            router.reaper.run_once()

    reaper = threading.Thread(target=reap)
    reaper.start()
    started = time.monotonic()
    try:
        run_worker(settings, redis, burst=True, backend=backend)
    finally:
        done.set()
        reaper.join()
    return time.monotonic() - started


def test_a_step_longer_than_the_heartbeat_ttl_does_not_look_like_a_dead_worker(settings: Settings,
                                                                               redis: Redis) -> None:
    """Heartbeats come from their own thread: one 7 s native call is not 7 s without a heartbeat (TTL 5 s)."""
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(
        update={"heartbeat_ttl_s": 5, "heartbeat_interval_s": 1.0, "job_retries": 0})})
    request_id = Client(redis).submit("jello", max_tokens=4)
    took = run_with_reaper(settings, redis, OneLongStep(settings), request_id)
    result = Client(redis).result(request_id)
    assert took >= OneLongStep.seconds
    assert result is not None and result.ok and result.route == "model:default", result  # not error:worker_lost
    assert Job.fetch(request_id, connection=redis, serializer="json").get_status() == "finished"


def test_a_job_stuck_past_its_deadline_gets_no_heartbeats_and_is_reaped(settings: Settings, redis: Redis,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Beats stop at the job's deadline (job_timeout_s, plus the lock wait it may have had): a call stuck past it
    is a worker lost, answered error:worker_lost while the call still hangs."""
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(
        update={"heartbeat_ttl_s": 5, "heartbeat_interval_s": 1.0, "job_retries": 0, "job_timeout_s": 1})})
    stuck = OneLongStep(settings)
    stuck.seconds = 14.0  # deadline 1 s + lock_ttl_s 4 s, then the last beat's 5 s TTL and a reaping pass
    request_id = Client(redis).submit("jello", max_tokens=4)
    answered: list[float] = []
    started = time.monotonic()
    watcher = threading.Thread(target=lambda: answered.append(
        Client(redis).wait(request_id, timeout=30) and time.monotonic() - started))
    watcher.start()
    with caplog.at_level(logging.INFO, logger="laya.worker"):
        run_with_reaper(settings, redis, stuck, request_id)
    watcher.join()
    result = Client(redis).result(request_id)
    assert result is not None and result.route == "error:worker_lost", result
    assert answered and answered[0] < stuck.seconds, "answered only once the stuck call returned"
    assert "kept the first one" in caplog.text  # the stuck attempt's own answer, when it came, was not used


def test_a_worker_holds_the_request_s_lock_while_it_runs_and_releases_it(settings: Settings,
                                                                        redis: Redis) -> None:
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=8)
    route_all(settings, redis)
    backend = LlamaBackend(settings)
    seen: list[tuple[bytes | None, int]] = []
    original = backend.llm.detokenize

    def look_at_the_lock(tokens: list[int], *args: object, **kwargs: object) -> bytes:
        lock = f"laya:lock:{request_id}"
        seen.append((redis.get(lock), int(redis.ttl(lock))))
        return original(tokens, *args, **kwargs)  # type: ignore[arg-type]

    backend.llm.detokenize = look_at_the_lock  # type: ignore[method-assign]
    run_worker(settings, redis, burst=True, backend=backend)
    assert client.wait(request_id, timeout=5).route == "model:default"
    holder, ttl = seen[0]
    assert holder is not None and holder.startswith(b"laya-default-")
    assert 0 < ttl <= settings.runtime.lock_ttl_s
    assert not redis.exists(f"laya:lock:{request_id}")


@pytest.mark.parametrize("job_retries", [0, 2])
def test_an_unexpected_failure_is_retried_job_retries_times(settings: Settings, redis: Redis,
                                                           job_retries: int) -> None:
    """``runtime.job_retries``, from the router's job to the worker's retry, with a fault that clears."""
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(
        update={"job_retries": job_retries})})
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    route_all(settings, redis)
    job = Queue("laya:llm:default:normal", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None and (job.retries_left or 0) == job_retries
    backend = LlamaBackend(settings)
    attempts = 0
    generate = backend.generate

    def fails_twice(*args: Any, **kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts <= 2:
            raise RuntimeError(f"a fault Laya did not expect (attempt {attempts})")
        return generate(*args, **kwargs)

    backend.generate = fails_twice  # type: ignore[method-assign]
    run_worker(settings, redis, burst=True, backend=backend)
    result = client.wait(request_id, timeout=5)
    if job_retries:
        assert attempts == 3 and result.route == "model:default" and result.text == "pqrs"
    else:
        assert attempts == 1 and result.route == "error:internal"
        assert "attempt 1" in result.error.message  # type: ignore[union-attr]


def test_a_worker_stops_listening_for_commands_within_seconds(settings: Settings, redis: Redis) -> None:
    from laya.worker.rqworker import LayaWorker, _StopSignal

    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    with _StopSignal() as stop:
        worker = LayaWorker([queue], settings=settings, backend=LlamaBackend(settings), connection=redis, stop=stop)
    worker.subscribe()
    time.sleep(0.3)
    # RQ's teardown unsubscribes, then stops the listener thread and waits for it. When the thread
    # reads the unsubscribe reply first, it waits for a new subscription for a whole poll (RQ's:
    # 60 s) before it sees the stop. Make that race certain: unsubscribe, and let the thread read it.
    assert worker.pubsub is not None
    worker.pubsub.unsubscribe()
    time.sleep(0.5)
    started = time.monotonic()
    worker.unsubscribe()
    assert time.monotonic() - started < 5
