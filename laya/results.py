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

# KEYS[1] result key, KEYS[2] wake-up list; ARGV[1] result JSON, ARGV[2] ttl seconds.
_WRITE_ONCE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


class ResultStore:
    def __init__(self, redis: Redis, keys: Keys, *, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self._script = redis.register_script(_WRITE_ONCE)

    def wake_key(self, request_id: str, reply_to: str | None) -> str:
        return self.keys.reply(reply_to) if reply_to else self.keys.done(request_id)

    def queue_write(self, pipe: Pipeline, result: Result, reply_to: str | None) -> None:
        """Add the write-once to ``pipe`` (the router commits a whole batch at once).

        Plain EVAL, not EVALSHA: inside a MULTI a missing script would fail that
        one command while the rest (the XACK) still ran, losing the result.
        """
        pipe.eval(_WRITE_ONCE, 2, self.keys.result(result.id), self.wake_key(result.id, reply_to),
                  encode_result(result), self.ttl_s)

    def write(self, result: Result, reply_to: str | None) -> bool:
        """Write now; ``False`` if this id already had a result (which stays)."""
        keys = [self.keys.result(result.id), self.wake_key(result.id, reply_to)]
        return bool(self._script(keys=keys, args=[encode_result(result), self.ttl_s]))

    def get(self, request_id: str) -> Result | None:
        data = self.redis.get(self.keys.result(request_id))
        return decode_result(data) if data is not None else None

    def get_many(self, request_ids: list[str]) -> list[Result | None]:
        if not request_ids:
            return []
        values = self.redis.mget([self.keys.result(i) for i in request_ids])
        return [decode_result(v) if v is not None else None for v in values]

