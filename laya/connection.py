"""Redis connections from the configuration (passwords, ACL users, TLS all come in the URL)."""

from __future__ import annotations

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from laya.config import Settings, redact_url
from laya.errors import ServerError

__all__ = ["connect"]


def connect(settings: Settings, *, check: bool = True) -> Redis:
    """A client for the configured server; with ``check``, fail now if it cannot be reached."""
    url = settings.redis.effective_url
    redis = Redis.from_url(url, health_check_interval=30, socket_keepalive=True, socket_connect_timeout=5)
    if check:
        try:
            redis.ping()
        except (RedisConnectionError, OSError) as exc:
            hint = " (start one with `laya up`, or set LAYA_REDIS_URL)" if settings.redis.url is None else ""
            raise ServerError(f"cannot reach Redis at {redact_url(url)}{hint}: {exc}") from None
    return redis
