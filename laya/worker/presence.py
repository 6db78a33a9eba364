"""A worker's presence in Redis: its status, rewritten every heartbeat interval.

Each worker keeps one field in the ``laya:stats:worker`` hash (its RQ name →
JSON), written by a daemon thread, so an idle worker blocked on its queue
still beats. ``laya stats`` and ``laya health`` read the hash: a worker whose
last beat is older than :func:`gone_after` shows as ``gone``; one older than
:func:`forget_after` is dropped (and its field deleted), so stopped and killed
workers do not pile up. A worker that stops cleanly deletes its field.
RQ's own worker registry cannot tell this: a SIGKILLed worker stays listed
for its ``worker_ttl`` (7 minutes).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError

from laya.memory.machine import resident_bytes

if TYPE_CHECKING:
    from redis import Redis

    from laya.config import Settings
    from laya.keys import Keys
    from laya.memory.planner import Plan
    from laya.metrics import WorkerMetrics

__all__ = ["Presence", "WorkerStatus", "forget_after", "gone_after", "read_workers"]

log = logging.getLogger("laya.worker.presence")


def gone_after(settings: Settings) -> float:
    """Seconds without a beat after which a worker counts as gone: three missed beats, and a second of slack."""
    return 3 * settings.runtime.heartbeat_interval_s + 1.0


def forget_after(settings: Settings) -> float:
    """Seconds without a beat after which a worker is dropped from the list: a minute of showing ``gone``
    (for whoever looks), or the job heartbeat TTL, whichever is longer."""
    return max(gone_after(settings) + 60.0, float(settings.runtime.heartbeat_ttl_s))


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    name: str
    fields: dict[str, Any]
    beat_age_s: float
    gone: bool

    @property
    def model(self) -> str:
        return str(self.fields.get("model", "?"))

    @property
    def state(self) -> str:
        return "gone" if self.gone else str(self.fields.get("state", "?"))


def read_workers(redis: Redis, keys: Keys, settings: Settings, *, now: float | None = None) -> list[WorkerStatus]:
    """Every worker that beat within :func:`forget_after`, by name; older fields are deleted."""
    now = time.time() if now is None else now
    found, stale = [], []
    for raw_name, raw in sorted(redis.hgetall(keys.worker_stats).items()):
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        try:
            fields = orjson.loads(raw)
            age = max(0.0, now - float(fields["beat_at"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):  # written by an older Laya
            stale.append(name)
            continue
        if age > forget_after(settings):
            stale.append(name)
            continue
        found.append(WorkerStatus(name, fields, age, age > gone_after(settings)))
    if stale:
        redis.hdel(keys.worker_stats, *stale)
    return found


def _gpu_bytes(pid: int) -> int | None:
    """Memory this process holds on NVIDIA GPUs (``nvidia-smi``), None where it cannot be asked."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            total += int(parts[1]) * 1024 * 1024
    return total


class Presence:
    """Writes one worker's status every ``runtime.heartbeat_interval_s`` from a daemon thread."""

    GPU_POLL_S = 10.0
    """nvidia-smi takes tens of milliseconds: asked this often, not every beat."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings, *, name: str, metrics: WorkerMetrics,
                 plan: Plan | None, n_ctx: int) -> None:
        self.redis = redis
        self.keys = keys
        self.name = name
        self.metrics = metrics
        self.interval = settings.runtime.heartbeat_interval_s
        self._rss = resident_bytes
        self._started = time.time()
        self._vram_planned = sum(d.total for d in plan.devices if d.device == "gpu") if plan is not None else 0
        self._gpu_due = 0.0
        self._vram_used: int | None = None
        self._pid = os.getpid()
        self._static = {
            "model": settings.model.name, "host": socket.gethostname(), "pid": self._pid, "n_ctx": n_ctx,
            "verdict": plan.verdict if plan is not None else "unplanned",
            "ram_planned": plan.ram_predicted if plan is not None else None,
            "vram_planned": self._vram_planned, "cpu_extra_buffers": plan.extra_buffers.enabled if plan else None,
        }
        if plan is not None:
            metrics.memory("ram", planned=plan.ram_predicted)
            metrics.memory("vram", planned=self._vram_planned)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="laya-presence", daemon=True)

    def status(self) -> dict[str, Any]:
        now = time.time()
        rss = self._rss()
        if self._vram_planned and now >= self._gpu_due:
            self._gpu_due = now + self.GPU_POLL_S
            self._vram_used = _gpu_bytes(self._pid)
        self.metrics.memory("ram", used=rss)
        if self._vram_used is not None:
            self.metrics.memory("vram", used=self._vram_used)
        metrics = self.metrics
        rates = metrics.recent_rates
        return {**self._static, "state": "busy" if metrics.job_id is not None else "idle",
                "job_id": metrics.job_id, "job_started_at": metrics.job_started, "jobs_done": metrics.jobs_done,
                "tokens_per_s": round(sum(rates) / len(rates), 2) if rates else None,
                "ram_resident": rss, "vram_used": self._vram_used, "started_at": self._started, "beat_at": now}

    def beat(self) -> None:
        self.redis.hset(self.keys.worker_stats, self.name, orjson.dumps(self.status()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and leave the list (a stopped worker is not a gone one)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.redis.hdel(self.keys.worker_stats, self.name)
        except RedisError as exc:
            log.warning("could not remove this worker from %s: %s", self.keys.worker_stats, exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except RedisError as exc:  # the worker's own loop reports and rides out an outage
                log.debug("presence beat failed: %s", exc)
            self._stop.wait(self.interval)
