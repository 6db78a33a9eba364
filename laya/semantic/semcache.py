"""The semantic cache: a model answer reused for a prompt that means the same thing.

Opt-in twice: the model (``[model] semantic_cache = true``) and the request
(``"cache": "semantic"``). It answers only prompt requests (not chats, whose
meaning depends on the whole conversation), after the exact cache missed.

**Scope.** Entries live in buckets keyed by a digest of everything except the
prompt that the exact cache key holds (:func:`laya.router.cache.generation_params`):
the model, ``max_tokens``, every sampling parameter, the stop strings and the
response format with its schema. A lookup only searches its own bucket, so an
answer never crosses models, schemas or sampling parameters.

**Match.** The nearest stored prompts whose embedding similarity reaches
``router.semantic_threshold`` are checked, nearest first, by
:mod:`laya.semantic.verifier`; the first that passes answers, with ``route:
"cache:semantic"`` and its ``similarity``. An embedding alone would answer
"do not refund my order" with the answer to "refund my order".

**Filling.** The worker that computed a cacheable answer for such a request
appends it to one Redis stream (``Keys.semantic_log``, capped); every router
reads that stream's new entries, in the same batch that needs them (one
XREAD), and keeps its own in-memory index. A router that starts reads the
whole capped stream, so it knows every answer still in it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from laya.contract import CachedAnswer, SemanticLogEntry
from laya.semantic.embedder import TextEmbedder
from laya.semantic.verifier import Words, analyse, verify

if TYPE_CHECKING:
    from redis import Redis

    from laya.keys import Keys

__all__ = ["Hit", "SemanticCache"]

log = logging.getLogger("laya.semantic.semcache")

_CHECKED = 8
"""Nearest candidates the verifier looks at before the lookup gives up."""


@dataclass(frozen=True, slots=True)
class Hit:
    answer: CachedAnswer
    similarity: float


@dataclass(slots=True)
class _Bucket:
    """One scope's entries in insertion order: a ring of rows ``[start, end)`` of a growing array."""

    dim: int
    vectors: npt.NDArray[np.float32] = field(init=False)
    words: list[Words] = field(default_factory=list)
    answers: list[CachedAnswer] = field(default_factory=list)
    expiries: list[float] = field(default_factory=list)
    start: int = 0

    def __post_init__(self) -> None:
        self.vectors = np.empty((16, self.dim), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.words) - self.start

    def add(self, vector: npt.NDArray[np.float32], words: Words, answer: CachedAnswer, expires_at: float) -> None:
        end = len(self.words)
        if end == self.vectors.shape[0]:
            self._compact(grow=True)
            end = len(self.words)
        self.vectors[end] = vector
        self.words.append(words)
        self.answers.append(answer)
        self.expiries.append(expires_at)

    def drop_oldest(self) -> None:
        self.start += 1
        if self.start > 64 and self.start * 2 > len(self.words):
            self._compact(grow=False)

    def _compact(self, *, grow: bool) -> None:
        live = len(self)
        capacity = max(16, live * 2 if grow else self.vectors.shape[0])
        vectors = np.empty((capacity, self.dim), dtype=np.float32)
        vectors[:live] = self.vectors[self.start:len(self.words)]
        self.vectors = vectors
        self.words = self.words[self.start:]
        self.answers = self.answers[self.start:]
        self.expiries = self.expiries[self.start:]
        self.start = 0


class SemanticCache:
    """A router's in-memory semantic index, filled from the semantic log. Not thread-safe (router thread)."""

    def __init__(self, embedder: TextEmbedder, *, threshold: float, capacity: int) -> None:
        self.embedder = embedder
        self.threshold = threshold
        self.capacity = capacity
        self._buckets: dict[str, _Bucket] = {}
        self._order: OrderedDict[int, str] = OrderedDict()
        """Insertion serial → scope: the global oldest-first order for eviction."""
        self._serial = 0
        self.last_id = "0-0"
        """The last semantic-log entry read."""

    def __len__(self) -> int:
        return len(self._order)

    def add(self, scope: str, prompt: str, answer: CachedAnswer, expires_at: float) -> None:
        if self.capacity <= 0 or expires_at <= time.time():
            return
        bucket = self._buckets.get(scope)
        if bucket is None:
            bucket = self._buckets[scope] = _Bucket(self.embedder.dim)
        bucket.add(self.embedder.embed(prompt), analyse(prompt), answer, expires_at)
        self._serial += 1
        self._order[self._serial] = scope
        while len(self._order) > self.capacity:
            _, oldest = self._order.popitem(last=False)
            self._buckets[oldest].drop_oldest()

    def lookup(self, scope: str, prompt: str) -> Hit | None:
        """The answer of the nearest stored prompt the verifier accepts, if one is near enough."""
        bucket = self._buckets.get(scope)
        if bucket is None or len(bucket) == 0:
            return None
        query = self.embedder.embed(prompt)
        end = len(bucket.words)
        scores = bucket.vectors[bucket.start:end] @ query
        near = np.flatnonzero(scores >= self.threshold)
        if near.size == 0:
            return None
        near = near[np.argsort(-scores[near])][:_CHECKED]
        words = analyse(prompt)
        now = time.time()
        for offset in near:
            row = bucket.start + int(offset)
            if bucket.expiries[row] > now and verify(words, bucket.words[row]).same:
                return Hit(bucket.answers[row], round(float(scores[offset]), 4))
        return None

    def read_log(self, redis: Redis, keys: Keys, count: int = 10_000) -> int:
        """Add the semantic-log entries written since the last read; returns how many."""
        added = 0
        while True:
            reply: Any = redis.xread({keys.semantic_log: self.last_id}, count=count)
            if not reply:
                return added
            entries = next(iter(reply.values()))[0] if isinstance(reply, dict) else reply[0][1]
            for entry_id, fields in entries:
                self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                try:
                    entry = SemanticLogEntry.decode(fields)
                except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
                    log.warning("semantic log entry %s is malformed; skipped", self.last_id)
                    continue
                self.add(entry.scope, entry.prompt, entry.answer, entry.expires_at)
                added += 1
            if len(entries) < count:
                return added
