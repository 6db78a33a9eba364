"""Fuzz the ingress stream: ≥ 100,000 hostile entries straight into Redis.

    python bench/fuzz_ingress.py [--entries 100000] [--seed 1]   # writes bench/results/fuzz_ingress.md

A router and a worker (tiny generated model) serve a throwaway Valkey. Entries
are XADDed directly — no client-side validation — in many shapes: random
bytes, invalid UTF-8, NUL bytes, deeply nested JSON, multi-megabyte payloads,
missing and extra fields, wrong types, absurd generation parameters, unknown
models, byte-flipped valid requests, and a few valid ones. Every entry must
end in a result: under its request id when it carries a valid one, else under
its stream entry id (what `salvage_identity` documents). Reports crashes (a
process that exited or printed a traceback: must be 0) and unanswered entries
(must be 0).
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
import time
from pathlib import Path

import orjson
from common import start_valkey, write_results

VALID = {"prompt": "write the alphabet", "max_tokens": 4}
BAD_VALUES = [None, True, -1, 0, 10**12, 1e308, "x", "", [], {}, [1, 2], {"a": 1}, "\x00", "🙂" * 5]
FIELDS = ["prompt", "messages", "model", "max_tokens", "temperature", "top_p", "top_k", "repeat_penalty",
          "seed", "stop", "cache", "metadata", "reply_to", "submitted_at", "id", "colour"]


def hostile(rng: random.Random, n: int) -> dict[bytes, bytes]:
    """One entry. ``n`` makes explicit ids unique."""
    kind = rng.randrange(14)
    rid = f"fz{n}"
    if kind == 0:
        return {b"r": rng.randbytes(rng.randrange(0, 300))}
    if kind == 1:
        return {b"r": b'{"id": "' + rid.encode() + b'", "prompt": "' + rng.randbytes(20) + b'"}'}
    if kind == 2:
        return {b"r": orjson.dumps({"id": rid, "prompt": "a\x00b" * rng.randrange(1, 50)})}
    if kind == 3:
        depth = rng.randrange(50, 5000)
        return {b"r": b'{"id": "' + rid.encode() + b'", "metadata": ' + b"[" * depth + b"]" * depth + b"}"}
    if kind == 4 and n % 500 == 0:  # multi-megabyte, rarely: one n in 500, of which one in 14 (~14 in 100,000)
        return {b"r": orjson.dumps({"id": rid, "prompt": "x" * rng.randrange(1_000_000, 3_000_000)})}
    if kind == 5:
        return {rng.choice([b"x", b"request", b"R", b""]): orjson.dumps(VALID)}
    if kind == 6:
        return {b"r": orjson.dumps({**VALID, "id": rid}), b"extra": rng.randbytes(10)}
    if kind == 7:
        field = rng.choice(FIELDS)
        return {b"r": orjson.dumps({**VALID, "id": rid, field: rng.choice(BAD_VALUES)})}
    if kind == 8:
        return {b"r": orjson.dumps({**VALID, "id": rid, "model": rng.choice(["gpt-5", "../../etc", "a" * 100])})}
    if kind == 9:
        raw = bytearray(orjson.dumps({**VALID, "id": rid, "temperature": 0.5}))
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return {b"r": bytes(raw)}
    if kind == 10:
        return {b"r": orjson.dumps(rng.choice([[], "prompt", 42, None, [VALID]]))}
    if kind == 11:
        messages = [{"role": rng.choice(["user", "system", "robot", 7]), "content": rng.choice(["hi", 3, None])}
                    for _ in range(rng.randrange(0, 4))]
        return {b"r": orjson.dumps({"id": rid, "messages": messages})}
    if kind == 12 and n % 100 == 0:  # a few valid requests, which go all the way to the model
        return {b"r": orjson.dumps({**VALID, "id": rid, "prompt": f"item {n} q"})}
    return {b"r": orjson.dumps({"id": rid, "prompt": rng.choice(["hello", "", "   ", "ping"])})}


def main() -> None:
    from laya.codec import salvage_identity
    from laya.connection import open_redis
    from laya.worker.tinymodel import write_tiny_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        redis = open_redis(url)
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model),
               "LAYA_ROUTES": str(Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml")}
        logs = {role: Path(tmp) / f"{role}.log" for role in ("router", "worker")}
        procs = {}
        for role, log in logs.items():
            with open(log, "wb") as stderr:
                procs[role] = subprocess.Popen([sys.executable, "-m", "laya", role], env=env, stderr=stderr)
        expected: list[str] = []
        huge = 0
        kinds: collections.Counter[str] = collections.Counter()
        started = time.monotonic()
        try:
            pipe = redis.pipeline(transaction=False)
            pending: list[dict[bytes, bytes]] = []
            for n in range(args.entries):
                entry = hostile(rng, n)
                huge += any(len(value) > 1_000_000 for value in entry.values())
                pending.append(entry)
                pipe.xadd("laya:ingress", entry)  # type: ignore[arg-type]
                if len(pipe) >= 500 or n == args.entries - 1:
                    for fields, entry_id in zip(pending, pipe.execute()):
                        request_id, _ = salvage_identity(fields, entry_id.decode())
                        expected.append(request_id)
                    pending = []
            deadline = time.monotonic() + 600
            missing = expected
            while missing and time.monotonic() < deadline:
                time.sleep(1)
                values = []
                for i in range(0, len(missing), 5000):
                    values += redis.mget([f"laya:result:{rid}" for rid in missing[i:i + 5000]])
                for value in values:
                    if value is not None:
                        kinds[orjson.loads(value)["route"]] += 1
                missing = [rid for rid, value in zip(missing, values) if value is None]
                if all(p.poll() is not None for p in procs.values()):
                    break
            exited = {role: p.poll() for role, p in procs.items() if p.poll() is not None}
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            for proc in procs.values():
                proc.wait(timeout=30)
            server.stop()
        tracebacks = {role: log.read_bytes().count(b"Traceback") for role, log in logs.items()}
    crashes = len(exited) + sum(tracebacks.values())
    elapsed = time.monotonic() - started
    lines = [f"# Ingress fuzz: {args.entries:,} hostile entries (seed {args.seed})", "",
             (f"- entries: {args.entries:,}; answered: {args.entries - len(missing):,}; "
              f"**unanswered: {len(missing)}**"),
             f"- **crashes: {crashes}** (processes that exited: {exited or 'none'}; tracebacks logged: {tracebacks})",
             f"- entries over 1 MB: {huge}", f"- time: {elapsed:.1f} s", "", "| result route | count |",
             "|---|---:|"]
    lines += [f"| {route} | {count:,} |" for route, count in kinds.most_common()]
    ok = not crashes and not missing
    lines += ["", f"Target 0 crashes and 0 unanswered: {'met' if ok else 'NOT met'}."]
    write_results("fuzz_ingress.md", lines,
                  run=(f"seed {args.seed}, {args.entries:,} entries ({huge} over 1 MB): {crashes} crashes, "
                       f"{len(missing)} unanswered; target {'met' if ok else 'NOT met'}"))


if __name__ == "__main__":
    main()
