"""Every Redis key Laya uses, in one place.

All names start with a deployment prefix (``laya`` by default, ``[redis] prefix``
in the config) so several deployments can share one server. RQ's own keys
(``rq:queue:<name>``, ``rq:job:<id>``, ...) are RQ's business; Laya only names
the queues.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "laya"

    @property
    def ingress(self) -> str:
        """The stream producers XADD requests to."""
        return f"{self.prefix}:ingress"

    @property
    def router_group(self) -> str:
        """Consumer group shared by every router process."""
        return "routers"

    @property
    def admission(self) -> str:
        """Hash the routers write when they start: the queue bound they admit to (``max_queue_depth``), which
        `laya batch` sizes its window by whatever its own config says."""
        return f"{self.prefix}:router:admission"

    @property
    def router_stats(self) -> str:
        """Hash of routing counters and decision-latency percentiles."""
        return f"{self.prefix}:stats:router"

    @property
    def worker_stats(self) -> str:
        """Hash of each live worker's status (state, plan, memory, tokens/s, last beat), one field per worker."""
        return f"{self.prefix}:stats:worker"

    @property
    def worker_starts(self) -> str:
        """Hash of how many worker processes started per model (the restarts metric)."""
        return f"{self.prefix}:stats:worker_starts"

    def queue_name(self, model: str, lane: str = "normal") -> str:
        """RQ queue of a model's priority lane (high, normal, bulk); RQ stores it as ``rq:queue:<name>``."""
        return f"{self.prefix}:llm:{model}:{lane}"

    def result(self, request_id: str) -> str:
        return f"{self.prefix}:result:{request_id}"

    def done(self, request_id: str) -> str:
        """List a single waiter blocks on (BLPOP) until the result is pushed."""
        return f"{self.prefix}:done:{request_id}"

    def file(self, file_id: str) -> str:
        """The record (OpenAI's file object, JSON) of an uploaded file; its bytes are on disk."""
        return f"{self.prefix}:file:{file_id}"

    @property
    def files(self) -> str:
        """Sorted set of the uploaded files' ids, by upload time."""
        return f"{self.prefix}:files"

    def batch(self, batch_id: str) -> str:
        """The record (OpenAI's batch object, JSON) of a batch of /v1/batches."""
        return f"{self.prefix}:batch:{batch_id}"

    def batch_lease(self, batch_id: str) -> str:
        """Held by the `laya serve` running a batch; it renews it while it runs."""
        return f"{self.prefix}:batch:{batch_id}:lease"

    @property
    def batches(self) -> str:
        """Sorted set of the batches' ids, by creation time."""
        return f"{self.prefix}:batches"

    def bell(self, model: str) -> str:
        """List the router pushes to when it enqueues jobs for a model; idle workers block on it."""
        return f"{self.prefix}:bell:{model}"

    def stream(self, request_id: str) -> str:
        """Stream of a streaming request's text chunks, then its end entry (:mod:`laya.streaming`)."""
        return f"{self.prefix}:stream:{request_id}"

    def reply(self, channel: str) -> str:
        """Shared reply list for a producer waiting on many requests."""
        return f"{self.prefix}:reply:{channel}"

    @property
    def reaper_lock(self) -> str:
        """Held by the one router whose reaper is running; the others skip their turn."""
        return f"{self.prefix}:reaper"

    def lock(self, request_id: str) -> str:
        """Held by the worker running a request, kept alive by its heartbeat."""
        return f"{self.prefix}:lock:{request_id}"

    def cache(self, digest: str) -> str:
        return f"{self.prefix}:cache:{digest}"

    @property
    def semantic_log(self) -> str:
        """Capped stream of model answers the semantic cache may reuse; every router reads it
        (:mod:`laya.semantic.semcache`)."""
        return f"{self.prefix}:semcache"
