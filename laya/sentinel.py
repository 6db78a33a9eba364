"""Sentinel URLs: where the Sentinels are and which service (primary) Laya uses.

    redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db][?option=value...]
    rediss+sentinel://...      the same over TLS, to the Sentinels and to the data servers

The user and password authenticate to the primary (and its replicas): Sentinels
are usually open on a private network, and when they are not,
``?sentinel_password=`` (and ``sentinel_username=``) authenticate to them. Other
options are redis-py's URL options (``ssl_ca_certs``, ``ssl_cert_reqs``, ...).

This module only reads the URL (no I/O); :func:`laya.connection.open_redis` makes
the connections. A malformed URL raises ``ValueError`` with one line naming the
part that is wrong and what to write instead, which the config loader turns
into its ``redis.url = ...: why`` message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from redis.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

__all__ = ["SCHEMES", "SentinelURL", "is_sentinel_url", "parse_sentinel_url"]

SCHEMES = ("redis+sentinel", "rediss+sentinel")
_EXAMPLE = "redis+sentinel://host1:26379,host2:26379/mymaster/0"
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True, slots=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    tls: bool = False
    server_options: dict[str, Any] = field(default_factory=dict)
    """Connection options for the primary: credentials, db, TLS (redis-py keyword arguments)."""
    sentinel_options: dict[str, Any] = field(default_factory=dict)
    """Connection options for the Sentinels: their own credentials, TLS."""

    def describe(self) -> str:
        """The URL without passwords, as errors and logs show it."""
        scheme = SCHEMES[1] if self.tls else SCHEMES[0]
        user = self.server_options.get("username")
        auth = (f"{quote(user or '')}:***@" if self.server_options.get("password")
                else f"{quote(user)}@" if user else "")
        hosts = ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in self.sentinels)
        return f"{scheme}://{auth}{hosts}/{self.service}/{self.db}"


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0] in SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Read a Sentinel URL; ``ValueError`` (one line: the part, the value, what to write) when malformed."""
    scheme, sep, rest = url.partition("://")
    if scheme not in SCHEMES or not sep:
        raise ValueError(f"must start with {SCHEMES[0]}:// or {SCHEMES[1]}://, e.g. {_EXAMPLE}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = tuple(_host_port(part) for part in hosts.split(","))
    parts = [unquote(p) for p in path.split("/") if p] if path else []
    if not parts:
        raise ValueError(f"names no service: give the name Sentinel monitors after the hosts, e.g. {_EXAMPLE}")
    if len(parts) > 2:
        raise ValueError(f"has {'/'.join(parts)!r} after the hosts; expected service_name[/db], e.g. {_EXAMPLE}")
    service, db_text = parts[0], parts[1] if len(parts) == 2 else "0"
    if not db_text.isdigit():
        raise ValueError(f"database {db_text!r} after the service name must be a number (0 if unsure)")
    options = dict(parse_qsl(query, keep_blank_values=True))
    sentinel_auth = {key.removeprefix("sentinel_"): options.pop(key) for key in _SENTINEL_OPTIONS if key in options}
    unknown = sorted(key for key in options if key not in URL_QUERY_ARGUMENT_PARSERS and not key.startswith("ssl_"))
    if unknown:
        raise ValueError(f"has unknown option {unknown[0]!r}; Sentinel URLs take redis-py's URL options "
                         f"(socket_timeout, ssl_ca_certs, ...) and {' and '.join(_SENTINEL_OPTIONS)}")
    # redis-py reads the credentials and the remaining options as it would for one server.
    server = "rediss" if scheme == SCHEMES[1] else "redis"
    try:
        server_options = parse_url(f"{server}://{userinfo + '@' if userinfo else ''}sentinel/{db_text}"
                                   + (f"?{urlencode(options)}" if options else ""))  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"has a bad option: {exc}") from None
    for key in ("host", "port", "connection_class"):
        server_options.pop(key, None)
    tls = scheme == SCHEMES[1]
    if tls:
        server_options["ssl"] = True
    sentinel_options = {key: value for key, value in server_options.items() if key.startswith("ssl")}
    sentinel_options.update(sentinel_auth)
    return SentinelURL(sentinels=sentinels, service=service, db=int(db_text), tls=tls,
                       server_options=server_options, sentinel_options=sentinel_options)


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon:
        host, port = text, "26379"  # Sentinel's own default port
    host = host.strip("[]")  # an IPv6 address in brackets
    if not host:
        raise ValueError(f"Sentinel address {text!r} has no host; write host:port, several separated by commas, "
                         f"e.g. {_EXAMPLE}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Sentinel address {text!r} has port {port!r}; a port is a number from 1 to 65535")
    return host, int(port)
