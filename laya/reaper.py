"""The reaper: ends jobs whose worker died, so no request waits forever.

A worker heartbeats while it runs a job; a job whose heartbeat stopped longer
than ``runtime.heartbeat_ttl_s`` ago belongs to a dead worker. Routers run the
reaper every ``router.reap_interval_s``: RQ's registry cleanup requeues such a
job while it has retries left (``runtime.job_retries``) and fails it after
that, and the reaper then writes the failed request's ``error:worker_lost``
result. A job that is not Laya's is deleted first: RQ's cleanup would
otherwise import and call the failure callback it names.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from laya.codec import error_result
from laya.errors import InferenceError
from laya.jobs import is_laya_job
from laya.results import ResultStore

if TYPE_CHECKING:
    from rq import Queue

__all__ = ["Reaper"]

log = logging.getLogger("laya.reaper")

LOCK_TTL_S = 30


class Reaper:
    def __init__(self, queues: dict[str, Queue], results: ResultStore, *, lock_key: str) -> None:
        self.queues = queues
        self.results = results
        self.lock_key = lock_key

    def run_once(self, now: float | None = None) -> int:
        """Handle every job abandoned before ``now``; returns how many were failed for good.

        One router reaps at a time (a lock with a timeout, in case it dies while
        reaping): two reapers seeing the same lost job would requeue it twice.
        """
        redis = self.results.redis
        if not redis.set(self.lock_key, "1", nx=True, ex=LOCK_TTL_S):
            return 0
        try:
            return self._reap(now if now is not None else time.time())
        finally:
            redis.delete(self.lock_key)

    def _reap(self, cutoff: float) -> int:
        failed = 0
        for queue in self.queues.values():
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

    @staticmethod
    def _fetch(queue: Queue, job_id: str) -> Job | None:
        try:
            return Job.fetch(job_id, connection=queue.connection, serializer=queue.serializer)
        except NoSuchJobError:
            return None

    def _report_lost(self, job: Job) -> int:
        payload = job.args[0] if job.args and isinstance(job.args[0], dict) else {}
        request = payload.get("request", {})
        error = InferenceError(
            "the worker running this request stopped sending heartbeats (killed, crashed or hung) on every "
            "attempt; check the worker logs: a prompt that crashes llama.cpp does so every time",
            code="worker_lost")
        result = error_result(job.id, error, model=payload.get("model"), metadata=request.get("metadata", {}),
                              finished_at=time.time())
        log.error("request %s failed for good: its worker was lost", job.id)
        return int(self.results.write(result, request.get("reply_to")))
