"""The reaper: ends jobs whose worker died, so no request waits forever.

A worker heartbeats while it runs a job; a job whose heartbeat stopped longer
than ``runtime.heartbeat_ttl_s`` ago belongs to a dead worker. Routers run the
reaper every ``router.reap_interval_s``: RQ's registry cleanup requeues such a
job while it has retries left (``runtime.job_retries``) and fails it after
that, and the reaper then writes the failed request's ``error:worker_lost``
result. A job that is not Laya's is deleted first: RQ's cleanup would
otherwise import and call the failure callback it names.

A worker killed in the instant between taking a job off the queue (RQ moves
it to an "intermediate" list) and starting it leaves the job in neither the
queue nor the started registry; RQ finds such jobs only in its 10-minute
maintenance pass. The reaper puts a job that has sat there longer than
``grace_s`` back at the front of its queue: it never ran, so no retry is spent.
A job a worker refused (not Laya's) also leaves its id there; the reaper drops
such ids instead of queueing the job for another refusal.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from laya.connection import release_lock
from laya.contract import is_laya_job, job_error_result, job_reply_to
from laya.errors import InferenceError
from laya.results import ResultStore

if TYPE_CHECKING:
    from rq import Queue

__all__ = ["Reaper"]

log = logging.getLogger("laya.router.reaper")

LOCK_TTL_S = 30


_REQUEUE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then redis.call('LPUSH', KEYS[2], ARGV[1]) end
redis.call('DEL', KEYS[3])
"""
"""Move a job id from the intermediate list back to the queue front, unless a worker took it meanwhile."""


class Reaper:
    def __init__(self, queues: dict[str, Queue], results: ResultStore, *, lock_key: str, owner: str,
                 grace_s: float) -> None:
        self.queues = queues
        self.results = results
        self.lock_key = lock_key
        self.owner = owner
        self.grace_s = grace_s

    def run_once(self, now: float | None = None) -> int:
        """Handle every job abandoned before ``now``; returns how many were failed for good.

        One router reaps at a time (a lock with a timeout, in case it dies while
        reaping): two reapers seeing the same lost job would requeue it twice.
        """
        redis = self.results.redis
        if not redis.set(self.lock_key, self.owner, nx=True, ex=LOCK_TTL_S):
            return 0
        try:
            return self._reap(now if now is not None else time.time())
        finally:
            release_lock(redis, self.lock_key, self.owner)

    def _reap(self, cutoff: float) -> int:
        failed = 0
        for queue in self.queues.values():
            self._requeue_dequeued(queue, cutoff)
            registry = StartedJobRegistry(queue=queue)
            expired = registry.get_expired_job_ids(cutoff)
            if not expired:
                continue
            jobs = {job_id: self._fetch(queue, job_id) for job_id in expired}
            for job_id, job in jobs.items():
                if job is not None and not is_laya_job(job):
                    log.error("deleting abandoned job %s: not a Laya job", job_id)
                    job.delete()
            registry.cleanup(cutoff)
            for job_id, job in jobs.items():
                if job is None or not is_laya_job(job):
                    continue
                if job.get_status(refresh=True) == JobStatus.FAILED:
                    failed += self._report_lost(job)
                else:
                    log.warning("job %s lost its worker; requeued (%s retries left)", job_id, job.retries_left)
        return failed

    def _requeue_dequeued(self, queue: Queue, now: float) -> None:
        """Requeue jobs taken off ``queue`` by a worker that died before starting them."""
        intermediate = queue.intermediate_queue
        for job_id in intermediate.get_job_ids():
            if job_id in queue.started_job_registry:
                continue
            job = self._fetch(queue, job_id)
            if job is None or not is_laya_job(job):
                # Nothing a worker lost: a job the worker refused (it leaves the id here), or one gone.
                queue.connection.lrem(intermediate.key, 1, job_id)
                queue.connection.delete(intermediate.get_first_seen_key(job_id))
                continue
            first_seen = intermediate.get_first_seen(job_id)
            if first_seen is None or (job.enqueued_at and first_seen < job.enqueued_at):
                # Seen for the first time since it was (re)enqueued; a live worker starts it within ms.
                queue.connection.set(intermediate.get_first_seen_key(job_id), time.time(), ex=86_400)
                continue
            if now - first_seen.timestamp() < self.grace_s:
                continue
            queue.connection.eval(_REQUEUE, 3, intermediate.key, queue.key,
                                  intermediate.get_first_seen_key(job_id), job_id)
            log.warning("job %s was taken by a worker that died before starting it; requeued", job_id)

    @staticmethod
    def _fetch(queue: Queue, job_id: str) -> Job | None:
        try:
            return Job.fetch(job_id, connection=queue.connection, serializer=queue.serializer)
        except NoSuchJobError:
            return None

    def _report_lost(self, job: Job) -> int:
        error = InferenceError(
            "the worker running this request stopped sending heartbeats (killed, crashed or hung) on every "
            "attempt; check the worker logs: a prompt that crashes llama.cpp does so every time",
            code="worker_lost")
        log.error("request %s failed for good: its worker was lost", job.id)
        return int(self.results.write(job_error_result(job, error), job_reply_to(job)))
