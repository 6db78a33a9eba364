"""`laya batch` on a file that rules and the cache mostly answer, against the same file all through the model.

    python bench/batch.py [--lines 10000] [--max-tokens 1]     # writes bench/results/batch.md

A throwaway Valkey, a real `laya router` process and a real worker process
(`LayaWorker`, RQ, `laya.worker.jobs.generate`), driven by the real `laya batch`
command. Only the model is simulated: the worker process runs Laya's worker
loop on a `ScriptedBackend` that sleeps 1/40 s per generated token (a 7B
model on an 8 GB card decodes about 40 tokens/s), so the runs time Laya, not
this machine's CPU.

The input: 35 % of the lines match the example rules (`ping N`, `echo: ...`,
the opening hours of shop N), 35 % ask what an earlier run already asked (their
answers are put in the response cache first, as that run's worker would have
left them), 30 % are new. Every prompt is distinct, so nothing answers another.

1. rules + cache: the router has the example rules, the cache holds those answers;
2. all through the model, in the same run: the server is emptied, the router
   has no rules, so every line (checked) becomes a model job.

Also measured in the same run: the backend called directly, one request at a
time, the baseline for Laya's overhead per model job. A job's overhead is the
worker's time per job (from one job's result to the next one's, in run 2,
where the queue never runs dry) minus the backend's time for it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from common import start_valkey, stop_processes, write_results

from laya.router.latency import percentile

ROUTES = Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml"
SECONDS_PER_TOKEN = 1 / 40
TARGET = 0.35


def serve_worker(max_tokens: int) -> None:
    """The worker process: Laya's worker loop (RQ, jobs, results) on a backend that only takes the time."""
    from laya.config import load_settings
    from laya.connection import connect
    from laya.worker.backend import ScriptedBackend
    from laya.worker.rqworker import run_worker

    settings = load_settings(None)
    backend = ScriptedBackend(default="x" * max_tokens, seconds_per_token=SECONDS_PER_TOKEN)
    run_worker(settings, connect(settings, wait=True), backend=backend)


def write_input(path: Path, lines: int, max_tokens: int, seed: int) -> list[str]:
    """The batch file; returns the prompts whose answers an earlier run left in the cache."""
    rng = random.Random(seed)
    kinds = ["rule"] * round(lines * 0.35) + ["cached"] * round(lines * 0.35)
    kinds += ["new"] * (lines - len(kinds))
    rng.shuffle(kinds)
    rules = ("ping {}", "echo: item {}", "What are the opening hours of shop {}?")
    cached: list[str] = []
    out = []
    for number, kind in enumerate(kinds):
        if kind == "rule":
            prompt = rules[number % 3].format(number)
        else:
            prompt = f"Describe product {number} in one line"
            if kind == "cached":
                cached.append(prompt)
        out.append(orjson.dumps({"prompt": prompt, "max_tokens": max_tokens}))
    path.write_bytes(b"\n".join(out) + b"\n")
    return cached


def fill_cache(url: str, prompts: list[str], max_tokens: int) -> None:
    """The answers a worker stores after answering ``prompts``, under the keys the router will look up."""
    from laya.connection import open_redis
    from laya.keys import Keys
    from laya.router.cache import cache_key
    from laya.schema import Request
    from laya.text import normalise

    redis, keys = open_redis(url), Keys()
    answer = orjson.dumps({"text": "x" * max_tokens, "model": "default", "finish_reason": "length",
                           "usage": {"prompt_tokens": 8, "completion_tokens": max_tokens}})
    with redis.pipeline(transaction=False) as pipe:
        for prompt in prompts:
            request = Request(prompt=prompt, max_tokens=max_tokens)
            pipe.set(keys.cache(cache_key(request, "default", max_tokens, normalise(prompt))), answer, ex=86_400)
        pipe.execute()


def run_batch(env: dict[str, str], source: Path, out: Path, *, rules: bool, max_tokens: int,
              log: Path) -> tuple[float, list[dict[str, object]], int]:
    """Start a router and a worker, time `laya batch` over ``source``, stop them.

    Returns the seconds, the records and how many lines the batch resubmitted after overload."""
    env = dict(env)
    if rules:
        env["LAYA_ROUTES"] = str(ROUTES)
    with open(log, "ab") as sink:
        router = subprocess.Popen([sys.executable, "-m", "laya", "router"], env=env, stderr=sink)
        worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", "--max-tokens", str(max_tokens)],
                                  env=env, stderr=sink)
        try:
            time.sleep(3)  # both connected and serving
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "laya", "batch", str(source), "-o", str(out)], env=env,
                                  capture_output=True, text=True, check=False)
            seconds = time.perf_counter() - started
        finally:
            stop_processes((router, worker))
    if done.returncode != 0:
        raise SystemExit(f"laya batch failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    print(done.stdout, flush=True)
    resubmitted = re.search(r"; (\d+) resubmitted after overload", done.stdout)
    if resubmitted is None:
        raise SystemExit(f"no summary from laya batch:\n{done.stdout}")
    return seconds, [orjson.loads(line) for line in out.read_bytes().splitlines()], int(resubmitted[1])


def direct_ms(max_tokens: int, calls: int) -> list[float]:
    """The backend alone: what one model job costs without Laya."""
    from laya.schema import Request
    from laya.worker.backend import Controls, ScriptedBackend

    backend = ScriptedBackend(default="x" * max_tokens, seconds_per_token=SECONDS_PER_TOKEN)
    times = []
    for number in range(calls):
        request = Request(prompt=f"Describe product {number} in one line", max_tokens=max_tokens)
        started = time.perf_counter()
        backend.generate(request, max_tokens=max_tokens, controls=Controls(deadline=time.monotonic() + 60))
        times.append((time.perf_counter() - started) * 1000)
    return times


def per_job_ms(records: list[dict[str, object]]) -> tuple[list[float], list[float]]:
    """(worker time per job, Laya's overhead per job): from one result to the next, and that minus the backend."""
    jobs = sorted((float(r["finished_at"]), float(r["timings"]["generation_ms"]))  # type: ignore[arg-type, index]
                  for r in records if str(r["route"]).startswith("model:"))
    cycles = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(jobs)]
    return cycles, [cycle - gen for cycle, (_, gen) in zip(cycles, jobs[1:])]


def stats(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{percentile(ordered, 50):.2f} / {percentile(ordered, 99):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--max-tokens", type=int, default=1, help="tokens per model answer (default 1)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        serve_worker(args.max_tokens)
        return
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = start_valkey(tmp)
        url = f"{server.connection_url}/0"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        env.update(LAYA_REDIS_URL=url, LAYA_ROUTER__BLOCK_MS="100")
        source = tmp / "batch.jsonl"
        cached = write_input(source, args.lines, args.max_tokens, args.seed)
        try:
            fill_cache(url, cached, args.max_tokens)
            on_s, on, on_resent = run_batch(env, source, tmp / "on.jsonl", rules=True, max_tokens=args.max_tokens,
                                            log=tmp / "processes.log")
            from laya.connection import open_redis

            open_redis(url).flushall()
            off_s, off, off_resent = run_batch(env, source, tmp / "off.jsonl", rules=False,
                                               max_tokens=args.max_tokens, log=tmp / "processes.log")
        finally:
            server.stop()
        direct = direct_ms(args.max_tokens, 300)
    report(args, (on_s, on, on_resent), (off_s, off, off_resent), direct)


Run = tuple[float, list[dict[str, object]], int]
"""(wall seconds, records, lines resubmitted after overload)."""


def report(args: argparse.Namespace, with_rules: Run, without: Run, direct: list[float]) -> None:
    (on_s, on, on_resent), (off_s, off, off_resent) = with_rules, without
    def routes(records: list[dict[str, object]]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in records:
            kind = str(record["route"]).split(":")[0] if str(record["route"]).startswith("rule:") else str(
                record["route"])
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    on_routes, off_routes = routes(on), routes(off)
    if off_routes != {"model:default": args.lines} or len(on) != args.lines:
        raise SystemExit(f"unexpected routes: {on_routes} / {off_routes}")
    ratio = on_s / off_s
    cycles, overhead = per_job_ms(off)
    met = "met" if ratio <= TARGET else "**not met**"
    model_jobs = on_routes.get("model:default", 0)
    lines = [
        f"# `laya batch`: {args.lines:,} lines, 70 % answered by rules or the cache, against all through the model",
        "",
        (f"`python bench/batch.py --lines {args.lines} --max-tokens {args.max_tokens}`: a real router process, "
        f"a real worker process whose backend sleeps {SECONDS_PER_TOKEN * 1000:.0f} ms per token "
        f"({args.max_tokens} token{'s' if args.max_tokens != 1 else ''} per answer), `laya batch` with its "
        "defaults, on the 2-core development machine."),
        "",
        "| run | routes | model jobs | resubmitted after overload | wall |",
        "|---|---|---:|---:|---:|",
        (f"| rules + cache | {', '.join(f'{k} {v:,}' for k, v in sorted(on_routes.items()))} | {model_jobs:,} | "
         f"{on_resent:,} | {on_s:.1f} s |"),
        f"| all through the model | model {args.lines:,} | {args.lines:,} | {off_resent:,} | {off_s:.1f} s |",
        "",
        f"Wall time with rules and the cache: **{ratio:.3f}×** the all-through-the-model run.",
        "",
        "Per model job, in the all-through-the-model run (median / p99, ms):",
        "",
        "| | median / p99 |",
        "|---|---:|",
        (f"| the backend called directly, one request at a time (baseline, {len(direct)} calls) | "
        f"{stats(direct)} |"),
        f"| the worker's time per job, result to result ({len(cycles):,} jobs) | {stats(cycles)} |",
        f"| Laya's overhead per job (that minus the backend's own time) | {stats(overhead)} |",
        "",
        ("The machine is shared with other work: the p99s carry its load (the backend's own 25 ms sleep took "
        "the p99 shown above)."),
        "",
        f"Target wall time ≤ {TARGET}× the all-through-the-model run: {met}.",
    ]
    run = (f"{args.lines:,} lines, {args.max_tokens} token(s) per answer: rules + cache {on_s:.1f} s, all through "
           f"the model {off_s:.1f} s, ratio {ratio:.3f}; overhead per model job {stats(overhead)} ms "
           f"(median / p99; backend alone {stats(direct)} ms); target {met}")
    write_results("batch.md", lines, run)


if __name__ == "__main__":
    main()
