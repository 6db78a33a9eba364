"""Redis connections from the configuration (passwords, ACL users, TLS all come in the URL)."""

from __future__ import annotations

import logging
import time

from redis import Redis
from redis.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from laya.config import Settings, redact_url
from laya.errors import ServerError

__all__ = ["connect", "open_redis", "release_lock", "renew_lock", "server_url", "unreachable"]

log = logging.getLogger("laya.connection")


def open_redis(url: str) -> Redis:
    """A client for blocking reads: no read timeout (redis-py 8 defaults to 5 s, which cuts a
    longer BLPOP short); dead peers are found by TCP keepalive and health checks instead."""
    return Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5, socket_keepalive=True,
                          health_check_interval=30)


def connect(settings: Settings, *, check: bool = True, wait: bool = False) -> Redis:
    """A client for the configured server.

    ``check``: fail now if the server cannot be reached. ``wait``: instead keep
    trying (with backoff, saying so in the log), as the long-running processes do
    so that they can start before Redis or ride out its restart.
    """
    url = settings.redis.effective_url
    redis = open_redis(url)
    backoff = 0.2
    while check or wait:
        try:
            redis.ping()
            return redis
        except (RedisConnectionError, OSError) as exc:
            message = unreachable(settings, exc)
            if not wait:
                raise ServerError(message) from None
            log.warning("%s; retrying in %.1f s", message, backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
    return redis


def unreachable(settings: Settings, exc: Exception) -> str:
    """Why the configured server did not answer, and what to check: which server, and where that came from.

    The usual cause is that `laya up` is not running, or runs with another
    config (another port): the message names the port or URL this command
    used and the setting that chose it.
    """
    cause = exc.__cause__ or exc.__context__
    reason = ((cause.strerror or str(cause)) if isinstance(cause, OSError) else str(exc)).rstrip(".")
    if reason[1:2].islower():  # "Connection refused" reads as part of the sentence
        reason = reason[0].lower() + reason[1:]
    url = redact_url(settings.redis.effective_url)
    if settings.redis.url is None:
        return (f"cannot reach Redis at {url}: {reason}. Is `laya up` running? This command "
                f"looked for its embedded server on port {settings.redis.embedded_port} (redis.embedded_port, "
                f"from {settings.origin('redis.embedded_port')}): start `laya up` with the same config, or set "
                "redis.url (LAYA_REDIS_URL) to your Redis server")
    return (f"cannot reach Redis at {url} (redis.url, from {settings.origin('redis.url')}): "
            f"{reason}. Is that server running, or the `laya up` that uses it? Check the URL")


def server_url(redis: Redis) -> str:
    """The URL ``redis`` connects to, written as :func:`~laya.config.redact_url` writes it (password as ``***``).

    Built from the client's connection settings, so that an error about any
    client names its server, whether or not the URL it was made from is at hand.
    """
    pool = redis.connection_pool
    kwargs = pool.connection_kwargs
    db = kwargs.get("db") or 0
    if issubclass(pool.connection_class, UnixDomainSocketConnection):
        return f"unix://{kwargs.get('path', '')}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, SSLConnection) else "redis"
    user = kwargs.get("username") or ""
    auth = f"{user}:***@" if kwargs.get("password") else f"{user}@" if user else ""
    return f"{scheme}://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


_RELEASE_LOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def release_lock(redis: Redis, key: str, owner: str) -> None:
    """Delete a lock only if ``owner`` still holds it: it may have expired and been taken by another."""
    redis.eval(_RELEASE_LOCK, 1, key, owner)


_RENEW_LOCK = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end "
               "return 0")


def renew_lock(redis: Redis, key: str, owner: str, ttl_s: int) -> bool:
    """Extend a lock only while ``owner`` holds it; False when it was lost (expired or taken)."""
    return bool(redis.eval(_RENEW_LOCK, 1, key, owner, ttl_s))
