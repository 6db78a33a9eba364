"""Sentinel URLs: what each part means, and one clear line for each way of getting one wrong."""

from __future__ import annotations

import pytest

from laya.config import load_settings
from laya.errors import ConfigError
from laya.sentinel import parse_sentinel_url


def test_hosts_service_db_and_credentials() -> None:
    url = parse_sentinel_url("redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/cache/3")
    assert url.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (url.service, url.db, url.tls) == ("cache", 3, False)
    assert url.server_options == {"username": "app", "password": "s@cret", "db": 3}
    assert url.sentinel_options == {}, "the primary's password is not sent to the Sentinels"
    assert url.describe() == "redis+sentinel://app:***@10.0.0.1:26379,10.0.0.2:26379,[::1]:26380/cache/3"


def test_tls_form_and_sentinel_credentials() -> None:
    url = parse_sentinel_url("rediss+sentinel://h:1/mymaster?ssl_cert_reqs=none&sentinel_password=pw")
    assert url.tls and url.db == 0
    assert url.server_options["ssl"] is True and url.server_options["ssl_cert_reqs"] == "none"
    assert url.sentinel_options == {"ssl": True, "ssl_cert_reqs": "none", "password": "pw"}


@pytest.mark.parametrize(("url", "expected"), [
    ("redis+sentinel://h:26379", "names no service"),
    ("redis+sentinel://h:26379/", "names no service"),
    ("redis+sentinel://h:port/m", "Sentinel address 'h:port' has port 'port'"),
    ("redis+sentinel://h:1,:2/m", "Sentinel address ':2' has no host"),
    ("redis+sentinel://h:1/m/zero", "database 'zero' after the service name must be a number"),
    ("redis+sentinel://h:1/m/0/extra", "expected service_name[/db]"),
    ("redis+sentinel://h:1/m?colour=red", "unknown option 'colour'"),
])
def test_malformed_urls_are_refused_at_load_with_the_field(url: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"LAYA_REDIS_URL": url})
    message = info.value.message
    assert "\n" not in message
    assert message.startswith(f"environment variable LAYA_REDIS_URL: redis.url = '{url}': ")
    assert expected in message


def test_replica_acks_are_bounded() -> None:
    with pytest.raises(ConfigError, match="redis.min_replica_acks = '17': must be at most 16"):
        load_settings(environ={"LAYA_REDIS__MIN_REPLICA_ACKS": "17"})
    with pytest.raises(ConfigError, match="redis.replica_ack_timeout_ms = '0': must be at least 1"):
        load_settings(environ={"LAYA_REDIS__REPLICA_ACK_TIMEOUT_MS": "0"})
