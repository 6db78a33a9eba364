"""``laya serve``: OpenAI's HTTP API in front of Laya's queue.

A producer like :class:`~laya.client.Client`: it checks each request as the
client does, XADDs it to the ingress, and answers from the result record (or
the request's token stream). It never loads a model; any number of them run
beside any number of routers.

Starlette on uvicorn, not FastAPI: the requests are checked by Laya's own
models and messages (the field, the value, what to send instead), so FastAPI's
validation layer would only add time to a path whose budget is a millisecond.

Status codes: 400 a bad request (``param`` names the field), 401 a missing or
wrong API key, 404 an unknown model, 413 a body or request too large, 429 the
model's lane is full (``Retry-After`` says when to come back; the SDKs' retries
wait for it), 504 ``error:expired`` (the request's ``deadline_s`` passed before a
worker started it; ``x-should-retry: false``, since a retry cannot meet it
either) or no answer within ``[http] request_timeout_s``, 502 a job that failed
in the worker, 503 Redis unreachable. A client that disconnects leaves its
request to run: its result record stays readable (``laya result ID``).
"""

from __future__ import annotations

import hmac
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from hashlib import sha256
from typing import Any

import anyio
import orjson
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram, generate_latest
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route

from laya.config import Settings
from laya.errors import InvalidRequest, LayaError, UnknownModel
from laya.http import openai
from laya.http.batches import Batches, run_batches
from laya.http.files import Files
from laya.http.frontdoor import FrontDoor, StreamDiverged, open_async_redis
from laya.keys import Keys
from laya.metrics import new_registry
from laya.schema import REQUEST_ID_PATTERN, Request, Result
from laya.structured import check_schema

__all__ = ["HttpMetrics", "build_app", "idempotent_id", "run_serve"]

log = logging.getLogger("laya.http")

_ID = re.compile(REQUEST_ID_PATTERN)
_STATUS = {"invalid_request": 400, "invalid_json": 400, "context_too_long": 400, "unknown_model": 404,
           "file_not_found": 404, "batch_not_found": 404,
           "too_large": 413, "overloaded": 429, "expired": 504, "not_replicated": 503}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
          429: "rate_limit_error", 502: "api_error", 503: "api_error", 504: "timeout_error"}


def idempotent_id(key: str) -> str:
    """The request id of an ``Idempotency-Key``: the key itself when it is a valid id, else a digest of it."""
    if _ID.match(key):
        return key
    return "idem-" + sha256(key.encode()).hexdigest()[:40]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, message: str, *, code: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> Response:
    return _json({"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param,
                            "code": code}}, status, headers)


def _result_error(result: Result) -> Response:
    """The HTTP error of a result that is not an answer."""
    assert result.error is not None
    code = result.error.code
    status = _STATUS.get(code, 502)
    headers = {"x-request-id": result.id, "x-laya-route": result.route}
    if code == "overloaded":
        headers["retry-after"] = str(max(1, math.ceil(result.retry_after_s or 1)))
    if code == "expired":
        headers["x-should-retry"] = "false"
    return _error(status, result.error.message, code=code, param=result.error.field, headers=headers)


class HttpMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        self.requests = PromCounter("laya_http_requests", "Requests the front door answered, by endpoint, status and "
                                    "route.", ["endpoint", "status", "route"], registry=self.registry)
        self.latency = Histogram("laya_http_request_seconds", "Time from a request's arrival to its answer (a "
                                 "stream's end).", ["endpoint"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5, 30, 120, 600))
        self.batch_lines = PromCounter("laya_batch_lines", "Lines of /v1/batches batches this front door finished, "
                                       "by state (completed: in the output file; failed: in the error file).",
                                       ["state"], registry=self.registry)

    def count(self, endpoint: str, status: int, route: str, started: float) -> None:
        self.requests.labels(endpoint, str(status), route).inc()
        self.latency.labels(endpoint).observe(time.perf_counter() - started)


def build_app(settings: Settings) -> Starlette:
    """The ASGI application of ``laya serve`` for ``settings``."""
    keys = Keys(settings.redis.prefix)
    http = settings.http
    models = settings.model_names
    api_keys = [key.encode() for key in http.api_keys]
    metrics = HttpMetrics()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        door = FrontDoor(open_async_redis(settings), keys)
        await door.start()
        state["door"] = door
        files = Files(http.files_dir.resolve(), door.redis, keys, max_bytes=http.max_file_bytes,
                      max_lines=http.max_file_lines)
        state["files"] = files
        batches = Batches(door.redis, keys, files)
        state["batches"] = batches
        runners = anyio.create_task_group()
        await runners.__aenter__()
        runners.start_soon(run_batches, settings, files.directory, batches.created,
                           lambda state, n: metrics.batch_lines.labels(state).inc(n))
        try:
            yield
        finally:
            runners.cancel_scope.cancel()
            await runners.__aexit__(None, None, None)
            await door.stop()
            await door.redis.aclose()

    def authorised(request: HttpRequest) -> bool:
        if not api_keys:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        return scheme.lower() == "bearer" and any(hmac.compare_digest(given, key) for key in api_keys)

    async def read_body(request: HttpRequest) -> Any:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise InvalidRequest(f"Content-Type {kind or 'missing'!r:.60}: send the body as application/json",
                                 code="invalid_json")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > http.max_body_bytes:
            raise InvalidRequest(f"the body is {declared} bytes, over [http] max_body_bytes = {http.max_body_bytes}",
                                 code="too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > http.max_body_bytes:
                raise InvalidRequest(f"the body is over [http] max_body_bytes = {http.max_body_bytes}",
                                     code="too_large")
            chunks.append(chunk)
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the body is not JSON ({exc}); send one JSON object", code="invalid_json") from None

    def checked(request: Request) -> Request:
        if request.model is not None and request.model not in models:
            raise UnknownModel(f"model {request.model!r} is not served here; the models are {', '.join(models)} "
                               "(GET /v1/models lists them)", field="model")
        if request.response_format is not None and request.response_format.schema_ is not None:
            check_schema(request.response_format.schema_)
        return request

    def endpoint(name: str, parse: Callable[..., Request], respond: Callable[..., dict[str, Any]],
                 chunk: Callable[..., dict[str, Any]]) -> Callable[[HttpRequest], Any]:
        async def handle(http_request: HttpRequest) -> Response:
            started = time.perf_counter()
            response = await _handle(http_request, started)
            if not isinstance(response, StreamingResponse):
                metrics.count(name, response.status_code, response.headers.get("x-laya-route", "none"), started)
            return response

        async def _handle(http_request: HttpRequest, started: float) -> Response:
            if not authorised(http_request):
                return _error(401, "missing or wrong API key: send Authorization: Bearer KEY with a key from "
                              "[http] api_keys", code="invalid_api_key")
            door: FrontDoor = state["door"]
            try:
                body = await read_body(http_request)
                key = http_request.headers.get("idempotency-key")
                request = checked(parse(body, request_id=idempotent_id(key) if key else None))
                model = request.model or models[0]
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                if key:
                    known = await door.existing(request.id)
                    if known is not None:
                        return _answer(known, model, respond)
                if request.stream:
                    return await _stream(door, request, model, include_usage, started)
                result = await door.answer(request, timeout=http.request_timeout_s)
                return _answer(result, model, respond)
            except LayaError as exc:
                status = _STATUS.get(exc.code, 400)
                return _error(status, exc.message, code=exc.code, param=exc.field)
            except TimeoutError:
                return _error(504, f"no answer within [http] request_timeout_s = {http.request_timeout_s:g} s; the "
                              "request goes on: send it again with the same Idempotency-Key to get its answer",
                              code="timeout")
            except (RedisError, OSError) as exc:
                log.warning("Redis unreachable: %s", exc)
                return _error(503, f"Laya's Redis does not answer ({type(exc).__name__}); try again once it is back",
                              code="server_unavailable")

        def _answer(result: Result, model: str, build: Callable[..., dict[str, Any]]) -> Response:
            if not result.ok and result.error is not None and result.error.code != "incomplete_json":
                return _result_error(result)
            return _json(build(result, model=model, created=int(time.time())),
                         headers={"x-request-id": result.id, "x-laya-route": result.route})

        async def _stream(door: FrontDoor, request: Request, model: str, include_usage: bool,
                          started: float) -> Response:
            events = door.follow(request, timeout=http.request_timeout_s)
            first = await events.__anext__()
            if first.result is not None and not first.result.ok and first.result.error is not None \
                    and first.result.error.code != "incomplete_json":
                await events.aclose()
                return _result_error(first.result)
            created = int(time.time())

            def sse(data: dict[str, Any]) -> bytes:
                return b"data: " + orjson.dumps(data) + b"\n\n"

            async def body() -> AsyncIterator[bytes]:
                status, route = 200, "none"
                try:
                    opening = {"first": True} if name == "chat" else {}
                    event = first
                    while True:
                        if event.text or opening:
                            yield sse(chunk(request.id, model=model, created=created, text=event.text, **opening))
                            opening = {}
                        if event.result is not None:
                            route = event.result.route
                            yield sse(chunk(request.id, model=model, created=created, result=event.result))
                            if include_usage:
                                yield sse({"id": request.id, "object": "chat.completion.chunk" if name == "chat"
                                           else "text_completion", "created": created, "model": model,
                                           "choices": [], "usage": openai.usage(event.result)})
                            break
                        event = await events.__anext__()
                except (TimeoutError, StreamDiverged) as exc:
                    status = 504 if isinstance(exc, TimeoutError) else 502
                    message = ("no end within [http] request_timeout_s" if status == 504 else
                               "the job was retried and its new attempt wrote different text; read the whole "
                               f"answer with `laya result {request.id}`")
                    yield sse({"error": {"message": message, "type": _TYPES[status], "param": None,
                                         "code": "timeout" if status == 504 else "stream_diverged"}})
                finally:
                    await events.aclose()
                    metrics.count(name, status, route, started)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(body(), media_type="text/event-stream",
                                     headers={"x-request-id": request.id, "cache-control": "no-cache"})

        return handle

    async def list_models(http_request: HttpRequest) -> Response:
        if not authorised(http_request):
            return _error(401, "missing or wrong API key", code="invalid_api_key")
        from laya.connection import connect
        from laya.worker.presence import read_workers

        def beating() -> dict[str, dict[str, Any]]:
            """Each model's first live worker's status: the context it loaded and its plan's verdict."""
            live = read_workers(connect(settings, check=False), keys, settings)
            return {w.model: w.fields for w in reversed(live) if not w.gone}

        try:
            workers = await anyio.to_thread.run_sync(beating)
        except (RedisError, OSError, LayaError):
            workers = {}
        created = int(time.time())
        served = {m.name: m for m in settings.served}
        return _json({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "laya",
             "laya": {"n_ctx": workers.get(name, {}).get("n_ctx", settings.runtime.max_seq_len),
                      "plan": workers.get(name, {}).get("verdict", "no worker beating"),
                      "path": str(served[name].path) if name in served and served[name].path else None}}
            for name in models]})

    async def health(_request: HttpRequest) -> Response:
        from laya.connection import connect
        from laya.ops.health import check_health

        def check() -> Any:
            return check_health(connect(settings, check=False), settings)

        found = await anyio.to_thread.run_sync(check)
        return _json({"ok": found.ok, "problems": found.problems, "passed": found.passed}, 200 if found.ok else 503)

    def files_endpoint(action: Callable[[Any, HttpRequest], Any], part: str = "files") -> Callable[[HttpRequest], Any]:
        """A /v1/files or /v1/batches endpoint: the API key checked, Laya's errors as OpenAI's."""
        async def handle(http_request: HttpRequest) -> Response:
            if not authorised(http_request):
                return _error(401, "missing or wrong API key", code="invalid_api_key")
            try:
                answer = await action(state[part], http_request)
            except LayaError as exc:
                return _error(_STATUS.get(exc.code, 400), exc.message, code=exc.code, param=exc.field)
            except (RedisError, OSError) as exc:
                log.warning("files: %s", exc)
                return _error(503, f"Redis or the files directory is unavailable ({type(exc).__name__}); try again "
                              "shortly", code="unavailable")
            return answer if isinstance(answer, Response) else _json(answer)

        return handle

    async def file_content(files: Files, http_request: HttpRequest) -> Response:
        file_id = http_request.path_params["file_id"]
        await files.retrieve(file_id)
        return FileResponse(files.path(file_id), media_type="application/jsonl")

    async def list_files(files: Files, http_request: HttpRequest) -> dict[str, Any]:
        query = http_request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest(f"order {order!r:.20}: send asc or desc", field="order")
        try:
            limit = int(query.get("limit", "10000"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 10_000:
            raise InvalidRequest(f"limit {query.get('limit')!r:.20}: send a whole number from 1 to 10000",
                                 field="limit")
        return await files.list(purpose=query.get("purpose"), limit=limit, after=query.get("after"), order=order)

    async def create_batch(batches: Batches, http_request: HttpRequest) -> dict[str, Any]:
        return await batches.create(await read_body(http_request))

    async def list_batches(batches: Batches, http_request: HttpRequest) -> dict[str, Any]:
        try:
            limit = int(http_request.query_params.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise InvalidRequest(f"limit {http_request.query_params.get('limit')!r:.20}: send a whole number from "
                                 "1 to 100", field="limit")
        return await batches.list(limit=limit, after=http_request.query_params.get("after"))

    async def serve_metrics(_request: HttpRequest) -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/v1/chat/completions", endpoint("chat", openai.chat_request, openai.chat_response,
                                               openai.chat_chunk), methods=["POST"]),
        Route("/v1/completions", endpoint("completions", openai.completion_request, openai.completion_response,
                                          openai.completion_chunk), methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/files", files_endpoint(lambda files, r: files.create(r)), methods=["POST"]),
        Route("/v1/files", files_endpoint(list_files), methods=["GET"]),
        Route("/v1/files/{file_id}", files_endpoint(lambda files, r: files.retrieve(r.path_params["file_id"])),
              methods=["GET"]),
        Route("/v1/files/{file_id}", files_endpoint(lambda files, r: files.delete(r.path_params["file_id"])),
              methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", files_endpoint(file_content), methods=["GET"]),
        Route("/v1/batches", files_endpoint(create_batch, "batches"), methods=["POST"]),
        Route("/v1/batches", files_endpoint(list_batches, "batches"), methods=["GET"]),
        Route("/v1/batches/{batch_id}", files_endpoint(lambda b, r: b.retrieve(r.path_params["batch_id"]), "batches"),
              methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel",
              files_endpoint(lambda b, r: b.cancel(r.path_params["batch_id"]), "batches"), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", serve_metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def run_serve(settings: Settings) -> None:
    """Serve the HTTP API on ``[http] bind:port`` until SIGINT/SIGTERM."""
    import uvicorn

    log.info("laya serve on http://%s:%d/v1", settings.http.bind, settings.http.port)
    uvicorn.run(build_app(settings), host=settings.http.bind, port=settings.http.port, log_level="warning",
                access_log=False, lifespan="on")
