"""A real `laya up` for the first-hour and README tests: started as a user would, stopped whatever happens.

It runs a shell command line (so a test can start `laya up` exactly as the
README writes it) in its own session, with its output in a log file, in a
directory of the test's own (`laya up` keeps its state in `.laya/` there).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


class RunningUp:
    """One `laya up` started from ``command`` (a shell line) in ``cwd`` with ``env``."""

    def __init__(self, command: str, *, cwd: Path, env: Mapping[str, str], name: str = "up") -> None:
        self.log = cwd / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=dict(env), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.text())) is None:
            assert self.proc.poll() is None, f"laya up exited ({self.proc.returncode}):\n{self.text()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in the log of laya up:\n{self.text()}"
            time.sleep(0.05)
        return found

    def close(self) -> None:
        """SIGTERM (an ordered stop), then SIGKILL for whatever it left: router, worker, server."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.text()
        pids = re.findall(r"laya (?:router|worker(?::[A-Za-z0-9_.-]+)?) started \(pid (\d+)\)", text)
        pids += re.findall(r"embedded Valkey on \S+ \(pid (\d+)", text)
        for pid in map(int, pids):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
