"""The front door's reply channel: every result waiting is taken, with or without BLMPOP."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
from redis.exceptions import ResponseError

from laya.http.frontdoor import FrontDoor
from laya.keys import Keys


class OldRedis(fakeredis.FakeAsyncRedis):
    """A server before Redis 7: no BLMPOP."""

    async def blmpop(self, *args: Any, **kwargs: Any) -> Any:
        raise ResponseError("ERR unknown command 'BLMPOP'")


def _taken(redis: Any) -> tuple[list[bytes], list[bytes], bool]:
    async def run() -> tuple[list[bytes], list[bytes], bool]:
        door = FrontDoor(redis, Keys("t"))
        key = door.keys.reply(door.channel)
        await redis.rpush(key, b"a", b"b", b"c")
        first = await door._pop(key)
        await redis.rpush(key, b"d")
        return first, await door._pop(key), door._blmpop

    return asyncio.run(run())


def test_blmpop_takes_every_waiting_result_in_one_call() -> None:
    assert _taken(fakeredis.FakeAsyncRedis()) == ([b"a", b"b", b"c"], [b"d"], True)


def test_without_blmpop_blpop_and_lpop_take_them_all() -> None:
    assert _taken(OldRedis()) == ([b"a", b"b", b"c"], [b"d"], False)
