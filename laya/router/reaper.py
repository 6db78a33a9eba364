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

A supervisor that sees a worker die (``laya up``) need not wait for the
heartbeat: :meth:`Reaper.reap_dead_worker` releases the dead worker's request locks,
marks its executions expired and reaps at once, through the same cleanup, so a job is requeued or
failed exactly as the heartbeat path would.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from laya.connection import ReplicaAcks, release_lock
from laya.contract import is_laya_job, job_error_result, job_reply_to, ring
from laya.errors import InferenceError
from laya.keys import Keys
from laya.results import ResultStore
from laya.schema import LANES

if TYPE_CHECKING:
    from collections.abc import Collection

    from redis import Redis

    from laya.config import Settings

__all__ = ["Reaper"]

log = logging.getLogger("laya.router.reaper")

LOCK_TTL_S = 30
LOCK_WAIT_S = 5.0
"""How long :meth:`Reaper.reap_executions` waits for another router's reaping pass to end."""


_REQUEUE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then redis.call('LPUSH', KEYS[2], ARGV[1]) end
redis.call('DEL', KEYS[3])
"""
"""Move a job id from the intermediate list back to the queue front, unless a worker took it meanwhile."""


class Reaper:
    def __init__(self, queues: dict[str, Queue], results: ResultStore, *, lock_key: str, owner: str,
                 grace_s: float, bells: dict[str, str] | None = None) -> None:
        self.queues = queues
        self.results = results
        self.lock_key = lock_key
        self.owner = owner
        self.grace_s = grace_s
        self.bells = bells or {}
        """Queue name → the bell of its model: rung for each job requeued, so an idle worker starts it at once."""

    @classmethod
    def of(cls, redis: Redis, settings: Settings, *, owner: str) -> Reaper:
        """A reaper over every served model's queues, as the routers run it."""
        keys = Keys(settings.redis.prefix)
        queues = {keys.queue_name(name, lane): Queue(keys.queue_name(name, lane), connection=redis, serializer="json")
                  for name in settings.model_names for lane in LANES}
        bells = {keys.queue_name(name, lane): keys.bell(name) for name in settings.model_names for lane in LANES}
        results = ResultStore(redis, keys, ttl_s=settings.router.result_ttl_s, acks=ReplicaAcks.of(settings.redis))
        return cls(queues, results, lock_key=keys.reaper_lock, owner=owner, grace_s=settings.runtime.heartbeat_ttl_s,
                   bells=bells)

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

    def reap_dead_worker(self, worker_name: str, executions: Collection[str]) -> int:
        """Reap now the jobs of a worker known to be dead; returns how many were failed for good.

        ``executions`` are its RQ executions (``job_id:execution_id``, from the
        worker's execution index). The request locks the worker held are
        released (the next attempt need not wait them out), and each execution is
        marked expired in its started registry (only if still there: one that
        finished is left alone); then the usual pass requeues or fails it. The
        pass waits up to :data:`LOCK_WAIT_S` for another router's; if that one
        still holds the lock, the marks stay and the next pass reaps them.
        """
        if not executions:
            return 0
        redis = self.results.redis
        for execution in executions:
            release_lock(redis, self.results.keys.lock(execution.rpartition(":")[0]), worker_name)
        with redis.pipeline(transaction=False) as pipe:
            for queue in self.queues.values():
                for execution in executions:
                    pipe.zadd(StartedJobRegistry(queue=queue).key, {execution: 0}, xx=True)
            pipe.execute()
        deadline = time.monotonic() + LOCK_WAIT_S
        while not redis.set(self.lock_key, self.owner, nx=True, ex=LOCK_TTL_S):
            if time.monotonic() >= deadline:
                log.warning("a dead worker's jobs wait for the next reaping pass: %s holds the reaper lock",
                            redis.get(self.lock_key))
                return 0
            time.sleep(0.02)
        try:
            return self._reap(time.time())
        finally:
            release_lock(redis, self.lock_key, self.owner)

    def _reap(self, cutoff: float) -> int:
        failed = 0
        for queue in self.queues.values():
            requeued = self._requeue_dequeued(queue, cutoff)
            registry = StartedJobRegistry(queue=queue)
            expired = registry.get_expired_job_ids(cutoff)
            if not expired:
                self._ring(queue, requeued)
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
                    requeued += 1
            self._ring(queue, requeued)
        return failed

    def _ring(self, queue: Queue, jobs: int) -> None:
        if jobs and (bell := self.bells.get(queue.name)) is not None:
            with queue.connection.pipeline(transaction=False) as pipe:
                ring(pipe, bell, jobs)
                pipe.execute()

    def _requeue_dequeued(self, queue: Queue, now: float) -> int:
        """Requeue jobs taken off ``queue`` by a worker that died before starting them; how many."""
        requeued = 0
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
            requeued += 1
        return requeued

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
