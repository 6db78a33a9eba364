"""min_replica_acks on real servers: each kind of write waits for the replica, and says so when it
does not come (the replica SIGSTOPped for the duration of one write)."""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from laya.client import Client
from laya.codec import encode_result
from laya.connection import ReplicaAcks, open_redis
from laya.errors import NotReplicated
from laya.keys import Keys
from laya.results import ResultStore
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


@pytest.mark.parametrize("path", ["router commit script", "router commit transaction", "worker result"])
def test_result_writes_wait_for_the_replica(sentinels: SentinelSet, caplog: pytest.LogCaptureFixture,
                                           path: str) -> None:
    redis = open_redis(sentinels.url)
    store = ResultStore(redis, Keys("acks"), ttl_s=60, acks=ACKS)
    wire = Wire(redis, held=True)

    def write() -> str:
        result = Result(id=uuid.uuid4().hex, route="rule:test", ok=True, text="answer")
        answers = [(result.id, encode_result(result), None)]
        if path == "router commit script":
            store.commit(answers, group="routers", entry_ids=[], wire=wire)
        elif path == "router commit transaction":
            with redis.pipeline(transaction=True) as pipe:
                store.queue_commit(pipe, answers, group="routers", entry_ids=[])
                pipe.llen("acks:llm:default")
                assert store.execute(pipe, wire=wire)[-1] == 0
        else:
            store.write(result, None)
        return store.keys.result(result.id)

    with caplog.at_level(logging.WARNING, logger="laya.results"):
        key = write()
        assert not caplog.records
        replica = next(node for node in sentinels.nodes if node is not sentinels.primary())
        with replica.client() as direct:
            assert direct.exists(key), "the write returned before the replica had it"
        with replica_stopped(sentinels):
            started = time.monotonic()
            write()
            assert time.monotonic() - started >= 0.2
    assert [r.getMessage() for r in caplog.records if "0 of the 1 replicas" in r.getMessage()], caplog.text


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
