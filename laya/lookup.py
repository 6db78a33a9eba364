"""Where a request is: its result, or why it has none (``laya result ID``).

"No result" means one of two things a user must tell apart: the request is
on its way (waiting in the ingress stream, queued for a model, running,
waiting for a retry), or Laya has no trace of it (a mistyped id, another
server, an expired result).

A request moves from the ingress stream to an RQ job or a result record, and
the router makes that move in one atomic write (the commit that XDELs the
entry also enqueues the job or writes the result); a job's result is written
before the job finishes. :func:`locate` therefore reads the stream, then the
job, then the result record: a request that moves while it looks is found at
its next stop, never missed between two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import ResponseError
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from laya.codec import FIELD
from laya.schema import REQUEST_ID_PATTERN, Result

if TYPE_CHECKING:
    from collections.abc import Collection

    from redis import Redis

    from laya.keys import Keys
    from laya.results import ResultStore

__all__ = ["Whereabouts", "locate", "unfinished"]

_ID = re.compile(REQUEST_ID_PATTERN)
_SCAN_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """A request without a result: ``pending`` if it will still be answered, and where it is, in words."""

    pending: bool
    detail: str


def locate(redis: Redis, results: ResultStore, request_id: str) -> Result | Whereabouts:
    """The result of ``request_id``, or where the request is (see the module docstring for the order)."""
    found = results.get(request_id)
    if found is not None:
        return found
    if not _ID.match(request_id):
        return Whereabouts(False, f"{request_id!r} is not a request id: ids are 1-128 letters, digits, "
                                  "'_' or '-', as `laya submit` prints them")
    keys = results.keys
    waiting = _in_stream(redis, keys.ingress, keys.router_group, request_id)
    if waiting is not None:
        return Whereabouts(True, waiting)
    job = _job(redis, request_id)
    found = results.get(request_id)
    if found is not None:
        return found
    if job is not None:
        return _job_whereabouts(redis, job)
    return Whereabouts(False, f"Laya has no request {request_id}: it is not waiting in the ingress stream, "
                              "not queued or running, and has no result record (results are kept "
                              "router.result_ttl_s, a day by default); check the id, and that this command "
                              "uses the same server (config, LAYA_REDIS_URL) as the producer that sent it")


_UNFINISHED = frozenset({JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED,
                         JobStatus.CREATED})
"""Job states from which the request will still be answered (queued, running, waiting for a retry)."""


def unfinished(redis: Redis, keys: Keys, request_ids: Collection[str]) -> set[str]:
    """Those of ``request_ids`` on their way: waiting in the ingress stream, or with a job that will still run.

    The bulk form of :func:`locate` for a producer about to send many requests
    again (``laya batch --resume``): a request it finds here must be waited
    for, never sent twice. It reads the stream before the jobs, as
    :func:`locate` does, so a request moving from one to the other is seen at
    its next stop; one that moves on from its job to its result after the read
    is the caller's to find by reading results afterwards.
    """
    wanted = set(request_ids)
    found = _ids_in_stream(redis, keys.ingress, wanted)
    rest = [i for i in wanted - found if _ID.match(i)]
    for start in range(0, len(rest), _SCAN_CHUNK):
        chunk = rest[start:start + _SCAN_CHUNK]
        for request_id, job in zip(chunk, Job.fetch_many(chunk, connection=redis, serializer="json")):
            if job is not None and job.get_status(refresh=False) in _UNFINISHED:
                found.add(request_id)
    return found


def _ids_in_stream(redis: Redis, stream: str, wanted: set[str]) -> set[str]:
    """Which of ``wanted`` have an entry in the ingress stream (routed entries are deleted: a short scan)."""
    found: set[str] = set()
    start = "-"
    while True:
        entries: Any = redis.xrange(stream, min=start, max="+", count=_SCAN_CHUNK)
        for _, fields in entries:
            request_id = _id_of(fields.get(FIELD, b""))
            if isinstance(request_id, str) and request_id in wanted:
                found.add(request_id)
        if len(entries) < _SCAN_CHUNK:
            return found
        start = "(" + entries[-1][0].decode()


def _in_stream(redis: Redis, stream: str, group: str, request_id: str) -> str | None:
    """Where in the ingress stream ``request_id`` waits, or None when it is not there.

    The router deletes an entry once routed, so the stream holds only what is
    not routed yet: a scan is short unless the routers are down or far behind.
    """
    needle = request_id.encode()
    start = "-"
    ahead = 0
    while True:
        entries: Any = redis.xrange(stream, min=start, max="+", count=_SCAN_CHUNK)
        for entry_id, fields in entries:
            raw = fields.get(FIELD, b"")
            if entry_id.decode() == request_id or (needle in raw and _id_of(raw) == request_id):
                return _stream_detail(redis, stream, group, entry_id, ahead)
            ahead += 1
        if len(entries) < _SCAN_CHUNK:
            return None
        start = "(" + entries[-1][0].decode()


def _id_of(raw: bytes) -> object:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data.get("id") if isinstance(data, dict) else None


def _stream_detail(redis: Redis, stream: str, group: str, entry_id: bytes, ahead: int) -> str:
    try:
        pending: Any = redis.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    except ResponseError:  # NOGROUP: no router has ever read this stream
        pending = None
    if pending:
        return f"a router ({pending[0]['consumer'].decode()}) is routing it now"
    routers = "no router has ever read it" if pending is None else "no router has taken it yet"
    return (f"it waits in the ingress stream {stream} behind {ahead} other request(s); {routers} "
            "(is `laya up`, or `laya router`, running on this server?)")


def _job(redis: Redis, request_id: str) -> Job | None:
    try:
        return Job.fetch(request_id, connection=redis, serializer="json")
    except NoSuchJobError:
        return None


def _job_whereabouts(redis: Redis, job: Job) -> Whereabouts:
    """What the RQ job (its status, its queue, the workers on that queue) says about the request."""
    status = job.get_status(refresh=False)
    queue = Queue(job.origin, connection=redis, serializer="json")
    if status == JobStatus.QUEUED:
        position = queue.get_job_position(job.id)
        place = f"{position + 1} of {queue.count}" if position is not None else f"one of {queue.count}"
        serving = Worker.all(queue=queue)
        hint = ("" if serving else "; no worker serves that queue (is `laya up`, or `laya worker`, running "
                "with this model?)")
        return Whereabouts(True, f"it is queued for the model on RQ queue {job.origin}, {place}{hint}")
    if status == JobStatus.STARTED:
        return Whereabouts(True, f"worker {job.worker_name or '?'} is running it now")
    if status in (JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.CREATED):
        return Whereabouts(True, f"its job on RQ queue {job.origin} waits to be retried (status {status.value})")
    if status == JobStatus.FAILED:
        latest = job.latest_result()
        reason = (latest.exc_string or "").strip().splitlines()[-1:] if latest is not None else []
        return Whereabouts(False, f"its job on RQ queue {job.origin} failed without writing a result"
                                  + (f": {reason[0]}" if reason else "") + "; `rq info` and the worker log say more")
    return Whereabouts(False, f"its job on RQ queue {job.origin} is {status.value if status else 'gone'} and "
                              "left no result record (results are kept router.result_ttl_s); send it again")
