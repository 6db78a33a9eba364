"""Sentinel URLs on real Sentinels: every kind of process finds the primary; wrong addresses and names
fail fast with one line that says what each Sentinel answered."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from laya.cli import main
from laya.client import Client
from laya.config import load_settings
from laya.connection import connect, server_url
from laya.errors import ServerError
from tests.conftest import free_port
from tests.processes import start_laya, stop_laya
from tests.sentinels import SentinelSet


def test_producer_router_and_stats_find_the_primary_through_sentinel(
        sentinels: SentinelSet, routes_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"LAYA_REDIS_URL": sentinels.url, "LAYA_ROUTES": str(routes_file), "LAYA_REDIS__PREFIX": "sentinelled",
           "LAYA_ROUTER__BLOCK_MS": "100"}
    settings = load_settings(environ=env)
    router = start_laya("router", {**_base_env(), **env}, tmp_path / "router.log")
    try:
        client = Client.from_settings(settings)
        assert client.ask("hello", timeout=30).route == "rule:greeting"
        primary = sentinels.primary()
        assert server_url(client.redis).endswith(f"/laya/0 (primary 127.0.0.1:{primary.port})")
        with primary.client() as direct:
            assert direct.exists("sentinelled:ingress")  # the write went to the primary the Sentinels name
        deadline = time.monotonic() + 10
        while "rule:greeting" not in _stats(env, capsys):  # the router publishes its counters each second
            assert time.monotonic() < deadline, "laya stats never showed the router's counters"
            time.sleep(0.2)
    finally:
        stop_laya(router)


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _stats(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert main(["stats"]) == 0
    return capsys.readouterr().out


def test_unreachable_sentinels_fail_fast_naming_each(tmp_path: Path) -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/laya/0"
    settings = load_settings(environ={"LAYA_REDIS_URL": url})
    started = time.monotonic()
    with pytest.raises(ServerError) as info:
        connect(settings)
    assert time.monotonic() - started < 30
    message = info.value.message
    assert "\n" not in message
    assert message.startswith(f"no primary for service 'laya' from the Sentinels at {url} (redis.url, from "
                              "LAYA_REDIS_URL): ")
    assert message.count("did not answer") == 2, message
    assert "Check the host:port list and the service name" in message


def test_unknown_service_names_the_services_sentinel_knows(sentinels: SentinelSet) -> None:
    url = sentinels.url.replace("/laya/0", "/lyaa/0")
    with pytest.raises(ServerError) as info:
        connect(load_settings(environ={"LAYA_REDIS_URL": url}))
    message = info.value.message
    assert message.count("monitors no service named 'lyaa' (it knows 'laya')") == 3, message


def test_cli_prints_one_line_for_an_unknown_service(sentinels: SentinelSet,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAYA_REDIS_URL", sentinels.url.replace("/laya/0", "/nope/0"))
        assert main(["submit", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("laya submit: no primary for service 'nope'") and "\n" not in err, err


def test_router_imports_without_llama_cpp(redis_server: object, routes_file: Path, tmp_path: Path) -> None:
    """A router host need not have llama-cpp-python: `laya router` runs and answers with it unimportable."""
    import subprocess

    block = ("import sys, importlib.abc\n"
             "class Block(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'llama_cpp':\n"
             "            raise ImportError('llama_cpp is blocked on this router host')\n"
             "sys.meta_path.insert(0, Block())\n"
             "from laya.cli import main\n"
             "sys.exit(main(['router']))\n")
    url = redis_server.url  # type: ignore[attr-defined]
    env = {**_base_env(), "LAYA_REDIS_URL": url, "LAYA_ROUTES": str(routes_file), "LAYA_REDIS__PREFIX": "nollama",
           "LAYA_ROUTER__BLOCK_MS": "100"}
    with open(tmp_path / "router.log", "wb") as log:
        router = subprocess.Popen([sys.executable, "-c", block], env=env, stderr=log)
    try:
        client = Client.from_url(url, prefix="nollama")
        assert client.ask("hello", timeout=30).route == "rule:greeting"
        assert router.poll() is None
    finally:
        stop_laya(router)
    assert "llama_cpp" not in (tmp_path / "router.log").read_text()
