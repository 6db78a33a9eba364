"""Streaming: time to the first chunk at the producer against the worker's own time to first token.

    python bench/streaming.py [--requests 40] [--layers 4]      # writes bench/results/streaming.md

A throwaway Valkey, a `laya router` and a `laya worker` process serve a generated
model of Qwen2.5-1.5B's shapes in Q4_K_M (``--layers`` of its 28 layers; random
weights, steered answers). The producer sends the requests one at a time with
``Client.stream`` and stamps the first chunk's arrival and the result's. For each
request the result record carries the worker's own figures (router decision,
queue wait, time to first token from job start), so the table compares, per
request, in the same run:

* producer: submit → first chunk in hand (what a streaming user waits for);
* worker: router decision + queue wait + TTFT (when the first token existed);
* the difference: what streaming adds on the way out (flush, XADD, XREAD wake-up);
* producer: submit → result, streaming vs the same prompts without ``stream`` (decode is not slowed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import start_valkey, stop_processes, write_results

from laya.router.latency import percentile


def stats_ms(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{percentile(ordered, 50):.2f} | {percentile(ordered, 99):.2f} | {statistics.fmean(ordered):.2f}"


def main() -> None:
    from laya.client import Chunk, Client
    from laya.connection import open_redis
    from laya.schema import Result
    from tests.shapedmodel import SHAPES, write_shaped_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "processes.log", "wb") as log:
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        model = write_shaped_model(Path(tmp) / "q.gguf", SHAPES["qwen2.5-1.5b"].with_layers(args.layers), "Q4_K_M",
                                   stops=False)
        env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model),
               "LAYA_ROUTER__BLOCK_MS": "100", "LAYA_RUNTIME__MAX_SEQ_LEN": "512"}
        procs = [subprocess.Popen([sys.executable, "-m", "laya", role], env=env, stderr=log)
                 for role in ("router", "worker")]
        try:
            client = Client(open_redis(url))
            client.ask("warm up", max_tokens=4, timeout=120, cache=False)
            first_ms: list[float] = []
            worker_ms: list[float] = []
            added_ms: list[float] = []
            total_stream_ms: list[float] = []
            tok_s_stream: list[float] = []
            for i in range(args.requests):
                started = time.time()
                first: float | None = None
                result: Result | None = None
                for item in client.stream(f"request {i} about {chr(97 + i % 26)}", max_tokens=args.max_tokens,
                                          cache=False, timeout=60):
                    if isinstance(item, Chunk) and first is None:
                        first = time.time()
                    elif isinstance(item, Result):
                        result = item
                assert first is not None and result is not None and result.ok, result
                t = result.timings
                worker = (t.route_us or 0) / 1000 + (t.queue_wait_ms or 0) + (t.ttft_ms or 0)
                first_ms.append((first - started) * 1000)
                worker_ms.append(worker)
                added_ms.append((first - started) * 1000 - worker)
                total_stream_ms.append((time.time() - started) * 1000)
                tok_s_stream.append(t.tokens_per_s or 0)
            total_plain_ms: list[float] = []
            tok_s_plain: list[float] = []
            for i in range(args.requests):
                started = time.time()
                result = client.ask(f"request {i} about {chr(97 + i % 26)}", max_tokens=args.max_tokens,
                                    cache=False, timeout=60)
                total_plain_ms.append((time.time() - started) * 1000)
                tok_s_plain.append(result.timings.tokens_per_s or 0)
        finally:
            stop_processes(procs)
            server.stop()
    lines = [
        f"# Streaming: time to first chunk, {args.requests} requests",
        "",
        (f"Qwen2.5-1.5B shapes, {args.layers} layers, Q4_K_M, on this machine's CPU; {args.max_tokens} tokens "
         "each; one request at a time; router and worker are separate processes; `runtime.stream_flush_ms` 20 "
         "(default)."),
        "`python bench/streaming.py` reproduces it.",
        "",
        "| per request, ms | p50 | p99 | mean |",
        "|---|---:|---:|---:|",
        f"| producer: submit → first chunk | {stats_ms(first_ms)} |",
        f"| worker: route + queue wait + TTFT (baseline) | {stats_ms(worker_ms)} |",
        f"| added by streaming (first chunk − baseline) | {stats_ms(added_ms)} |",
        f"| producer: submit → result, streaming | {stats_ms(total_stream_ms)} |",
        f"| producer: submit → result, not streaming | {stats_ms(total_plain_ms)} |",
        "",
        (f"Decode rate reported by the worker (median): {statistics.median(tok_s_stream):.1f} tok/s streaming, "
         f"{statistics.median(tok_s_plain):.1f} tok/s not streaming."),
    ]
    write_results("streaming.md", lines, run=(
        f"first chunk p50 {percentile(sorted(first_ms), 50):.2f} ms vs worker TTFT path "
        f"{percentile(sorted(worker_ms), 50):.2f} ms (added p50 {percentile(sorted(added_ms), 50):.2f}, "
        f"p99 {percentile(sorted(added_ms), 99):.2f} ms)"))


if __name__ == "__main__":
    main()
