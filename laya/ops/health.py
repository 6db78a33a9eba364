"""``laya health``: is this deployment able to answer?

Healthy means all three of:

* Redis answers (PING);
* at least one router reads the ingress stream: a consumer of the routers'
  group tried a read within :func:`router_silence_s` (a router blocks on its
  read for ``router.block_ms`` at a time, so a live one is never silent much
  longer);
* for each model it is asked about, a worker beat recently (see :mod:`laya.worker.presence`).

Container healthchecks and ``laya up``'s readiness use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis.exceptions import RedisError, ResponseError

from laya.keys import Keys
from laya.worker.presence import read_workers

if TYPE_CHECKING:
    from redis import Redis

    from laya.config import Settings

__all__ = ["Health", "check_health", "router_silence_s"]


def router_silence_s(settings: Settings) -> float:
    """How long a router may go without trying a read before it counts as gone: three blocked reads and 5 s
    for a slow batch or reaper pass."""
    return 3 * settings.router.block_ms / 1000 + 5.0


@dataclass
class Health:
    problems: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        return [f"FAIL {p}" for p in self.problems] + [f"ok   {p}" for p in self.passed]


def check_health(redis: Redis, settings: Settings, *, models: Sequence[str] | None = None,
                 routers: bool = True, host: str | None = None) -> Health:
    """Check Redis, the routers (unless ``routers`` is False) and a worker for each of ``models``
    (default: every model the config names), on ``host`` only when given (a container checking itself)."""
    keys = Keys(settings.redis.prefix)
    health = Health()
    try:
        redis.ping()
    except RedisError as exc:
        health.problems.append(f"Redis does not answer ({type(exc).__name__}: {exc})")
        return health
    health.passed.append("Redis answers")
    if routers:
        _check_routers(redis, keys, settings, health)
    wanted = list(models) if models is not None else settings.model_names
    workers = read_workers(redis, keys, settings)
    if host is not None:
        workers = [w for w in workers if w.fields.get("host") == host]
    where = f" on {host}" if host is not None else ""
    for model in wanted:
        live = [w for w in workers if w.model == model and not w.gone]
        if live:
            health.passed.append(f"model {model}: {len(live)} worker(s) beating ({live[0].name}, "
                                 f"{live[0].beat_age_s:.1f} s ago)")
        else:
            gone = [w for w in workers if w.model == model]
            why = (f"its last worker ({gone[0].name}) stopped beating {gone[0].beat_age_s:.0f} s ago" if gone
                   else f"no worker{where} has beaten")
            health.problems.append(f"model {model}: {why}; start `laya worker` for it")
    return health


def _check_routers(redis: Redis, keys: Keys, settings: Settings, health: Health) -> None:
    try:
        consumers = redis.xinfo_consumers(keys.ingress, keys.router_group)
    except ResponseError:  # no stream or no group: no router ever started on this Redis
        health.problems.append(f"no router has read {keys.ingress}: its consumer group does not exist; "
                               "start `laya router`")
        return
    limit_ms = router_silence_s(settings) * 1000
    # `inactive` (Redis/Valkey ≥ 7.2): since the last successful read; a router blocked on an empty stream
    # has none, so `idle` (since the last attempt) is the one that says it is alive.
    live = sorted(int(c["idle"]) for c in consumers if int(c["idle"]) <= limit_ms)
    if live:
        health.passed.append(f"{len(live)} router(s) reading {keys.ingress} (latest read {live[0] / 1000:.1f} s "
                             "ago)")
    else:
        health.problems.append(f"no router has tried to read {keys.ingress} within {limit_ms / 1000:g} s; "
                               "start `laya router`")
