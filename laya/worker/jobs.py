"""The one job function Laya's workers run, and the runtime it runs in.

Its name is :data:`laya.contract.JOB_FUNCTION`, and its one argument a
:class:`laya.contract.JobPayload`. Workers run nothing else
(:func:`laya.contract.is_laya_job`).

A job may be delivered more than once (a producer resubmitting an id, a job
requeued after its worker was declared lost). :func:`generate` therefore
skips a request that already has a result, and takes a per-request lock that
the worker's heartbeat keeps alive, so one request never runs on two workers
at once. A lock its holder no longer renews (an attempt a failover cut short)
is waited out and taken: a retried job must not be dropped as a duplicate.

The payload carries what the router worked out for a request: the model, the
effective ``max_tokens``, the cache key, and ``expires_at`` when the request has
a ``deadline_s``. A job that starts after its expiry is answered
``error:expired`` without running; one that is generating when it passes is cut
there and answered with the text so far (``finish_reason: "deadline"``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laya.codec import encode_result, error_result
from laya.connection import release_lock
from laya.contract import JOB_FUNCTION, CachedAnswer, JobPayload, SemanticLogEntry, cacheable
from laya.errors import Expired, LayaError
from laya.schema import ErrorInfo, Request, Result, Timings, Usage
from laya.streaming import StreamWriter, add_end
from laya.structured import parse_answer
from laya.worker.backend import Controls

if TYPE_CHECKING:
    from redis import Redis

    from laya.keys import Keys
    from laya.metrics import WorkerMetrics
    from laya.results import ResultStore
    from laya.worker.backend import LLMBackend

__all__ = ["WorkerRuntime", "generate", "install_runtime"]

log = logging.getLogger("laya.worker")


@dataclass(slots=True)
class WorkerRuntime:
    """What a job needs from the worker process that runs it."""

    backend: LLMBackend
    results: ResultStore
    redis: Redis
    keys: Keys
    job_timeout_s: float
    cache_ttl_s: int
    holding: Callable[[str | None], None]
    """Tells the worker which request lock the job holds (``None``: none), for its heartbeats to renew."""
    worker_name: str
    lock_ttl_s: int
    stream_flush_ms: float = 20.0
    stream_max_chunks: int = 10_000
    semantic_log_max: int = 10_000
    metrics: WorkerMetrics | None = None


_runtime: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def generate(raw: dict[str, Any]) -> dict[str, Any]:
    """Run one routed request on the loaded model and write its result."""
    if _runtime is None:
        raise RuntimeError(f"{JOB_FUNCTION} runs only inside `laya worker`")
    rt = _runtime
    started = time.time()
    payload = JobPayload.decode(raw)
    request = payload.request
    if _answered(rt, request.id):
        return {"route": "duplicate"}
    lock = rt.keys.lock(request.id)
    if not _take_lock(rt, lock):
        log.warning("request %s is running on %s; not running it twice", request.id, rt.redis.get(lock))
        return {"route": "duplicate"}
    rt.holding(lock)
    try:
        if _answered(rt, request.id):  # by the lock's last holder, before it went
            return {"route": "duplicate"}
        return _generate(rt, request, payload, started)
    finally:
        rt.holding(None)
        release_lock(rt.redis, lock, rt.worker_name)


def _answered(rt: WorkerRuntime, request_id: str) -> bool:
    if rt.redis.exists(rt.keys.result(request_id)):
        log.info("request %s already has a result; not running it again", request_id)
        return True
    return False


def _take_lock(rt: WorkerRuntime, lock: str) -> bool:
    """Take a request's lock; ``False`` when a live worker holds it (that worker writes the result).

    A holder that runs the request renews the lock with every heartbeat. A
    lock nobody renews was left by an attempt that ended without releasing it
    (a failover cut the connection; its job came back for a retry), and
    returning "duplicate" then would leave the request without an answer. So
    a held lock is watched for up to ``lock_ttl_s`` (the job's own heartbeats
    go on meanwhile): renewed means a live holder; gone means it was stale,
    and it is taken.
    """
    if rt.redis.set(lock, rt.worker_name, nx=True, ex=rt.lock_ttl_s):
        return True
    deadline = time.monotonic() + rt.lock_ttl_s
    left = int(rt.redis.pttl(lock))
    while time.monotonic() < deadline:
        time.sleep(_LOCK_POLL_S)
        if rt.redis.set(lock, rt.worker_name, nx=True, ex=rt.lock_ttl_s):
            log.warning("took over the lock of %s, which its holder stopped renewing", lock)
            return True
        now_left = int(rt.redis.pttl(lock))
        if now_left > left:  # renewed: its holder is alive and running the request
            return False
        left = now_left
    return False


_LOCK_POLL_S = 0.1


def _generate(rt: WorkerRuntime, request: Request, payload: JobPayload, started: float) -> dict[str, Any]:
    model = payload.model
    max_tokens = payload.max_tokens
    queue_wait_s = max(0.0, started - payload.routed_at)
    timings = Timings(route_us=payload.route_us, queue_wait_ms=queue_wait_s * 1000)
    expires_at = payload.expires_at
    if expires_at is not None and started >= expires_at:
        error = Expired(f"deadline_s {request.deadline_s:g} passed {started - expires_at:.1f} s before a "
                        "worker could start the request; nothing ran. Raise deadline_s, or send it with "
                        "priority \"high\"")
        _finish(rt, request, error_result(request.id, error, timings=timings, model=model, metadata=request.metadata))
        log.info("request %s expired in the queue; not run", request.id)
        if rt.metrics is not None:
            rt.metrics.finished(outcome="expired", queue_wait_s=queue_wait_s, ttft_s=None, rate=None,
                                prompt_tokens=0, cached_tokens=0, completion_tokens=0)
        return {"route": "error:expired"}
    stream = None
    if request.stream:
        stream = StreamWriter(rt.redis, rt.keys.stream(request.id), ttl_s=rt.results.ttl_s,
                              max_len=rt.stream_max_chunks, flush_ms=rt.stream_flush_ms)
        stream.start(rt.worker_name)
    clock = time.monotonic()
    controls = Controls(
        deadline=clock + rt.job_timeout_s,
        cut_at=clock + (expires_at - time.time()) if expires_at is not None else None,
        on_text=stream.add if stream is not None else None,
    )
    try:
        gen = rt.backend.generate(request, max_tokens=max_tokens, controls=controls)
    except LayaError as exc:
        # A handled failure is an answer: the producer gets the error, the job finishes.
        result = error_result(request.id, exc, timings=timings, model=model, metadata=request.metadata)
        _finish(rt, request, result)
        if rt.metrics is not None:
            rt.metrics.finished(outcome=exc.code, queue_wait_s=queue_wait_s, ttft_s=None,
                                rate=None, prompt_tokens=0, cached_tokens=0, completion_tokens=0)
        log.warning("request %s failed: %s", request.id, exc.code)
        return {"route": result.route}
    timings.ttft_ms = gen.ttft_s * 1000
    timings.generation_ms = gen.generation_s * 1000
    timings.tokens_per_s = gen.decode_tokens_per_s
    result = Result(
        id=request.id, route=f"model:{model}", ok=True, text=gen.text, model=model,
        finish_reason=gen.finish_reason, timings=timings, metadata=request.metadata,
        usage=Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens),
    )
    complete = True
    if request.response_format is not None:
        parsed = parse_answer(gen.text)
        complete = parsed.complete
        if complete:
            result.json_value = parsed.value
        else:
            result.ok = False
            result.error = ErrorInfo(code="incomplete_json", field="max_tokens", message=(
                f"generation stopped ({gen.finish_reason}) after {gen.completion_tokens} tokens, before the JSON "
                "closed; `text` holds the part generated. Raise max_tokens (or deadline_s)"))
    if payload.cache_key and complete and cacheable(gen.finish_reason, gen.completion_tokens, max_tokens):
        _store_answer(rt, payload, CachedAnswer(text=gen.text, model=model, finish_reason=gen.finish_reason,
                                                usage=result.usage.model_dump(), json=result.json_value))
    _finish(rt, request, result, stream)
    if rt.metrics is not None:
        outcome = "ok" if result.ok or result.error is None else result.error.code
        rt.metrics.finished(outcome=outcome, queue_wait_s=queue_wait_s, ttft_s=gen.ttft_s,
                            rate=gen.decode_tokens_per_s, prompt_tokens=gen.prompt_tokens,
                            cached_tokens=gen.cached_tokens, completion_tokens=gen.completion_tokens)
    return {"route": result.route, "completion_tokens": gen.completion_tokens}


def _store_answer(rt: WorkerRuntime, payload: JobPayload, answer: CachedAnswer) -> None:
    """Fill the exact cache, and the semantic log when the router's semantic lookup missed."""
    assert payload.cache_key is not None
    rt.redis.set(rt.keys.cache(payload.cache_key), answer.encode(), ex=rt.cache_ttl_s)
    prompt = payload.request.prompt
    if payload.semantic_scope and prompt is not None:
        entry = SemanticLogEntry(scope=payload.semantic_scope, prompt=prompt, answer=answer,
                                 expires_at=time.time() + rt.cache_ttl_s)
        rt.redis.xadd(rt.keys.semantic_log, entry.fields(), maxlen=rt.semantic_log_max, approximate=True)  # type: ignore[arg-type]


def _finish(rt: WorkerRuntime, request: Request, result: Result, stream: StreamWriter | None = None) -> None:
    result.finished_at = time.time()
    if request.submitted_at is not None:
        result.timings.total_ms = max(0.0, (result.finished_at - request.submitted_at) * 1000)
    if not rt.results.write(result, request.reply_to):
        log.info("request %s already had a result; kept the first one", request.id)
        kept = rt.results.get(request.id)
        result = kept if kept is not None else result
    if stream is not None:
        stream.end(encode_result(result))
    elif request.stream:
        add_end(rt.redis, rt.keys.stream(request.id), encode_result(result), ttl_s=rt.results.ttl_s,
                max_len=rt.stream_max_chunks)
