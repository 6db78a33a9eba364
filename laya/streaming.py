"""Token streaming: a request's text chunks on a Redis stream of its own.

A request with ``stream: true`` gets the stream ``<prefix>:stream:<id>``. Entries:

* ``{"t": text}``: the next chunk. Concatenated, the chunks are the result's ``text``.
* ``{"reset": worker}``: a new attempt started (the job was retried after its worker died):
  drop the chunks seen so far; the chunks that follow start the text again.
* ``{"end": result JSON}``: the last entry, the request's result record.

Whoever answers the request writes the end entry: the worker after its result, the
router beside its rule, cache or error answer. The stream is capped
(``MAXLEN ~``) and expires with the result. A reader that lost its connection
reads on from the last entry id it saw (``XREAD`` after that id), so it misses
nothing and sees nothing twice.

The worker does not write one entry per token: chunks are gathered for
``flush_ms`` (the first one goes out at once, for time to first chunk), so a
fast GPU does not pay a round trip per token.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

__all__ = ["StreamWriter", "add_end"]

TEXT, RESET, END = b"t", b"reset", b"end"


def add_end(pipe: Redis | Pipeline, key: str, result_json: bytes, *, ttl_s: int, max_len: int) -> None:
    """Queue (on a pipeline) or send the end entry of a request's stream."""
    pipe.xadd(key, {END: result_json}, maxlen=max_len, approximate=True)
    pipe.expire(key, ttl_s)


class StreamWriter:
    """Appends one request's chunks to its stream, gathered ``flush_ms`` at a time."""

    def __init__(self, redis: Redis, key: str, *, ttl_s: int, max_len: int, flush_ms: float) -> None:
        self.redis = redis
        self.key = key
        self.ttl_s = ttl_s
        self.max_len = max_len
        self.flush_s = flush_ms / 1000
        self._buffer: list[str] = []
        self._flushed_at = 0.0
        self._sent_any = False

    def start(self, worker: str) -> None:
        """Mark a new attempt if an earlier one left chunks (a retried job), so readers start over."""
        if self.redis.exists(self.key):
            self.redis.xadd(self.key, {RESET: worker}, maxlen=self.max_len, approximate=True)

    def add(self, text: str) -> None:
        self._buffer.append(text)
        if not self._sent_any or time.monotonic() - self._flushed_at >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        chunk, self._buffer = "".join(self._buffer), []
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.key, {TEXT: chunk.encode()}, maxlen=self.max_len, approximate=True)
            if not self._sent_any:
                pipe.expire(self.key, self.ttl_s)
            pipe.execute()
        self._sent_any = True
        self._flushed_at = time.monotonic()

    def end(self, result_json: bytes) -> None:
        """Flush what is left, then the end entry (after the result record is written)."""
        self.flush()
        add_end(self.redis, self.key, result_json, ttl_s=self.ttl_s, max_len=self.max_len)
