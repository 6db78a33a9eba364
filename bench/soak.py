"""Soak: 10,000 mixed requests while routers and workers are SIGKILLed and restarted at random.

    python bench/soak.py [--requests 10000] [--seed 3]     # writes bench/results/soak.md
    python bench/soak.py --workers 2 --sentinel            # writes bench/results/soak_sentinel.md

Two routers and one worker (or ``--workers``, each a separate process sharing
only the Redis URL with the others; ``--sentinel``: a Sentinel URL, to one
primary with a replica and three Sentinels) (tiny generated model) serve a throwaway Valkey with
fast failover settings (pending entries reclaimed after 0.5 s, a worker lost
after 5 s without heartbeat, jobs retried up to 3 times). A producer submits
the requests in waves — rule hits, repeated prompts (cache hits), unique model
jobs — all on one reply channel, while a chaos loop kills a random process
every 0.5–2.5 s and starts it again. Then it waits for every answer and counts:

* lost: a request that never got a result;
* duplicated: a request whose result was delivered more than once, or twice differently.

Both must be 0. With several workers it also reports how the model jobs
split between them (each job's RQ record names the worker that ran it).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import start_valkey, write_results

FAILOVER = {"LAYA_ROUTER__CLAIM_IDLE_MS": "500", "LAYA_ROUTER__BLOCK_MS": "100",
            "LAYA_ROUTER__REAP_INTERVAL_S": "0.5", "LAYA_ROUTER__MAX_QUEUE_DEPTH": "1000000",
            "LAYA_RUNTIME__HEARTBEAT_TTL_S": "5", "LAYA_RUNTIME__HEARTBEAT_INTERVAL_S": "0.5",
            "LAYA_RUNTIME__JOB_RETRIES": "3"}


def main() -> None:
    from laya.client import Client
    from laya.connection import open_redis
    from laya.worker.tinymodel import write_tiny_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sentinel", action="store_true", help="one primary, one replica, three Sentinels")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "processes.log", "wb") as log:
        if args.sentinel:
            from tests.sentinels import SentinelSet

            server: Any = SentinelSet(Path(tmp) / "servers").start()
            url = server.url
        else:
            server = start_valkey(Path(tmp))
            url = f"{server.connection_url}/0"
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        env = {**os.environ, **FAILOVER, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model),
               "LAYA_ROUTES": str(Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml")}

        slot_of_pid: dict[int, str] = {}

        def start(name: str) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen([sys.executable, "-m", "laya", name.split("-")[0]], env=env, stderr=log)
            slot_of_pid[proc.pid] = name
            return proc

        workers = ["worker"] if args.workers == 1 else [f"worker-{i + 1}" for i in range(args.workers)]
        procs = {name: start(name) for name in ["router-1", "router-2", *workers]}
        kills: collections.Counter[str] = collections.Counter()
        done = threading.Event()

        def chaos() -> None:
            while not done.wait(rng.uniform(0.5, 2.5)):
                name = rng.choice(sorted(procs))
                procs[name].send_signal(signal.SIGKILL)
                procs[name].wait()
                kills[name] += 1
                done.wait(rng.uniform(0.0, 1.0))
                procs[name] = start(name)

        client = Client(open_redis(url))
        channel = client.new_channel()
        chaos_thread = threading.Thread(target=chaos, daemon=True)
        started = time.monotonic()
        chaos_thread.start()
        submitted: list[str] = []
        kinds = ["hello", "ping", "what are the opening hours", "echo: soak"]
        for wave in range(0, args.requests, 500):
            payloads = []
            for i in range(wave, min(wave + 500, args.requests)):
                roll = rng.random()
                if roll < 0.4:
                    payloads.append({"prompt": rng.choice(kinds)})
                elif roll < 0.7:
                    payloads.append({"prompt": f"repeat {rng.randrange(20)} k", "max_tokens": 6})
                else:
                    payloads.append({"prompt": f"unique job {i} m", "max_tokens": 6, "cache": False})
            submitted += client.submit_many(payloads, reply_to=channel)
            time.sleep(0.5)
        deliveries: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
        routes: collections.Counter[str] = collections.Counter()
        chaos_stop = time.monotonic() + 10  # keep killing for a while after the last wave
        deadline = time.monotonic() + 600
        wanted = set(submitted)
        while time.monotonic() < deadline:
            if time.monotonic() > chaos_stop:
                done.set()
            for result in client.poll_channel(channel, timeout=1.0):
                deliveries[result.id].append(result.model_dump_json(include={"route", "text", "ok"}))
                routes[result.route] += 1
            if wanted <= deliveries.keys() and done.is_set():
                for result in client.poll_channel(channel, timeout=3.0):  # stragglers: duplicates
                    deliveries[result.id].append(result.model_dump_json(include={"route", "text", "ok"}))
                break
        done.set()
        chaos_thread.join()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=30)
        split = _worker_split(client, [rid for rid in wanted if any('"model:' in d for d in deliveries.get(rid, []))],
                              slot_of_pid)
        server.stop()
    elapsed = time.monotonic() - started
    lost = len(wanted - deliveries.keys())
    duplicated = sum(1 for rid in wanted if len(deliveries.get(rid, [])) > 1)
    lines = [f"# Soak: {args.requests:,} mixed requests under random SIGKILLs (seed {args.seed})", "",
             (f"- submitted: {len(submitted):,}; answered: {len(wanted & deliveries.keys()):,}; "
              f"**lost: {lost}**; **duplicated: {duplicated}**"),
             f"- processes killed: {dict(kills)} ({sum(kills.values())} kills in {elapsed:.0f} s)", "",
             "| route | count |", "|---|---:|"]
    lines += [f"| {route} | {count:,} |" for route, count in routes.most_common()]
    if len(workers) > 1:
        lines += ["", "| worker (all its restarts) | model jobs run |", "|---|---:|"]
        lines += [f"| {name} | {count:,} |" for name, count in sorted(split.items())]
    ok = not lost and not duplicated
    lines += ["", f"Target 0 lost and 0 duplicated: {'met' if ok else 'NOT met'}."]
    setup = (f"{len(workers)} workers" if len(workers) > 1 else "") + (", Sentinel URL" if args.sentinel else "")
    if setup:
        lines[0] += f"; 2 routers, {setup.lstrip(', ')}"
    write_results("soak_sentinel.md" if args.sentinel else "soak.md", lines,
                  run=(f"seed {args.seed}, {len(submitted):,} requests, {sum(kills.values())} kills: {lost} lost, "
                       f"{duplicated} duplicated; target {'met' if ok else 'NOT met'}"
                       + (f"; jobs per worker {dict(sorted(split.items()))}" if len(workers) > 1 else "")))


def _worker_split(client: Any, request_ids: list[str], slot_of_pid: dict[int, str]) -> collections.Counter[str]:
    """How many of the model jobs ``request_ids`` each worker slot ran, from the RQ job records."""
    with client.redis.pipeline(transaction=False) as pipe:
        for rid in request_ids:
            pipe.hget(f"rq:job:{rid}", "worker_name")
        names = pipe.execute()
    split: collections.Counter[str] = collections.Counter()
    for name in names:
        pid = int(name.decode().rsplit("-", 1)[-1].split(".")[0]) if name else 0
        split[slot_of_pid.get(pid, "unknown")] += 1
    return split


if __name__ == "__main__":
    main()
