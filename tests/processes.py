"""Laya's own processes, started by the tests as real subprocesses (``python -m laya ROLE``)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def start_laya(role: str, env: Mapping[str, str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``laya ROLE``; its stderr (the log) goes to ``log`` when given, else to the test's stderr."""
    command = [sys.executable, "-m", "laya", role]
    if log is None:
        return subprocess.Popen(command, env=env)
    with open(log, "wb") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, env=env, stderr=stderr)


def stop_laya(*procs: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM every process still running, then wait; one that will not stop is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
