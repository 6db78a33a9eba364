"""The router's stages: each looks at a batch of requests in flight and may answer some.

A :class:`Flight` is one stream entry on its way. Stages only decide: a stage that
answers sets the flight's result record (``Flight.answer``), admission marks it
for a job; :mod:`laya.router.ingress` runs the stages in order and commits what
they decided in one write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from laya.codec import Limits, decode_request, error_fields, salvage_identity
from laya.contract import CachedAnswer
from laya.errors import Expired, RequestError
from laya.keys import Keys
from laya.router.cache import LocalCache, cache_key, scope_of
from laya.router.rules import Rule, RuleSet
from laya.schema import Request
from laya.text import normalise

if TYPE_CHECKING:
    from redis import Redis

    from laya.config import Settings
    from laya.semantic.embedder import TextEmbedder
    from laya.semantic.intents import IntentIndex
    from laya.semantic.semcache import SemanticCache

__all__ = ["AdmissionStage", "CacheStage", "DecodeStage", "Flight", "IntentStage", "QueueId", "RulesStage",
           "SemanticCacheStage", "Stage", "accepted_at", "intent_index", "semantic_cache", "semantic_embedder",
           "wants_semantic"]

log = logging.getLogger("laya.router.stages")


@dataclass(slots=True)
class Flight:
    """One stream entry on its way through the stages."""

    entry_id: str
    fields: dict[bytes, bytes]
    started_ns: int
    request_id: str = ""
    reply_to: str | None = None
    request: Request | None = None
    normalised: str = ""
    model: str = ""
    lane: str = "normal"
    expires_at: float | None = None
    """Unix time after which the request is not worth starting (from ``deadline_s``)."""
    max_tokens: int = 0
    cache_key: str | None = None
    route: str | None = None
    """Set when a stage answered: ``cache``, ``rule:<name>``, ``error:<code>``, ``rejected:overloaded``."""
    result: bytes | None = None
    """The answer as result-record JSON (the :class:`~laya.schema.Result` schema)."""
    enqueue: bool = False
    route_ns: int = 0
    """From the batch read to this request's decision: its own decision plus the batch's wait."""
    decide_ns: int = 0
    """This request's own decision (hand-on, rules, cache look-up), as ``bench/routing.py`` times it."""
    rule_matched: bool = False
    """A rule matched (even one that only chose the model): the intents stage leaves the request alone."""
    semantic_scope: str | None = None
    """Set by the semantic cache stage on a miss: the worker records the answer under this scope."""

    @property
    def open(self) -> bool:
        return self.route is None and not self.enqueue

    def answer(self, route: str, ok: bool, **fields: Any) -> None:
        """End this request with a result record made of ``fields`` and its timings.

        The record is encoded straight to JSON: building a pydantic ``Result``
        per answer would cost more than the routing decision itself. Tests
        decode every kind of router answer through ``Result`` to keep the two
        in step.
        """
        self.route_ns = time.perf_counter_ns() - self.started_ns
        now = time.time()
        timings = {"route_us": self.route_ns / 1000}
        request = self.request
        if request is not None:
            fields["metadata"] = request.metadata
            if request.submitted_at is not None:
                timings["total_ms"] = max(0.0, (now - request.submitted_at) * 1000)
        self.route = route
        self.result = orjson.dumps({"id": self.request_id, "route": route, "ok": ok, **fields,
                                    "timings": timings, "finished_at": now})


class Stage(Protocol):
    name: str

    def run(self, flights: Sequence[Flight], redis: Redis) -> None: ...


class DecodeStage:
    """Validate each entry; a bad one gets an ``error:<code>`` result."""

    name = "decode"

    def __init__(self, limits: Limits, default_model: str, default_max_tokens: int) -> None:
        self.limits = limits
        self.default_model = default_model
        self.default_max_tokens = default_max_tokens

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        clock = time.perf_counter_ns
        for flight in flights:
            try:
                request = decode_request(flight.fields, self.limits)
            except RequestError as exc:  # a decoder bug is the router's to contain (Router._run_stage)
                flight.request_id, flight.reply_to = salvage_identity(flight.fields, flight.entry_id)
                flight.answer(**error_fields(exc))
                continue
            start = clock()
            self.accept(flight, request)
            flight.decide_ns += clock() - start

    def accept(self, flight: Flight, request: Request) -> None:
        """Hand a decoded request on to the next stages (``bench/routing.py`` times from here)."""
        flight.request = request
        flight.request_id, flight.reply_to = request.id, request.reply_to
        flight.model = request.model or self.default_model
        flight.max_tokens = request.max_tokens or self.default_max_tokens
        flight.normalised = normalise(request.text)
        flight.lane = request.priority
        if request.deadline_s is not None:
            flight.expires_at = accepted_at(flight.entry_id) + request.deadline_s


class CacheStage:
    """Answer from the in-process LRU, then from Redis in one MGET for the batch's misses.

    It runs after the rules, so the key it computes names the model that will
    answer (a rule may have sent the request to another model); the worker
    stores its answer under the same key.
    """

    name = "cache"

    def __init__(self, local: LocalCache, keys: Keys) -> None:
        self.local = local
        self.keys = keys

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        misses: list[tuple[Flight, str]] = []
        clock = time.perf_counter_ns
        for flight in flights:
            request = flight.request
            if not flight.open or request is None or not request.cache:
                continue
            start = clock()
            key = flight.cache_key = cache_key(request, flight.model, flight.max_tokens, flight.normalised)
            answer = self.local.get(key)
            if answer is not None:
                self._answer(flight, answer)
            else:
                misses.append((flight, key))
            flight.decide_ns += clock() - start
        if not misses:
            return
        values = redis.mget([self.keys.cache(key) for _, key in misses])
        for (flight, key), value in zip(misses, values):
            if value is None:
                continue
            answer = CachedAnswer.decode(value)
            self.local.put(key, answer)
            self._answer(flight, answer)

    @staticmethod
    def _answer(flight: Flight, answer: CachedAnswer) -> None:
        flight.answer(route="cache", ok=True, **answer.as_dict())


class RulesStage:
    """Reply from a rule's template, or point the request at the rule's model.

    A request that asks for structured output (``response_format``) is never answered from a
    template, whose text is not the JSON asked for; a rule may still choose its model.
    """

    name = "rules"

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        rules = self.rules  # one reference per batch: a reload swaps it between batches
        clock = time.perf_counter_ns
        for flight in flights:
            if not flight.open or flight.request is None:
                continue
            start = clock()
            match = rules.match(flight.normalised)
            if match is not None:
                flight.rule_matched = True
                spec = match.rule.spec
                if spec.model is not None:
                    flight.model = spec.model
                elif flight.request.response_format is None:  # a template is text, not the JSON asked for
                    text = match.rule.render(prompt=flight.request.text, matched=match.matched,
                                             request_id=flight.request_id)
                    flight.answer(route=f"rule:{spec.name}", ok=True, text=text, finish_reason="rule")
            flight.decide_ns += clock() - start


class IntentStage:
    """After the exact cache: match the requests no pattern matched and no cached answer answered.

    Running after the exact cache keeps a cached answer from paying for an
    embedding. An intent that sends a request to another model changes its
    exact cache key: those requests go through the exact cache stage again
    (``recheck``), under their new model.
    """

    name = "intents"

    def __init__(self, index: IntentIndex[Rule] | None, recheck: Callable[[Sequence[Flight], Redis], None]) -> None:
        self.index = index
        """``None``: no rule has examples, or the embedder is unavailable; the stage does nothing."""
        self.recheck = recheck

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        index = self.index  # one reference per batch: a reload swaps it between batches
        if index is None:
            return
        moved = []
        for flight in flights:
            if not flight.open or flight.request is None or flight.rule_matched:
                continue
            match = index.match(flight.normalised)
            if match is None:
                continue
            flight.rule_matched = True
            spec = match.rule.spec
            if spec.model is not None:
                if spec.model != flight.model:
                    flight.model = spec.model
                    flight.cache_key = None
                    moved.append(flight)
                continue
            if flight.request.response_format is not None:
                continue  # a reply template is text, not the JSON asked for: the model answers
            text = match.rule.render(prompt=flight.request.text, matched=match.example, request_id=flight.request_id)
            flight.answer(route=f"rule:{spec.name}", ok=True, text=text, finish_reason="rule",
                          similarity=match.similarity)
        if moved:
            self.recheck(moved, redis)


def wants_semantic(request: Request) -> bool:
    """The request asked for the semantic cache and is a prompt (a chat never is matched by meaning)."""
    return request.cache == "semantic" and request.prompt is not None


class SemanticCacheStage:
    """After the exact cache: answer ``cache: "semantic"`` prompts from the semantic cache.

    It reads the semantic log only for a batch holding such a request (one
    XREAD), and marks the misses so the worker records their answers.
    """

    name = "semantic_cache"

    def __init__(self, cache: SemanticCache | None, keys: Keys, models: frozenset[str]) -> None:
        self.cache = cache
        """``None``: no model allows it, or the embedder is unavailable; the stage does nothing."""
        self.keys = keys
        self.models = models

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        cache = self.cache
        if cache is None:
            return
        wanted = [f for f in flights if f.open and f.request is not None and f.model in self.models
                  and wants_semantic(f.request)]
        if not wanted:
            return

        cache.read_log(redis, self.keys)
        for flight in wanted:
            assert flight.request is not None
            scope = scope_of(flight.request, flight.model, flight.max_tokens)
            hit = cache.lookup(scope, flight.request.text)
            if hit is None:
                flight.semantic_scope = scope
                continue
            flight.answer(route="cache:semantic", ok=True, similarity=hit.similarity, **hit.answer.as_dict())


def semantic_embedder(settings: Settings, rules: RuleSet) -> TextEmbedder | None:
    """The embedder the semantic stages need, or ``None`` when they are off; :mod:`laya.semantic` is imported
    only when they are on.

    Off when ``router.semantic`` is false, when nothing uses it (no rule has
    examples, no model allows the semantic cache), or when it fails to load:
    then one line says why, and the router serves exact routing only.
    """
    if not settings.router.semantic:
        return None
    if not settings.semantic_models and not any(rule.spec.examples for rule in rules.rules):
        return None
    from laya.semantic.embedder import EmbedderUnavailable, load_embedder

    try:
        return load_embedder(settings.router.embedder_dir)
    except EmbedderUnavailable as exc:
        log.error("semantic stages off (rule examples and the semantic cache; exact routing goes on): %s",
                  exc.message)
        return None


def intent_index(rules: RuleSet, embedder: TextEmbedder | None, *, threshold: float) -> IntentIndex[Rule] | None:
    """The examples of ``rules``, embedded; ``None`` when none has examples or there is no embedder."""
    if embedder is None or not any(rule.spec.examples for rule in rules.rules):
        return None
    from laya.semantic.intents import IntentIndex

    return IntentIndex(rules.rules, embedder, default_threshold=threshold)


def semantic_cache(settings: Settings, embedder: TextEmbedder | None) -> SemanticCache | None:
    """The semantic cache's index, or ``None`` when there is no embedder or no model allows it."""
    if embedder is None or not settings.semantic_models:
        return None
    from laya.semantic.semcache import SemanticCache

    cfg = settings.router
    return SemanticCache(embedder, threshold=cfg.semantic_threshold, capacity=cfg.semantic_cache_size)


QueueId = tuple[str, str]
"""(model, lane): one RQ queue."""


class AdmissionStage:
    """Bound each model lane; over the bound a request is refused with a retry-after.

    The depth it compares is the lane's length read by this batch (one pipelined
    LLEN for the lanes the batch needs) plus what earlier batches admitted and
    have not committed yet. While a commit is in flight its jobs may be counted
    twice, once in the length and once as uncommitted: the error is on the safe
    side and lasts one batch.
    """

    name = "admission"

    def __init__(self, max_depth: int, retry_after_s: float, queue_keys: dict[QueueId, str]) -> None:
        self.max_depth = max_depth
        self.retry_after_s = retry_after_s
        self.queue_keys = queue_keys
        self.queued: dict[QueueId, int] = {}
        """Queue lengths as last read."""
        self.uncommitted: Counter[QueueId] = Counter()
        """Admitted into batches whose commit has not finished yet."""
        self._lock = threading.Lock()

    def depth(self, lane: QueueId) -> int:
        return self.queued.get(lane, 0) + self.uncommitted[lane]

    def committed(self, lengths: dict[QueueId, int], admitted: Counter[QueueId]) -> None:
        """A commit finished: its admissions are now part of the queue lengths it read.

        A commit that failed passes no lengths: its entries stay pending in the
        stream and will be admitted again when they are delivered again.
        """
        with self._lock:
            self.queued.update(lengths)
            self.uncommitted.subtract(admitted)

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        waiting = [f for f in flights if f.open]
        if not waiting:
            return
        now = time.time()
        self._read_depths({(f.model, f.lane) for f in waiting}, redis)
        for flight in waiting:
            if flight.expires_at is not None and now >= flight.expires_at:
                assert flight.request is not None and flight.request.deadline_s is not None
                flight.answer(**error_fields(Expired(
                    f"deadline_s {flight.request.deadline_s:g} passed before the router reached the request; "
                    "nothing ran. Raise deadline_s")))
                continue
            lane = (flight.model, flight.lane)
            with self._lock:
                depth = self.depth(lane)
                if depth < self.max_depth:
                    self.uncommitted[lane] += 1
            if depth >= self.max_depth:
                flight.answer(route="rejected:overloaded", ok=False, retry_after_s=self.retry_after_s,
                              error={"code": "overloaded", "message": (
                                  f"{flight.lane} lane of model {flight.model!r} holds {depth} jobs (bound "
                                  f"{self.max_depth}); retry after {self.retry_after_s:g} s")})
                continue
            flight.enqueue = True
            flight.route_ns = time.perf_counter_ns() - flight.started_ns

    def _read_depths(self, lanes: set[QueueId], redis: Redis) -> None:
        ordered = [lane for lane in lanes if lane in self.queue_keys]
        with redis.pipeline(transaction=False) as pipe:
            for lane in ordered:
                pipe.llen(self.queue_keys[lane])
            lengths = pipe.execute()
        with self._lock:
            self.queued.update(zip(ordered, (int(n) for n in lengths)))


def accepted_at(entry_id: str) -> float:
    """Unix time at which the server accepted a stream entry: its id is ``<milliseconds>-<sequence>``."""
    return int(entry_id.partition("-")[0]) / 1000
