"""The one job function Laya's workers run, and the runtime it runs in.

RQ imports whatever ``func_name`` a job record names. The worker checks every
job against :data:`ALLOWED_FUNCTIONS` before running it, so writing a job
naming ``os.system`` into a Laya queue runs nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from laya.cache import cacheable
from laya.codec import error_result
from laya.errors import ContextTooLong, LayaError
from laya.schema import Request, Result, Timings, Usage

if TYPE_CHECKING:
    from redis import Redis

    from laya.backend import LLMBackend
    from laya.keys import Keys
    from laya.results import ResultStore

__all__ = ["ALLOWED_FUNCTIONS", "JOB_FUNCTION", "WorkerRuntime", "generate", "install_runtime"]

JOB_FUNCTION = "laya.jobs.generate"
ALLOWED_FUNCTIONS = frozenset({JOB_FUNCTION})

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
    heartbeat: Callable[[], None]
    """Throttled liveness signal, called from the token loop."""


_runtime: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def generate(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one routed request on the loaded model and write its result."""
    if _runtime is None:
        raise RuntimeError("laya.jobs.generate runs only inside `laya worker`")
    rt = _runtime
    started = time.time()
    request = Request.model_validate(payload["request"])
    model = payload["model"]
    max_tokens = int(payload["max_tokens"])
    timings = Timings(route_us=payload.get("route_us"),
                      queue_wait_ms=max(0.0, (started - float(payload["routed_at"])) * 1000))
    deadline = time.monotonic() + rt.job_timeout_s
    try:
        gen = rt.backend.generate(request, max_tokens=max_tokens, deadline=deadline,
                                  on_token=lambda _count: rt.heartbeat())
    except LayaError as exc:
        result = error_result(request.id, exc, timings=timings, model=model, metadata=request.metadata)
        _finish(rt, request, result)
        log.warning("request %s failed: %s", request.id, exc.code)
        if isinstance(exc, ContextTooLong):
            return {"route": result.route}
        raise
    timings.ttft_ms = gen.ttft_s * 1000
    timings.generation_ms = gen.generation_s * 1000
    timings.tokens_per_s = gen.decode_tokens_per_s
    result = Result(
        id=request.id, route=f"model:{model}", ok=True, text=gen.text, model=model,
        finish_reason=gen.finish_reason, timings=timings, metadata=request.metadata,
        usage=Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens),
    )
    cache_key = payload.get("cache_key")
    if cache_key and cacheable(gen.finish_reason, gen.completion_tokens, max_tokens):
        answer = {"text": gen.text, "model": model, "finish_reason": gen.finish_reason,
                  "usage": result.usage.model_dump()}
        rt.redis.set(rt.keys.cache(cache_key), orjson.dumps(answer), ex=rt.cache_ttl_s)
    _finish(rt, request, result)
    return {"route": result.route, "completion_tokens": gen.completion_tokens}


def _finish(rt: WorkerRuntime, request: Request, result: Result) -> None:
    result.finished_at = time.time()
    if request.submitted_at is not None:
        result.timings.total_ms = max(0.0, (result.finished_at - request.submitted_at) * 1000)
    if not rt.results.write(result, request.reply_to):
        log.info("request %s already had a result; kept the first one", request.id)
