"""``laya stats``: what operators read.

The router publishes its counters and percentiles to ``laya:stats:router`` once a
second (several routers add to the same counters; the percentiles are those of
the router that published last; see laya.router.latency); workers beat their status into
``laya:stats:worker`` (see laya.worker.presence). :func:`snapshot` reads both, and the
queues, into the ``--json`` object; :func:`render` makes the tables.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from laya.keys import Keys
from laya.schema import LANES
from laya.worker.presence import read_workers

if TYPE_CHECKING:
    from redis import Redis

    from laya.config import Settings

__all__ = ["STATS_SCHEMA", "render", "snapshot"]


# -- `laya stats` ---------------------------------------------------------------------------------------------

STATS_SCHEMA = 1
"""Version of ``laya stats --json``; a change that removes or renames a field bumps it."""


def snapshot(redis: Redis, settings: Settings, *, now: float | None = None) -> dict[str, Any]:
    """Everything ``laya stats`` shows, as the documented ``--json`` object (README, "Watching it")."""
    from rq import Queue
    from rq.utils import utcparse

    keys = Keys(settings.redis.prefix)
    now = time.time() if now is None else now
    raw = {_str(k): _str(v) for k, v in redis.hgetall(keys.router_stats).items()}
    counts = {k.removeprefix("count:"): int(v) for k, v in raw.items() if k.startswith("count:")}
    total = sum(counts.values())
    routes = [{"route": route, "count": n, "share": round(n / total, 4) if total else 0.0}
              for route, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]

    def figure(name: str) -> float | None:
        return float(raw[name]) if name in raw else None

    queues = []
    for model, lane in ((model, lane) for model in settings.model_names for lane in LANES):
        queue = Queue(keys.queue_name(model, lane), connection=redis, serializer="json")
        depth = int(redis.llen(queue.key))
        oldest_age = None
        if depth and (first := redis.lindex(queue.key, 0)) is not None:
            enqueued = redis.hget(f"rq:job:{_str(first)}", "enqueued_at")
            if enqueued:
                oldest_age = round(max(0.0, now - utcparse(_str(enqueued)).timestamp()), 1)
        queues.append({"model": model, "lane": lane, "queue": queue.name, "depth": depth, "oldest_age_s": oldest_age})
    workers = []
    for worker in read_workers(redis, keys, settings, now=now):
        fields = worker.fields
        started = fields.get("job_started_at")
        workers.append({
            "name": worker.name, "model": worker.model, "host": fields.get("host"), "pid": fields.get("pid"),
            "state": worker.state, "job_id": fields.get("job_id"),
            "job_age_s": round(now - started, 1) if started and not worker.gone else None,
            "plan": fields.get("verdict"), "ram_planned_bytes": fields.get("ram_planned"),
            "ram_used_bytes": fields.get("ram_resident"), "vram_planned_bytes": fields.get("vram_planned"),
            "vram_used_bytes": fields.get("vram_used"), "jobs_done": fields.get("jobs_done"),
            "tokens_per_s": fields.get("tokens_per_s"), "last_beat_s": round(worker.beat_age_s, 1),
        })
    batches = []
    for raw_id in redis.zrange(keys.batches, 0, 9, desc=True):
        record = redis.get(keys.batch(raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)))
        if record is None:
            continue
        batch = orjson.loads(record)
        counts = batch.get("request_counts") or {}
        batches.append({"id": batch["id"], "status": batch["status"], "endpoint": batch["endpoint"],
                        "total": counts.get("total", 0), "completed": counts.get("completed", 0),
                        "failed": counts.get("failed", 0), "created_s_ago": round(now - batch["created_at"], 1)})
    updated = figure("updated_at")
    return {
        "schema": STATS_SCHEMA, "at": now,
        "router": {"updated_s_ago": round(now - updated, 1) if updated else None,
                   "rules": int(raw["rules"]) if "rules" in raw else None, "requests": total},
        "routes": routes,
        "decision_us": {"p50": figure("decision_us_p50"), "p99": figure("decision_us_p99"),
                        "window": int(figure("decision_window") or 0)},
        "batch_us": {"p50": figure("batch_us_p50"), "p99": figure("batch_us_p99")},
        "queues": queues,
        "workers": workers,
        "batches": batches,
    }


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def ago(seconds: float | None) -> str:
    """``3 s ago``, ``4 min ago``, ``2 h ago``; ``-`` for nothing."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def size(value: float | None) -> str:
    """Bytes as MiB or GiB."""
    if not value:
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), *(line(row) for row in rows)]


def render(snap: dict[str, Any]) -> str:
    """``laya stats`` for people."""
    router = snap["router"]
    out = [f"Routes: {router['requests']:,} requests since the counters began"
           + (f"; last router update {ago(router['updated_s_ago'])}, {router['rules']} rules"
              if router["updated_s_ago"] is not None else "; no router has published yet")]
    if snap["routes"]:
        out += _table(("route", "count", "share"),
                      [(r["route"], f"{r['count']:,}", f"{r['share'] * 100:.1f} %") for r in snap["routes"]],
                      right=frozenset({1, 2}))
    decision, batch = snap["decision_us"], snap["batch_us"]
    if decision["window"]:
        out += ["", (f"Decision (rules, cache, admission; one request): p50 {decision['p50']:.1f} µs, "
                     f"p99 {decision['p99']:.1f} µs over the last {decision['window']:,} requests"),
                (f"Batch wait included (from the batch read to the decision): p50 {batch['p50']:.1f} µs, "
                 f"p99 {batch['p99']:.1f} µs")]
    out += ["", "Queues"]
    out += _table(("model", "lane", "depth", "oldest job"),
                  [(q["model"], q["lane"] or "-", str(q["depth"]), duration(q["oldest_age_s"])) for q in snap["queues"]],
                  right=frozenset({2}))
    out += ["", "Workers" if snap["workers"] else "Workers: none has beaten in the last minute"]
    if snap["workers"]:
        out += _table(("worker", "model", "host", "state", "job for", "plan", "RAM plan/used", "VRAM plan/used",
                       "jobs", "tok/s", "last beat"),
                      [(w["name"], w["model"], str(w["host"]), w["state"], duration(w["job_age_s"]), str(w["plan"]),
                        f"{size(w['ram_planned_bytes'])} / {size(w['ram_used_bytes'])}",
                        f"{size(w['vram_planned_bytes'])} / {size(w['vram_used_bytes'])}",
                        str(w["jobs_done"] or 0), f"{w['tokens_per_s']:.1f}" if w["tokens_per_s"] else "-",
                        ago(w["last_beat_s"])) for w in snap["workers"]],
                      right=frozenset({8, 9}))
    if snap.get("batches"):
        out += ["", "Batches (/v1/batches, newest first)"]
        out += _table(("batch", "status", "endpoint", "done", "failed", "lines", "created"),
                      [(b["id"], b["status"], b["endpoint"], f"{b['completed']:,}", f"{b['failed']:,}",
                        f"{b['total']:,}", ago(b["created_s_ago"])) for b in snap["batches"]],
                      right=frozenset({3, 4, 5}))
    return "\n".join(out)
