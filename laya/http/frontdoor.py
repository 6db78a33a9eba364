"""The front door's side of Redis: submit a request, wait for its result or follow its stream.

One process holds a small pool of connections, however many clients wait: every
request it submits names the process's own reply channel (``reply_to``), and
one dispatcher task pops that channel and hands each result to the client that
waits for it. A result whose wake-up was missed (the channel expired, Redis
restarted) is found by reading the waiting requests' result records once a
second while the channel is quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError, ResponseError

from laya.codec import FIELD, decode_result, encode_request
from laya.config import Settings
from laya.keys import Keys
from laya.schema import Request, Result
from laya.sentinel import is_sentinel_url, parse_sentinel_url
from laya.streaming import END, RESET, TEXT

__all__ = ["FrontDoor", "StreamEvent", "open_async_redis"]

log = logging.getLogger("laya.http")

_SWEEP_AFTER_S = 1.0
_DRAIN = 256


def open_async_redis(settings: Settings) -> aioredis.Redis:
    """An asyncio client for the configured server (a Sentinel URL follows the primary)."""
    url = settings.redis.effective_url
    options: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": 5, "socket_keepalive": True,
                               "health_check_interval": 30}
    if is_sentinel_url(url):
        address = parse_sentinel_url(url)
        sentinels = Sentinel(address.sentinels, sentinel_kwargs=address.sentinel_options)
        client: aioredis.Redis = sentinels.master_for(address.service, **options, **address.server_options)
        return client
    return aioredis.Redis.from_url(url, **options)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One step of a streaming answer: new ``text``, or the end with its ``result``."""

    text: str = ""
    result: Result | None = None


class FrontDoor:
    """Submits requests to the ingress and gives back their results, for one ``laya serve`` process."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.channel = f"serve-{uuid.uuid4().hex[:16]}"
        self._waiting: dict[str, asyncio.Future[Result]] = {}
        self._task: asyncio.Task[None] | None = None
        self._blmpop = True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._dispatch(), name="laya-serve-dispatcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.redis.delete(self.keys.reply(self.channel))

    async def existing(self, request_id: str) -> Result | None:
        raw = await self.redis.get(self.keys.result(request_id))
        return decode_result(raw) if raw is not None else None

    async def submit(self, request: Request) -> None:
        """XADD the request to the ingress, its answer addressed to this process's channel."""
        if not request.stream:
            request.reply_to = self.channel
        request.submitted_at = time.time()
        await self.redis.xadd(self.keys.ingress, {FIELD: encode_request(request)})

    async def answer(self, request: Request, *, timeout: float) -> Result:
        """Submit ``request`` and wait for its result; :class:`TimeoutError` after ``timeout`` seconds."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = future
        try:
            await self.submit(request)
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            self._waiting.pop(request.id, None)

    async def follow(self, request: Request, *, timeout: float) -> AsyncGenerator[StreamEvent, None]:
        """Submit a streaming ``request`` and yield its new text as it comes, then its end.

        A job retried after its worker died starts its text again (a ``reset``
        entry): text this reader already gave is not given twice, and an attempt
        whose text differs from what was given ends the stream with an error.
        """
        await self.submit(request)
        key = self.keys.stream(request.id)
        last, given, attempt = "0-0", "", ""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(request.id)
            reply: Any = await self.redis.xread({key: last}, count=1000, block=int(min(left, 1.0) * 1000) or 1)
            for entry_id, fields in (reply[0][1] if reply else []):
                last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                if END in fields:
                    result = decode_result(fields[END])
                    text = result.text or ""
                    yield StreamEvent(text=text[len(given):] if text.startswith(given) else "", result=result)
                    return
                if RESET in fields:
                    attempt = ""
                    continue
                attempt += fields.get(TEXT, b"").decode()
                if attempt.startswith(given):
                    new, given = attempt[len(given):], attempt
                    if new:
                        yield StreamEvent(text=new)
                elif not given.startswith(attempt):
                    raise StreamDiverged(request.id)

    async def _dispatch(self) -> None:
        key = self.keys.reply(self.channel)
        while True:
            try:
                results = await self._pop(key)
                if not results:
                    await self._sweep()
                    continue
                for raw in results:
                    self._deliver(decode_result(raw))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("reply channel %s: %s; retrying", key, exc)
                await asyncio.sleep(0.5)
            except Exception:  # a record that does not decode must not stop every other client's answers
                log.exception("reply channel %s: a result could not be read", key)

    async def _pop(self, key: str) -> list[bytes]:
        """The results on the channel, waiting up to a second for the first: one BLMPOP takes up to
        :data:`_DRAIN` of them in one round trip (Redis 7, Valkey); before Redis 7, BLPOP and then LPOP."""
        if self._blmpop:
            try:
                popped: Any = await self.redis.blmpop(_SWEEP_AFTER_S, 1, key, direction="LEFT", count=_DRAIN)
                return list(popped[1]) if popped else []
            except ResponseError:
                self._blmpop = False
                log.info("this Redis has no BLMPOP: the reply channel is read with BLPOP and LPOP")
        first = await self.redis.blpop([key], timeout=_SWEEP_AFTER_S)
        if first is None:
            return []
        return [first[1], *(await self.redis.lpop(key, _DRAIN) or [])]

    def _deliver(self, result: Result) -> None:
        future = self._waiting.get(result.id)
        if future is not None and not future.done():
            future.set_result(result)

    async def _sweep(self) -> None:
        """Read the records of requests still waiting: the answer is there even if its wake-up was lost."""
        ids = [request_id for request_id, future in self._waiting.items() if not future.done()]
        if not ids:
            return
        for raw in await self.redis.mget([self.keys.result(i) for i in ids]):
            if raw is not None:
                self._deliver(decode_result(raw))


class StreamDiverged(Exception):
    """A retried attempt's text differs from what the reader was already given."""
