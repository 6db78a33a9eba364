"""The exact response cache: an in-process LRU in front of Redis.

The key is a 128-bit BLAKE2b digest of the model, every generation parameter
and the normalised text, so equal requests (up to case and whitespace) share an
answer. The router checks the LRU first (no I/O), then Redis in one pipelined
read per batch; the worker fills both sides through Redis. Only complete model
answers are stored: errors and answers cut short by a deadline or the context
window never are.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from hashlib import blake2b
from typing import Any

import orjson

from laya.contract import CachedAnswer
from laya.schema import Request
from laya.structured import canonical
from laya.text import normalise

__all__ = ["LocalCache", "cache_key", "generation_params", "scope_of"]


def cache_key(request: Request, model: str, max_tokens: int, normalised: str | None = None) -> str:
    """Hex digest identifying the answer to ``request`` on ``model``.

    ``max_tokens`` is the effective value (after defaults), so a request that
    omits it and one that spells out the default share an entry. The response
    format (schema included) is part of the key: JSON to one schema is not an
    answer to another, nor to a request for plain text.
    """
    if request.messages is not None:
        body: Any = [(m.role, normalise(m.content)) for m in request.messages]
    else:
        body = normalised if normalised is not None else normalise(request.text)
    params = generation_params(request, model, max_tokens)
    params.insert(-1, body)  # the key's material as it has always been ordered: keys already stored stay valid
    return blake2b(orjson.dumps(params), digest_size=16).hexdigest()


def generation_params(request: Request, model: str, max_tokens: int) -> list[Any]:
    """Everything but the text that decides a model's answer: the model, the budget, the sampling
    parameters, the stop strings and the response format (schema included)."""
    return [model, max_tokens, request.temperature, request.top_p, request.top_k, request.repeat_penalty,
            request.seed, request.stop, canonical(request.response_format)]


def scope_of(request: Request, model: str, max_tokens: int) -> str:
    """The semantic cache's bucket of a request: every part of the exact cache key except the text."""
    return blake2b(orjson.dumps(generation_params(request, model, max_tokens)), digest_size=12).hexdigest()


class LocalCache:
    """A bounded LRU of cached answers, keyed by digest, each kept at most ``ttl_s``.

    Not thread-safe: the router is single-threaded.
    """

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, CachedAnswer]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedAnswer | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: str, answer: CachedAnswer) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = (time.monotonic() + self.ttl_s, answer)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
