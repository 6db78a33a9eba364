"""Priority lanes: how a worker takes its next job, highest non-empty lane first, losing none.

Each model has one RQ queue per lane (high, normal, bulk). RQ's worker takes a job
from one queue with ``BLMOVE``, which leaves the job id in the queue's
intermediate list until the job is registered as started: if the worker (or the
server) dies in between, Laya's reaper finds the id there and requeues it. From
several queues RQ uses ``BLPOP`` instead, and a job popped in that instant is in
no list at all: lost, its producer never answered.

So :class:`LaneQueue` takes jobs the one-queue way from several: one script
moves the first id of the highest non-empty lane into that lane's intermediate
list (``LMOVE``, atomically, in lane order). When every lane is empty the worker
blocks on the model's *bell* (:func:`laya.contract.ring`), a short list the router
pushes to in the same write that enqueues jobs (the reaper rings it too, for the jobs it
requeues), and looks again when it rings, or after :data:`IDLE_RESCAN_S` at the latest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from hashlib import sha1
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.utils import as_text

if TYPE_CHECKING:
    from redis import Redis
    from rq.job import Job

__all__ = ["IDLE_RESCAN_S", "LaneQueue"]

IDLE_RESCAN_S = 1.0

_TAKE = """
local n = #KEYS / 2
for i = 1, n do
  local id = redis.call('LMOVE', KEYS[i], KEYS[n + i], 'LEFT', 'RIGHT')
  if id then return {KEYS[i], id} end
end
return false
"""
_TAKE_SHA = sha1(_TAKE.encode()).hexdigest()


class LaneQueue(Queue):
    """An RQ queue whose workers take jobs from several lanes in order, through intermediate lists."""

    bell: str | None = None
    """Set by the worker: the list it blocks on while every lane is empty."""

    @classmethod
    def dequeue_any(cls, queues: Iterable[Queue], timeout: int | None, connection: Redis,
                    job_class: type[Job] | None = None, serializer: Any = None,
                    death_penalty_class: Any = None) -> tuple[Job, Queue] | None:
        """The next job of the highest non-empty lane; RQ's contract: ``None`` at once when
        ``timeout`` is ``None`` (burst), :class:`DequeueTimeout` after ``timeout`` seconds."""
        queues = list(queues)
        keys = [q.key for q in queues] + [q.intermediate_queue_key for q in queues]
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            taken = _take(connection, keys)
            if taken is not None:
                queue_key, job_id = (as_text(v) for v in taken)
                found = cls._fetch_dequeued_job(connection, queue_key, job_id, job_class=job_class,
                                                serializer=serializer, death_penalty_class=death_penalty_class)
                if found is None:  # its job hash is gone: skipped, as RQ does (the reaper clears the id)
                    continue
                return found
            if until is None:
                return None
            left = until - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, keys)
            wait = min(left, IDLE_RESCAN_S)
            if cls.bell is not None:
                connection.blpop([cls.bell], timeout=wait)
            else:
                time.sleep(wait)


def _take(connection: Redis, keys: list[str]) -> Any:
    try:
        return connection.evalsha(_TAKE_SHA, len(keys), *keys)
    except NoScriptError:
        return connection.eval(_TAKE, len(keys), *keys)
