"""min_replica_acks on real servers: each kind of write waits for the replica, and says so when it
does not come (the replica SIGSTOPped for the duration of one write)."""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis import Redis

from laya.client import Client
from laya.codec import decode_result, encode_result
from laya.config import Settings
from laya.connection import ReplicaAcks, open_redis
from laya.errors import NotReplicated
from laya.keys import Keys
from laya.results import ResultStore
from laya.router.ingress import Router
from laya.schema import Result
from laya.wire import Wire
from tests.sentinels import SentinelSet

ACKS = ReplicaAcks(1, 200)


@contextmanager
def replica_stopped(sentinels: SentinelSet) -> Iterator[None]:
    replica = next(node for node in sentinels.nodes if node is not sentinels.primary())
    replica.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        replica.signal(signal.SIGCONT)
        sentinels.wait_healthy(1)


PATHS = ["router commit script", "router commit transaction", "worker result"]


def write(store: ResultStore, wire: Wire, path: str, result: Result) -> str:
    """Write ``result`` the way ``path`` does; its result key."""
    answers = [(result.id, encode_result(result), None)]
    if path == "router commit script":
        store.commit(answers, group="routers", entry_ids=[], wire=wire)
    elif path == "router commit transaction":
        with store.redis.pipeline(transaction=True) as pipe:
            store.queue_commit(pipe, answers, group="routers", entry_ids=[])
            pipe.llen("acks:llm:default")
            replies = store.execute(pipe, wire=wire, answers=answers)
        assert replies[-1] == 0
    else:
        store.write(result, None)
    return store.keys.result(result.id)


def start_blocked(redis: Redis, waiters: list[threading.Thread]) -> None:
    """Start ``waiters`` and return once the server holds each one's blocking read."""
    for waiter in waiters:
        waiter.start()
    deadline = time.monotonic() + 5
    while int(redis.info("clients")["blocked_clients"]) < len(waiters):
        assert time.monotonic() < deadline, "the waiters never blocked"
        time.sleep(0.01)


def new_result() -> Result:
    return Result(id=uuid.uuid4().hex, route="rule:test", ok=True, text="answer")


@pytest.mark.parametrize("path", PATHS)
def test_result_writes_wait_for_the_replica(sentinels: SentinelSet, caplog: pytest.LogCaptureFixture,
                                           path: str) -> None:
    redis = open_redis(sentinels.url)
    store = ResultStore(redis, Keys("acks"), ttl_s=60, acks=ACKS)
    wire = Wire(redis, held=True)
    with caplog.at_level(logging.WARNING, logger="laya.results"):
        key = write(store, wire, path, new_result())
        assert not caplog.records
        replica = next(node for node in sentinels.nodes if node is not sentinels.primary())
        with replica.client() as direct:
            assert direct.exists(key), "the write returned before the replica had it"
        with replica_stopped(sentinels):
            started = time.monotonic()
            write(store, wire, path, new_result())
            assert time.monotonic() - started >= 0.2
    assert [r.getMessage() for r in caplog.records if "0 of the 1 replicas" in r.getMessage()], caplog.text


@pytest.mark.parametrize("path", PATHS)
def test_waiters_wake_only_after_the_replicas_confirmed(sentinels: SentinelSet, path: str) -> None:
    """A producer must not be woken by an answer that a failover could still take back: the wake-up
    follows WAIT. With the replica stopped WAIT runs its whole 200 ms, and the waiter hears nothing
    before; then it is woken all the same (the shortfall is logged), with the answer."""
    redis = open_redis(sentinels.url)
    store = ResultStore(redis, Keys("acks"), ttl_s=60, acks=ACKS)
    result = new_result()
    heard: list[tuple[float, bytes]] = []

    def wait() -> None:
        reply = open_redis(sentinels.url).blpop([store.keys.done(result.id)], timeout=10)
        assert reply is not None
        heard.append((time.monotonic(), reply[1]))

    waiter = threading.Thread(target=wait)
    start_blocked(redis, [waiter])
    with replica_stopped(sentinels):
        started = time.monotonic()
        write(store, Wire(redis, held=True), path, result)
        waiter.join(10)
    assert heard, "the waiter was never woken"
    woken_at, payload = heard[0]
    assert woken_at - started >= 0.2, f"woken {woken_at - started:.3f} s after the write began, before WAIT ended"
    assert decode_result(payload).text == "answer"


def test_producer_gets_not_replicated_instead_of_an_acceptance(sentinels: SentinelSet) -> None:
    client = Client.from_url(sentinels.url, prefix="acks", acks=ACKS)
    assert client.submit("hello")
    with replica_stopped(sentinels):
        for submit in (lambda: client.submit("hello"), lambda: client.ask("hello", timeout=5),
                       lambda: client.submit_many([{"prompt": "a"}, {"prompt": "b"}])):
            with pytest.raises(NotReplicated) as info:
                submit()
            message = info.value.message
            assert "\n" not in message
            assert "only 0 of the 1 replicas redis.min_replica_acks asks for confirmed it within 200 ms" in message
            assert "not accepted" in message and "same id" in message


def test_the_router_wakes_its_waiters_after_the_replicas_confirmed(sentinels: SentinelSet, tiny_model: Path,
                                                                   routes_file: Path) -> None:
    """The router's commit of a batch that both answers (a rule) and enqueues (a model job) is one
    transaction; its wake-ups and its streams' end entries go out after WAIT, never before it."""
    settings = Settings.model_validate({
        "redis": {"url": sentinels.url, "prefix": "acks-router", "min_replica_acks": 1,
                  "replica_ack_timeout_ms": ACKS.timeout_ms},
        "model": {"path": str(tiny_model)},
        "router": {"routes_file": str(routes_file), "block_ms": 100},
    })
    redis = open_redis(sentinels.url)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    client = Client.from_url(sentinels.url, prefix="acks-router", acks=ACKS)
    answered, streamed = client.submit("Hello"), client.submit("Hello", stream=True)
    assert client.submit("Tell me a story")  # a model job: the batch commits as one transaction
    keys = Keys("acks-router")
    heard: dict[str, float] = {}

    def wake_up() -> None:
        if open_redis(sentinels.url).blpop([keys.done(answered)], timeout=10):
            heard["wake-up"] = time.monotonic()

    def stream_end() -> None:
        if open_redis(sentinels.url).xread({keys.stream(streamed): "0-0"}, block=10_000):
            heard["end entry"] = time.monotonic()

    waiters = [threading.Thread(target=wake_up), threading.Thread(target=stream_end)]
    start_blocked(redis, waiters)
    with replica_stopped(sentinels):
        started = time.monotonic()
        while entries := router.read_batch():
            router.handle(entries)
        for waiter in waiters:
            waiter.join(10)
    assert set(heard) == {"wake-up", "end entry"}, f"only {sorted(heard)} reached the waiters"
    for what, at in heard.items():
        assert at - started >= ACKS.timeout_ms / 1000, f"the {what} came {at - started:.3f} s in, before WAIT ended"
    assert client.result(answered).route == "rule:greeting"  # type: ignore[union-attr]
