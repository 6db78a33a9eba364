"""The ingress router: stream entries in, results or RQ jobs out.

Each batch read from the ingress stream goes through an ordered list of
stages; the first stage that answers a request ends it:

    decode → rules → cache → intents → semantic cache → admission → enqueue

The intents stage (rules matched by their ``examples``, :mod:`laya.semantic.intents`)
and the semantic cache (:mod:`laya.semantic.semcache`) need the embedding model; if it
is not needed or cannot be loaded they do nothing, and :mod:`laya.semantic` is not imported.

Each model has one RQ queue per priority lane (high, normal, bulk); admission
bounds each lane on its own, so a flood of bulk work never refuses a high
request. A request with ``deadline_s`` expires ``deadline_s`` after the server
accepted it (its stream entry id is the server's clock at XADD): admission
answers one already expired ``error:expired``, and the job carries the expiry
to the worker.

Rules come before the cache: the cache holds model answers only, so a
request a rule answers never needs it, and checking rules first saves the
batch's Redis cache read whenever rules answer everything in it. A reloaded
rule also takes effect at once instead of being shadowed by a cached model
answer.

Stages only decide. Everything a batch writes — result records, RQ jobs, the
XACK/XDEL of its entries, counters — is committed in one MULTI/EXEC pipeline,
so a router killed at any moment leaves each entry either fully handled or
still pending in the stream, where another router (or this one, restarted)
reclaims it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, Retry

from laya.codec import Limits, error_fields, salvage_identity
from laya.config import Settings
from laya.connection import ReplicaAcks
from laya.contract import JOB_FUNCTION, JobPayload, ring
from laya.errors import LayaError
from laya.keys import Keys
from laya.metrics import RouterMetrics, new_registry, serve
from laya.results import ResultStore
from laya.router.cache import LocalCache
from laya.router.latency import LatencyWindow
from laya.router.reaper import Reaper
from laya.router.rules import Rule, RuleSet, load_rules, why_no_rules
from laya.router.stages import (
    AdmissionStage,
    CacheStage,
    DecodeStage,
    Flight,
    IntentStage,
    QueueId,
    RulesStage,
    SemanticCacheStage,
    Stage,
    intent_index,
    semantic_cache,
    semantic_embedder,
)
from laya.schema import LANES
from laya.streaming import add_end
from laya.wire import Wire

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

    from laya.semantic.intents import IntentIndex

__all__ = ["Flight", "Router", "run_router"]

log = logging.getLogger("laya.router")


class Router:
    """Reads the ingress stream in batches and commits each batch atomically.

    Under a backlog (full batches), while one batch commits (a thread waiting
    on Redis) the next one already runs through the stages: at most two
    batches are in flight, and each commit is still one atomic write.
    """

    def __init__(self, settings: Settings, redis: Redis, *, rules: RuleSet | None = None,
                 consumer: str | None = None, metrics: RouterMetrics | None = None) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.redis.prefix)
        cfg = settings.router
        # The pid lets `laya up` tell its own router from one an earlier run left in the group (laya.ops.stack).
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.results = ResultStore(redis, self.keys, ttl_s=cfg.result_ttl_s, acks=ReplicaAcks.of(settings.redis))
        # Connections held for the read → route → commit loop (laya.wire says why). Reads run on this
        # thread; a commit runs here or on the commit thread, one at a time, while the next read goes on.
        self._reads = Wire(redis, held=True)
        self._commits = Wire(redis, held=True)
        limits = Limits(max_request_bytes=cfg.max_request_bytes, max_messages=cfg.max_messages,
                        max_tokens_limit=settings.runtime.max_tokens_limit,
                        models=frozenset(settings.model_names))
        self.decode_stage = DecodeStage(limits, settings.model.name, settings.runtime.default_max_tokens)
        self.rules_stage = RulesStage(rules if rules is not None else
                                      load_rules(cfg.routes_file, models=settings.model_names))
        self.cache_stage = CacheStage(LocalCache(cfg.cache_size, cfg.cache_ttl_s), self.keys)
        self.embedder = semantic_embedder(settings, self.rules_stage.rules)
        self.intent_stage = IntentStage(self._intents(self.rules_stage.rules), self.cache_stage.run)
        self.semantic_stage = SemanticCacheStage(semantic_cache(settings, self.embedder), self.keys,
                                                 settings.semantic_models)
        self.queues: dict[QueueId, Queue] = {
            (name, lane): Queue(self.keys.queue_name(name, lane), connection=redis, serializer="json")
            for name in settings.model_names for lane in LANES}
        self.admission = AdmissionStage(cfg.max_queue_depth, cfg.retry_after_s,
                                        {lane: queue.key for lane, queue in self.queues.items()})
        self.stages: list[Stage] = [self.decode_stage, self.rules_stage, self.cache_stage, self.intent_stage,
                                    self.semantic_stage, self.admission]
        self.reaper = Reaper.of(redis, settings, owner=self.consumer)
        self._reap_due = 0.0
        self._last_read = 0.0
        self._watching_since = 0.0
        """Since when this router has read Redis without a break (see :meth:`_may_reap`)."""
        self.latency = LatencyWindow()
        """Each request's own decision time."""
        self.batch_latency = LatencyWindow()
        """From the batch read to each request's decision (its decision plus its wait in the batch)."""
        self.metrics = metrics
        self._counts: Counter[str] = Counter()
        self._stats_due = 0.0
        self._claim_due = 0.0
        self._stopping = False
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-commit")
        self._pending: Future[None] | None = None

    # -- setup ---------------------------------------------------------------

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.keys.ingress, self.keys.router_group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.redis.hset(self.keys.admission, "max_queue_depth", self.settings.router.max_queue_depth)
        self._refresh_depths(self.redis)

    def _recreate_group(self) -> None:
        """The server has no consumer group: a replica promoted before the group reached it, or the stream
        was deleted. Recreated from the stream's start, the unread entries get routed; an entry answered
        before is answered the same way again (results are written once per id)."""
        log.warning("the ingress stream has no consumer group %r on this server (after a failover?); creating it",
                    self.keys.router_group)
        try:
            self.ensure_group()
        except (RedisConnectionError, RedisTimeoutError):
            pass
        time.sleep(0.2)  # a Sentinel that lags may keep naming a server without the group for a moment

    def _refresh_depths(self, redis: Redis) -> None:
        with redis.pipeline(transaction=False) as pipe:
            for queue in self.queues.values():
                pipe.llen(queue.key)
            lengths = dict(zip(self.queues, (int(n) for n in pipe.execute())))
        self.admission.committed(lengths, Counter())

    def reload_rules(self) -> bool:
        """Recompile the routes file; on any error keep serving the old rules."""
        cfg = self.settings.router
        try:
            new = load_rules(cfg.routes_file, models=self.settings.model_names)
        except Exception as exc:  # noqa: BLE001 - a bad file must never take the router down
            log.error("rules reload refused, keeping %d old rules: %s", len(self.rules_stage.rules), exc)
            return False
        if self.embedder is None:
            self.embedder = semantic_embedder(self.settings, new)
        self.intent_stage.index = self._intents(new)
        self.rules_stage.rules = new
        log.info("rules reloaded: %d rules from %s", len(new), new.source)
        return True

    def _intents(self, rules: RuleSet) -> IntentIndex[Rule] | None:
        """The examples of ``rules``, embedded; ``None`` when none has examples or there is no embedder."""
        return intent_index(rules, self.embedder, threshold=self.settings.router.intent_threshold)

    # -- the loop ------------------------------------------------------------

    def _read_done(self, clock: float) -> None:
        """A read returned at ``clock``; one that came later than a blocked read can take means this
        router was cut off from Redis (or stalled) until now."""
        if clock - self._last_read > self.settings.router.block_ms / 1000 + 1.0:
            self._watching_since = clock
        self._last_read = clock

    def _may_reap(self, clock: float) -> bool:
        """Whether this router has watched for ``runtime.heartbeat_ttl_s`` without a break. While it could
        not reach Redis, the workers most likely could not either: their missed beats are not deaths
        until they have had a whole TTL to beat again."""
        return clock - self._watching_since >= self.settings.runtime.heartbeat_ttl_s

    def read_batch(self) -> list[tuple[str, dict[bytes, bytes]]]:
        cfg = self.settings.router
        entries: Any = []  # redis-py's reply types are too loose to name
        now = time.monotonic()
        if now >= self._claim_due:
            self._claim_due = now + cfg.claim_idle_ms / 2000
            _, entries, _ = self.redis.xautoclaim(self.keys.ingress, self.keys.router_group, self.consumer,
                                                  min_idle_time=cfg.claim_idle_ms, start_id="0-0",
                                                  count=cfg.batch_size)[:3]
            entries = [e for e in entries if e[1] is not None]
            if entries:
                log.warning("reclaimed %d pending entries idle over %d ms", len(entries), cfg.claim_idle_ms)
        if entries:
            return [(entry_id.decode(), fields) for entry_id, fields in entries]
        reply = self._reads.call("XREADGROUP", "GROUP", self.keys.router_group, self.consumer,
                                 "COUNT", cfg.batch_size, "BLOCK", cfg.block_ms, "STREAMS", self.keys.ingress, ">")
        if not reply:
            return []
        # One stream: [[name, entries]] in RESP2, {name: entries} in RESP3; an entry is [id, [field, value, ...]].
        new = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        return [(entry_id.decode(), dict(zip(fields[::2], fields[1::2]))) for entry_id, fields in new]

    def handle(self, entries: list[tuple[str, dict[bytes, bytes]]], *, wait: bool = True) -> list[Flight]:
        """Run ``entries`` through the stages and commit the batch.

        With ``wait=False`` the commit runs in the background while the caller
        reads and routes the next batch; the next call (or :meth:`flush`) waits
        for it and raises whatever it raised. With ``wait=True`` it runs here,
        which saves the hand-over to the commit thread when there is no next
        batch to overlap with.
        """
        started = time.perf_counter_ns()
        flights = [Flight(entry_id, fields, started) for entry_id, fields in entries]
        for stage in self.stages:
            self._run_stage(stage, flights)
        routed_ns = time.perf_counter_ns() - started
        try:
            self.flush()
        except BaseException:  # this batch is dropped too: it stays pending and comes back
            self.admission.committed({}, _admitted(flights))
            raise
        if wait:
            self.commit(flights)
        else:
            self._pending = self._committer.submit(self.commit, flights)
        for flight in flights:  # after the commit, off the path between a submit and its answer
            self._counts[flight.route or f"model:{flight.model}"] += 1
            self.latency.add(flight.decide_ns)
            self.batch_latency.add(flight.route_ns)
        if self.metrics is not None:
            self.metrics.routed([f.decide_ns for f in flights], routed_ns, len(flights))
        return flights

    def _run_stage(self, stage: Stage, flights: list[Flight]) -> None:
        """Run a stage on the batch; if it fails (a bug), run it request by request, so one
        request that trips the bug gets an ``error:internal`` result and the others go on."""
        try:
            stage.run(flights, self.redis)
            return
        except (RedisConnectionError, RedisTimeoutError):
            raise
        except Exception:
            log.exception("stage %s failed on a batch of %d; running it request by request", stage.name,
                          len(flights))
        for flight in flights:
            if not flight.open:
                continue
            try:
                stage.run([flight], self.redis)
            except (RedisConnectionError, RedisTimeoutError):
                raise
            except Exception:
                log.exception("stage %s failed on entry %s", stage.name, flight.entry_id)
                _fail(flight, f"the router's {stage.name} stage failed on this request")

    def flush(self) -> None:
        """Wait for the batch being committed, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def commit(self, flights: list[Flight]) -> None:
        """Write the batch: results, RQ jobs, XACK and XDEL of its entries, all or nothing.

        If the write fails for any reason but Redis being unreachable (a bug, or
        a job RQ refuses), the entries are written one by one and each one that
        still fails is answered ``error:internal``: one poisoned entry must not
        keep its whole batch pending forever.
        """
        admitted = _admitted(flights)
        lengths: dict[QueueId, int] = {}
        started = time.perf_counter_ns()
        try:
            lengths = self._write(flights, set())
        except (RedisConnectionError, RedisTimeoutError):
            raise  # nothing was written; the entries stay pending
        except Exception:
            log.exception("batch commit failed; writing its %d entries one by one", len(flights))
            enqueued: set[str] = set()  # shared, so an id sent twice still becomes one job
            for flight in flights:
                try:
                    lengths = self._write([flight], enqueued) or lengths
                except (RedisConnectionError, RedisTimeoutError):
                    raise
                except Exception:
                    log.exception("entry %s could not be committed", flight.entry_id)
                    _fail(flight, "the router could not enqueue this request")
                    self._write([flight], enqueued)
        finally:
            self.admission.committed(lengths, admitted)
            if self.metrics is not None:
                self.metrics.commit.add(time.perf_counter_ns() - started)

    def _write(self, flights: list[Flight], enqueued: set[str]) -> dict[QueueId, int]:
        """One atomic write of ``flights``; returns the model queue lengths when it enqueued jobs.

        A batch that enqueues nothing (all short-circuit) is one script call; one
        with jobs is a MULTI/EXEC holding the same script, the enqueues and the
        queue lengths for admission; so is one that answers a streaming request,
        whose stream gets its end entry in the same write (with ``min_replica_acks``, in the step
        after WAIT that wakes the waiters: :meth:`ResultStore.wake`). Two entries with one request id (a producer
        that sent a request twice) become one job; both entries are acknowledged.
        ``enqueued`` holds the ids already enqueued by this batch and is updated.
        """
        now = time.time()
        by_queue: dict[QueueId, list[Any]] = {}
        answers = [(f.request_id, f.result, f.reply_to) for f in flights if f.result is not None]
        streams = [(f.request_id, f.result) for f in flights
                   if f.result is not None and f.request is not None and f.request.stream]
        for flight in flights:
            if flight.enqueue and flight.request is not None and flight.request_id not in enqueued:
                enqueued.add(flight.request_id)
                by_queue.setdefault((flight.model, flight.lane), []).append(self._job_data(flight, now))
        ids = [f.entry_id for f in flights]
        if not by_queue and not streams:
            self.results.commit(answers, group=self.keys.router_group, entry_ids=ids, wire=self._commits)
            return {}

        def end_streams(pipe: Pipeline) -> None:
            for request_id, result in streams:
                add_end(pipe, self.keys.stream(request_id), result, ttl_s=self.settings.router.result_ttl_s,
                        max_len=self.settings.runtime.stream_max_chunks)

        with self.redis.pipeline(transaction=True) as pipe:
            self.results.queue_commit(pipe, answers, group=self.keys.router_group, entry_ids=ids)
            if not self.results.wakes_after_ack:
                end_streams(pipe)
            for lane, datas in by_queue.items():
                self.queues[lane].enqueue_many(datas, pipeline=pipe)
                ring(pipe, self.keys.bell(lane[0]), len(datas))
            for lane in by_queue:
                pipe.llen(self.queues[lane].key)
            # With acks the stream ends go out after WAIT, with the wake-ups (they wake their readers too).
            replies = self.results.execute(pipe, wire=self._commits, answers=answers, then=end_streams)
        return dict(zip(by_queue, (int(n) for n in replies[-len(by_queue):]))) if by_queue else {}

    def _job_data(self, flight: Flight, now: float) -> Any:
        assert flight.request is not None
        payload = JobPayload(
            request=flight.request, model=flight.model, lane=flight.lane, max_tokens=flight.max_tokens,
            routed_at=now, route_us=flight.route_ns / 1000, expires_at=flight.expires_at,
            cache_key=flight.cache_key, semantic_scope=flight.semantic_scope,
        )
        runtime = self.settings.runtime
        return Queue.prepare_data(
            JOB_FUNCTION, args=[payload.encode()], job_id=flight.request_id,
            retry=Retry(max=runtime.job_retries) if runtime.job_retries else None,
            timeout=runtime.job_timeout_s, result_ttl=self.settings.router.result_ttl_s,
            failure_ttl=self.settings.router.result_ttl_s,
            description=f"laya {flight.model} {flight.lane} {flight.request_id}",
        )

    def publish_stats(self) -> None:
        """Counters and latency figures for operators; also re-reads the queue lengths for admission
        (workers drain queues while a router that only short-circuits never reads them)."""
        self.flush()  # a commit in flight would otherwise race the lengths read here
        self._refresh_depths(self.redis)
        counts, self._counts = self._counts, Counter()
        with self.redis.pipeline(transaction=False) as pipe:
            for route, n in counts.items():
                pipe.hincrby(self.keys.router_stats, f"count:{route}", n)
            for name, value in self.latency.summary("decision").items():
                pipe.hset(self.keys.router_stats, name, value)
            for name, value in self.batch_latency.summary("batch").items():
                pipe.hset(self.keys.router_stats, name, value)
            for model, lane in self.queues:
                pipe.hset(self.keys.router_stats, f"queue_depth:{model}:{lane}", self.admission.depth((model, lane)))
            pipe.hset(self.keys.router_stats, "rules", len(self.rules_stage.rules))
            pipe.hset(self.keys.router_stats, "updated_at", time.time())
            if self.metrics is not None:
                pipe.xinfo_groups(self.keys.ingress)
            replies = pipe.execute(raise_on_error=False)  # XINFO fails where the stream was deleted
        if self.metrics is not None:
            groups = replies[-1] if isinstance(replies[-1], list) else []
            group: dict[str, Any] = next((g for g in groups if _text(g.get("name")) == self.keys.router_group), {})
            self.metrics.published(counts, queue_depth={queue: self.admission.depth(queue) for queue in self.queues},
                                   backlog=int(group.get("lag") or 0), pending=int(group.get("pending") or 0),
                                   rules=len(self.rules_stage.rules))

    def stop(self, *_: object) -> None:
        self._stopping = True

    def run(self) -> None:
        self.ensure_group()
        # About to read: seen at once, on an empty stream too (Redis before 7.2 adds a reader only on delivery).
        self.redis.xgroup_createconsumer(self.keys.ingress, self.keys.router_group, self.consumer)
        log.info("router %s serving %s (%d rules, models %s)", self.consumer, self.keys.ingress,
                 len(self.rules_stage.rules), ", ".join(self.settings.model_names))
        if self.embedder is not None:
            log.info("semantic stages on: %d rule examples; semantic cache for %s",
                     len(self.intent_stage.index or ()), ", ".join(sorted(self.semantic_stage.models)) or "no model")
        if not self.rules_stage.rules:
            log.warning("%s", why_no_rules(self.settings.router.routes_file, self.settings.source))
        backoff = 0.1
        while not self._stopping:
            try:
                entries = self.read_batch()
                self._read_done(time.monotonic())
                if entries:
                    # A full batch means more are waiting: commit it while routing the next.
                    self.handle(entries, wait=len(entries) < self.settings.router.batch_size)
                else:
                    self.flush()
                clock = time.monotonic()
                if clock >= self._stats_due:
                    self._stats_due = clock + 1.0
                    self.publish_stats()
                if clock >= self._reap_due and self._may_reap(clock):
                    self._reap_due = clock + self.settings.router.reap_interval_s
                    self.reaper.run_once()
                backoff = 0.1
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("redis unavailable (%s); retrying in %.1f s", type(exc).__name__, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                try:
                    self.ensure_group()
                except (RedisConnectionError, RedisTimeoutError):
                    pass
            except Exception as exc:  # a bug: keep serving; the batch stays pending and is reclaimed
                if isinstance(exc, ResponseError) and str(exc).startswith("NOGROUP"):
                    self._recreate_group()
                    continue
                log.exception("batch failed; its entries will be reclaimed after %d ms",
                              self.settings.router.claim_idle_ms)
                time.sleep(1)
        self.flush()
        try:  # the counts of the last second would otherwise never reach `laya stats`
            self.publish_stats()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            log.warning("last counters not published (%s)", type(exc).__name__)
        self._committer.shutdown()
        self._reads.close()
        self._commits.close()
        log.info("router %s stopped", self.consumer)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _admitted(flights: list[Flight]) -> Counter[QueueId]:
    """How many of ``flights`` admission let into each model lane."""
    return Counter((f.model, f.lane) for f in flights if f.enqueue)


def _fail(flight: Flight, message: str) -> None:
    """Answer ``flight`` with ``error:internal`` (a Laya bug, not the producer's fault)."""
    if not flight.request_id:  # it failed before it was decoded
        flight.request_id, flight.reply_to = salvage_identity(flight.fields, flight.entry_id)
    flight.enqueue = False
    flight.answer(**error_fields(LayaError(f"{message}; the router log has the details", code="internal")))


def run_router(settings: Settings, redis: Redis, *, rules: RuleSet | None = None) -> None:
    """Entry point of ``laya router``: serve until SIGINT/SIGTERM; SIGHUP reloads rules. ``rules``: the routes
    file as already read (else read here)."""
    metrics = None
    if settings.metrics.serve_port:
        metrics = RouterMetrics()
        registry = new_registry()
        registry.register(metrics)
        serve(registry, settings.metrics, "router")
    router = Router(settings, redis, rules=rules, metrics=metrics)
    signal.signal(signal.SIGTERM, router.stop)
    signal.signal(signal.SIGINT, router.stop)
    signal.signal(signal.SIGHUP, lambda *_: router.reload_rules())
    router.run()
