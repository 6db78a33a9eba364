"""Redis connections from the configuration (passwords, ACL users, TLS all come in the URL).

Every connection Laya makes starts here. A ``redis+sentinel://`` URL gives a
client whose connections ask the Sentinels for the current primary each time
they (re)connect, so a process follows a failover by reconnecting, as it
already does after a server restart: nobody restarts for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis import Redis
from redis.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection

from laya.config import RedisConfig, Settings, redact_url
from laya.errors import NotReplicated, ServerError
from laya.sentinel import SentinelURL, is_sentinel_url, parse_sentinel_url

if TYPE_CHECKING:
    from laya.wire import Command

__all__ = ["ReplicaAcks", "connect", "open_redis", "release_lock", "renew_lock", "server_url", "unreachable"]

log = logging.getLogger("laya.connection")

SENTINEL_TIMEOUT_S = 2.0
"""A Sentinel that has not answered in this long is skipped for the next one: an unreachable address
must cost seconds, not hang the caller (redis-py would use the data connections' timeout: none)."""


def open_redis(url: str) -> Redis:
    """A client for blocking reads: no read timeout (redis-py 8 defaults to 5 s, which cuts a
    longer BLPOP short); dead peers are found by TCP keepalive and health checks instead."""
    options: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": 5, "socket_keepalive": True,
                               "health_check_interval": 30}
    if is_sentinel_url(url):
        address = parse_sentinel_url(url)
        sentinels = Sentinel(address.sentinels, sentinel_kwargs=_sentinel_options(address))
        connection_class = _PrimarySSLConnection if address.tls else _PrimaryConnection
        client: Redis = sentinels.master_for(address.service, connection_class=connection_class, **options,
                                             **address.server_options)
        return client
    return Redis.from_url(url, **options)


class _PrimaryConnection(SentinelManagedConnection):
    """A connection to the primary that asks the Sentinels where it is on *every* (re)connection.

    redis-py's asks only when the pool hands the connection out; a command it
    retries after the connection dropped reconnects to the address it had. After
    a failover that is the dead primary, and once that server is restarted (still
    a primary, empty, until the Sentinels turn it into a replica seconds later)
    the retried writes would land there and vanish.
    """

    def _connect(self) -> Any:
        self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()  # type: ignore[no-untyped-call]


class _PrimarySSLConnection(_PrimaryConnection, SSLConnection):
    pass


def _sentinel_options(address: SentinelURL) -> dict[str, Any]:
    return {"socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            **address.sentinel_options}


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
    if isinstance(exc, MasterNotFoundError) and is_sentinel_url(settings.redis.effective_url):
        address = parse_sentinel_url(settings.redis.effective_url)
        return (f"no primary for service {address.service!r} from the Sentinels at {address.describe()} "
                f"(redis.url, from {settings.origin('redis.url')}): {_sentinel_report(address)}")
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
    if isinstance(pool, SentinelConnectionPool):
        scheme = "rediss+sentinel" if issubclass(pool.connection_class, SSLConnection) else "redis+sentinel"
        hosts = ",".join("{host}:{port}".format_map(s.connection_pool.connection_kwargs)
                         for s in pool.sentinel_manager.sentinels)
        primary = f" (primary {pool.master_address[0]}:{pool.master_address[1]})" if pool.master_address else ""
        return f"{scheme}://{_auth(kwargs)}{hosts}/{pool.service_name}/{db}{primary}"
    if issubclass(pool.connection_class, UnixDomainSocketConnection):
        return f"unix://{kwargs.get('path', '')}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, SSLConnection) else "redis"
    return f"{scheme}://{_auth(kwargs)}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def _auth(kwargs: dict[str, Any]) -> str:
    user = kwargs.get("username") or ""
    return f"{user}:***@" if kwargs.get("password") else f"{user}@" if user else ""


def _sentinel_report(address: SentinelURL) -> str:
    """What each Sentinel says about the service, one clause per Sentinel, and what to check.

    redis-py's own error lists the failures but not a Sentinel that answered
    without knowing the service, which is the usual mistake (a typo in the name).
    """
    clauses = []
    wrong = False  # an address or a name in the URL, rather than a failover under way
    for host, port in address.sentinels:
        probe = Redis(host, port, **_sentinel_options(address))
        try:
            masters: Any = probe.sentinel_masters()  # {service: state}
        except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
            clauses.append(f"{host}:{port} did not answer ({exc})")
            wrong = True
            continue
        finally:
            probe.close()
        state = masters.get(address.service)
        if state is None:
            clauses.append(f"{host}:{port} monitors no service named {address.service!r} "
                           f"(it knows {', '.join(repr(name) for name in sorted(masters)) or 'none'})")
            wrong = True
        elif state.get("is_sdown") or state.get("is_odown") or not state.get("is_master"):
            clauses.append(f"{host}:{port} sees its primary {state.get('ip')}:{state.get('port')} down "
                           "(a failover may be under way)")
        else:
            clauses.append(f"{host}:{port} names primary {state.get('ip')}:{state.get('port')}")
    return "; ".join(clauses) + (". Check the host:port list and the service name in the URL" if wrong else "")


@dataclass(frozen=True, slots=True)
class ReplicaAcks:
    """``redis.min_replica_acks``: a write counts once this many replicas have it (``WAIT n timeout``).

    WAIT waits for the earlier writes *of its own connection*, so :meth:`command`
    goes in the same exchange as the write it confirms, and :meth:`check`
    reads its reply. ``count`` 0 sends nothing and checks nothing.
    """

    count: int = 0
    timeout_ms: int = 1000

    @classmethod
    def of(cls, config: RedisConfig) -> ReplicaAcks:
        return cls(config.min_replica_acks, config.replica_ack_timeout_ms)

    def commands(self) -> list[Command]:
        """The WAIT to send after the write, or nothing when no acknowledgement is wanted."""
        return [("WAIT", self.count, self.timeout_ms)] if self.count else []

    def check(self, acked: int, what: str, *, outcome: str = "", request_id: str | None = None) -> None:
        """Raise :class:`NotReplicated` when fewer than ``count`` replicas confirmed ``what``; ``outcome``
        says what that means for the caller."""
        if int(acked) >= self.count:
            return
        raise NotReplicated(f"{what} reached the primary, but only {int(acked)} of the {self.count} replicas "
                            f"redis.min_replica_acks asks for confirmed it within {self.timeout_ms} ms "
                            "(replica down or lagging, or a failover under way)" + (f", {outcome}" if outcome else ""),
                            request_id=request_id)

    def shortfall(self, acked: int, what: str) -> str | None:
        """:meth:`check`'s message, or None: for writers that log it and go on (router, worker)."""
        try:
            self.check(acked, what)
        except NotReplicated as exc:
            return exc.message
        return None


_RELEASE_LOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def release_lock(redis: Redis, key: str, owner: str) -> None:
    """Delete a lock only if ``owner`` still holds it: it may have expired and been taken by another."""
    redis.eval(_RELEASE_LOCK, 1, key, owner)


_RENEW_LOCK = ("local holder = redis.call('GET', KEYS[1]) "
               "if holder == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end "
               "if not holder then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return 1 end "
               "return 0")


def renew_lock(redis: Redis, key: str, owner: str, ttl_s: int) -> bool:
    """Extend ``owner``'s lock, taking it again if it expired meanwhile (Redis was out of reach longer than
    its TTL, and nobody took it); False when another holder has it."""
    return bool(redis.eval(_RENEW_LOCK, 1, key, owner, ttl_s))
