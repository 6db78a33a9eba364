"""Result records: written once per request id, pushed to whoever waits.

Every writer (router or worker) goes through one Lua script, so the first
result for an id wins atomically: a duplicate delivery after a crash can never
give a producer a second, different answer. The script also pushes the result
onto the waiter's list (``done:<id>``, or the producer's shared ``reply:<channel>``),
which is what a blocked producer wakes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laya.codec import decode_result, encode_result
from laya.keys import Keys
from laya.schema import Result

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

__all__ = ["ResultStore"]

# KEYS: (result key, wake-up list) pairs; ARGV[1]: ttl seconds, ARGV[2..]: one result JSON per pair.
# Returns how many results were new. One call writes a router's whole batch.
_WRITE_ONCE = """
local ttl = ARGV[1]
local written = 0
local woken = {}
for i = 1, #KEYS, 2 do
  local payload = ARGV[(i + 1) / 2 + 1]
  if redis.call('SET', KEYS[i], payload, 'NX', 'EX', ttl) then
    redis.call('LPUSH', KEYS[i + 1], payload)
    woken[KEYS[i + 1]] = true
    written = written + 1
  end
end
for key in pairs(woken) do
  redis.call('EXPIRE', key, ttl)
end
return written
"""


class ResultStore:
    def __init__(self, redis: Redis, keys: Keys, *, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self._script = redis.register_script(_WRITE_ONCE)

    def wake_key(self, request_id: str, reply_to: str | None) -> str:
        return self.keys.reply(reply_to) if reply_to else self.keys.done(request_id)

    def _keys_and_args(self, results: list[tuple[str, bytes, str | None]]) -> tuple[list[str], list[bytes | int]]:
        keys: list[str] = []
        args: list[bytes | int] = [self.ttl_s]
        for request_id, payload, reply_to in results:
            keys += [self.keys.result(request_id), self.wake_key(request_id, reply_to)]
            args.append(payload)
        return keys, args

    def queue_write_many(self, pipe: Pipeline, results: list[tuple[str, bytes, str | None]]) -> None:
        """Add one write-once call for ``results`` (id, result JSON, reply channel) to ``pipe``.

        The router commits a whole batch this way.

        Plain EVAL, not EVALSHA: inside a MULTI a missing script would fail that
        one command while the rest (the XACK) still ran, losing the results.
        """
        if results:
            keys, args = self._keys_and_args(results)
            pipe.eval(_WRITE_ONCE, len(keys), *keys, *args)

    def write(self, result: Result, reply_to: str | None) -> bool:
        """Write now; ``False`` if this id already had a result (which stays)."""
        keys, args = self._keys_and_args([(result.id, encode_result(result), reply_to)])
        return bool(self._script(keys=keys, args=args))

    def get(self, request_id: str) -> Result | None:
        data = self.redis.get(self.keys.result(request_id))
        return decode_result(data) if data is not None else None

    def get_many(self, request_ids: list[str]) -> list[Result | None]:
        if not request_ids:
            return []
        values = self.redis.mget([self.keys.result(i) for i in request_ids])
        return [decode_result(v) if v is not None else None for v in values]

