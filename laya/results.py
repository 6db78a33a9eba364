"""Result records: written once per request id, pushed to whoever waits.

Every writer (router or worker) goes through one Lua script, so the first
result for an id wins atomically: a duplicate delivery after a crash can never
give a producer a second, different answer. The script also pushes the result
onto the waiter's list (``done:<id>``, or the producer's shared ``reply:<channel>``),
which is what a blocked producer wakes on.

With ``redis.min_replica_acks`` each write is followed, on the same connection
and in the same exchange, by ``WAIT n timeout``, and the wake-ups go out only
after it: a producer is not woken by an answer that a failover could still
take back. A write the replicas did not confirm in time is already on the
primary and cannot be taken back; its writer logs the shortfall, wakes its
waiters and goes on. Should the primary then die, the request comes back (its
stream entry or job was not acknowledged either), and a rerun gives the same
answer because results are written once per id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from hashlib import sha1
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, RedisError

from laya.codec import decode_result, encode_result
from laya.connection import ReplicaAcks
from laya.keys import Keys
from laya.schema import Result
from laya.wire import Wire

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

__all__ = ["ResultStore"]

log = logging.getLogger("laya.results")

# KEYS[1]: the ingress stream ("" when nothing is acknowledged); KEYS[2..]: (result key, wake-up list) pairs.
# ARGV[1]: ttl seconds; ARGV[2]: consumer group; ARGV[3]: "wake" to push the wake-ups now, "" to leave them
# to the caller (after WAIT); ARGV[4]: n, the number of stream entries to acknowledge; ARGV[5 .. 4+n]: their
# ids; then one result JSON per pair. Returns the numbers (from 1) of the pairs whose results were new.
# A router batch that enqueues nothing commits with this one atomic call: results, XACK and XDEL.
_COMMIT = """
local ttl, group, wake, n = ARGV[1], ARGV[2], ARGV[3] == 'wake', tonumber(ARGV[4])
local written = {}
local woken = {}
for i = 2, #KEYS, 2 do
  local payload = ARGV[4 + n + i / 2]
  if redis.call('SET', KEYS[i], payload, 'NX', 'EX', ttl) then
    written[#written + 1] = i / 2
    if wake then
      redis.call('LPUSH', KEYS[i + 1], payload)
      woken[KEYS[i + 1]] = true
    end
  end
end
for key in pairs(woken) do
  redis.call('EXPIRE', key, ttl)
end
for first = 5, 4 + n, 500 do
  local last = math.min(first + 499, 4 + n)
  redis.call('XACK', KEYS[1], group, unpack(ARGV, first, last))
  redis.call('XDEL', KEYS[1], unpack(ARGV, first, last))
end
return written
"""
_COMMIT_SHA = sha1(_COMMIT.encode()).hexdigest()

Answer = tuple[str, bytes, str | None]
"""(request id, result JSON, reply channel)."""


class ResultStore:
    def __init__(self, redis: Redis, keys: Keys, *, ttl_s: int, acks: ReplicaAcks | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self.acks = acks or ReplicaAcks()

    def wake_key(self, request_id: str, reply_to: str | None) -> str:
        return self.keys.reply(reply_to) if reply_to else self.keys.done(request_id)

    @property
    def wakes_after_ack(self) -> bool:
        """Whether wake-ups wait for the replicas' WAIT (``min_replica_acks``), sent by :meth:`wake`."""
        return bool(self.acks.count)

    def _keys_and_args(self, answers: list[Answer], ack: tuple[str, list[str]] | None
                       ) -> tuple[list[str], list[bytes | str | int]]:
        stream, ids = (self.keys.ingress, ack[1]) if ack else ("", [])
        keys = [stream]
        args: list[bytes | str | int] = [self.ttl_s, ack[0] if ack else "", "" if self.wakes_after_ack else "wake",
                                         len(ids), *ids]
        for request_id, payload, reply_to in answers:
            keys += [self.keys.result(request_id), self.wake_key(request_id, reply_to)]
            args.append(payload)
        return keys, args

    def commit(self, answers: list[Answer], *, group: str, entry_ids: list[str], wire: Wire | None = None) -> int:
        """Write ``answers`` and acknowledge and delete ``entry_ids`` in one atomic call; how many were new.

        ``wire``: a connection the caller holds (the router's commit loop).
        """
        keys, args = self._keys_and_args(answers, (group, entry_ids))
        return len(self._run(keys, args, wire, answers))

    def _run(self, keys: list[str], args: list[bytes | str | int], wire: Wire | None,
             answers: list[Answer]) -> list[int]:
        """The commit script of ``answers`` by its digest, in full when the server does not have it (after a
        restart); with replica acks, then WAIT, then the wake-ups. The numbers of the new answers.

        On ``wire`` when given; otherwise through redis-py, whose retries ride
        out a dropped connection (the script is safe to run twice).
        """
        if self.acks.count:
            written = self._run_acked(keys, args, wire)
            self.wake(answers, written)
            return written
        call = wire.call if wire is not None else self.redis.execute_command
        try:
            return list(call("EVALSHA", _COMMIT_SHA, len(keys), *keys, *args))
        except NoScriptError:
            return list(call("EVAL", _COMMIT, len(keys), *keys, *args))

    def _run_acked(self, keys: list[str], args: list[bytes | str | int], wire: Wire | None) -> list[int]:
        """:meth:`_run` followed by WAIT on the same connection; a shortfall is logged (module docstring)."""
        for script in (("EVALSHA", _COMMIT_SHA), ("EVAL", _COMMIT)):
            commands = [(*script, len(keys), *keys, *args), *self.acks.commands()]
            try:
                if wire is not None:
                    with wire.exchange(commands) as replies:
                        written, acked = replies.next(), replies.next()
                else:
                    with self.redis.pipeline(transaction=False) as pipe:
                        for command in commands:
                            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
                        written, acked = pipe.execute()
            except NoScriptError:
                continue
            if written and (shortfall := self.acks.shortfall(acked, f"a write of {len(written)} result(s)")):
                log.warning("%s; a failover now could lose them (their requests would be answered again)",
                            shortfall)
            return list(written)
        raise AssertionError("unreachable: EVAL does not raise NoScriptError")

    def wake(self, answers: list[Answer], written: list[int], *,
             then: Callable[[Pipeline], None] | None = None) -> None:
        """Push the wake-ups of the ``written`` answers (numbers from 1, the script's reply), then what
        ``then`` queues (a router's stream end entries): the step after WAIT when :attr:`wakes_after_ack`.

        A failure here loses no answer: the results are stored, and a waiter
        that was not woken reads its record when its wait times out.
        """
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                woken = set()
                for number in written:
                    request_id, payload, reply_to = answers[int(number) - 1]
                    woken.add(key := self.wake_key(request_id, reply_to))
                    pipe.lpush(key, payload)
                for key in woken:
                    pipe.expire(key, self.ttl_s)
                if then is not None:
                    then(pipe)
                pipe.execute()
        except RedisError as exc:
            log.warning("%d result(s) are stored but their waiters were not woken (%s); each reads its record "
                        "when its wait times out", len(written), exc)

    def execute(self, pipe: Pipeline, *, wire: Wire, answers: list[Answer],
                then: Callable[[Pipeline], None] | None = None) -> list[Any]:
        """Run ``pipe``, a MULTI that starts with :meth:`queue_commit` of ``answers``; its replies.

        With replica acks the transaction goes out on ``wire`` followed by WAIT
        (redis-py's pipeline would give its connection back before a WAIT could
        follow it on that connection); the replies are then raw, as on any wire.
        The wake-ups (and what ``then`` queues) follow with :meth:`wake`, also
        when a later command of the transaction failed: EXEC ran the script
        anyway, and its answers are stored. Without acks the script woke them,
        and the caller puts what ``then`` would queue into the MULTI itself.
        """
        if not self.acks.count:
            return list(pipe.execute())
        stack = [args for args, _options in pipe.command_stack]
        with wire.exchange([("MULTI",), *stack, ("EXEC",), *self.acks.commands()]) as replies:
            for _ in range(len(stack) + 1):
                replies.next()  # OK, then QUEUED each; a command refused here makes EXEC fail (EXECABORT)
            executed, acked = replies.next(), replies.next()
        pipe.reset()
        if shortfall := self.acks.shortfall(acked, f"a commit of {len(stack)} commands"):
            log.warning("%s; a failover now could lose it (its entries would be routed again)", shortfall)
        written = executed[0] if isinstance(executed[0], list) else []  # the script's reply, unless it failed
        self.wake(answers, written, then=then)
        failed = next((reply for reply in executed if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed
        return list(executed)

    def queue_commit(self, pipe: Pipeline, answers: list[Answer], *, group: str, entry_ids: list[str]) -> None:
        """The same as :meth:`commit`, added to ``pipe`` (a MULTI that also enqueues RQ jobs).

        Plain EVAL, not EVALSHA: inside a MULTI a missing script would fail that
        one command while the RQ jobs were still enqueued.
        """
        keys, args = self._keys_and_args(answers, (group, entry_ids))
        pipe.eval(_COMMIT, len(keys), *keys, *args)

    def write(self, result: Result, reply_to: str | None) -> bool:
        """Write now; ``False`` if this id already had a result (which stays)."""
        answers = [(result.id, encode_result(result), reply_to)]
        keys, args = self._keys_and_args(answers, None)
        return bool(self._run(keys, args, None, answers))

    def get(self, request_id: str) -> Result | None:
        data = self.redis.get(self.keys.result(request_id))
        return decode_result(data) if data is not None else None

    def get_many(self, request_ids: list[str]) -> list[Result | None]:
        if not request_ids:
            return []
        values = self.redis.mget([self.keys.result(i) for i in request_ids])
        return [decode_result(v) if v is not None else None for v in values]

