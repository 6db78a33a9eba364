"""The held-connection command path (laya.wire) against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from laya.wire import Wire

from ..conftest import Server


def test_replies_come_in_order_and_an_error_reply_loses_no_other(redis: Redis) -> None:
    wire = Wire(redis, held=True)
    redis.set("text", "x")
    with wire.exchange([("SET", "a", "1"), ("INCR", "text"), ("GET", "a")]) as replies:
        assert replies.next() == b"OK"
        with pytest.raises(ResponseError, match="not an integer"):
            replies.next()
        assert replies.next() == b"1"  # the error reply was consumed: the next one is its own
    assert wire.call("GET", "a") == b"1"


def test_a_block_left_early_closes_the_connection_with_its_blocked_command(redis: Redis) -> None:
    for wire in (Wire(redis), Wire(redis, held=True)):
        with wire.exchange([("PING",), ("BLPOP", "nothing", 5)]) as replies:
            assert replies.next() == b"PONG"
        # The BLPOP is still blocked on the server; its connection must not answer this call.
        assert wire.call("ECHO", "next") == b"next"


def test_a_held_connection_is_taken_late_and_comes_back_after_the_server_restarts(tmp_path: Path) -> None:
    server = Server(tmp_path / "restart")
    wire = Wire(server.client(), held=True)  # no server yet: a router may be built before Redis is up
    server.start()
    try:
        assert wire.call("PING") == b"PONG"
        server.kill()
        with pytest.raises(RedisConnectionError):
            wire.call("PING")
        server.start()
        assert wire.call("PING") == b"PONG"
    finally:
        server.stop()
