"""Crashes with real processes and real servers: SIGKILL, not polite shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue, Worker
from rq.job import Job

from laya.client import Client
from laya.config import Settings
from laya.keys import Keys
from laya.router.ingress import Router
from laya.router.reaper import Reaper
from laya.schema import Result
from laya.worker.backend import LlamaBackend
from laya.worker.rqworker import LayaWorker, _StopSignal, run_worker

from ..conftest import Server
from ..processes import start_laya, stop_laya

FAST_FAILOVER = {"LAYA_ROUTER__CLAIM_IDLE_MS": "500", "LAYA_ROUTER__BLOCK_MS": "100",
                 "LAYA_ROUTER__REAP_INTERVAL_S": "0.3", "LAYA_RUNTIME__HEARTBEAT_TTL_S": "5",
                 "LAYA_RUNTIME__HEARTBEAT_INTERVAL_S": "0.5", "LAYA_RUNTIME__MAX_SEQ_LEN": "65536",
                 "LAYA_RUNTIME__MAX_TOKENS_LIMIT": "60000", "LAYA_ROUTER__MAX_QUEUE_DEPTH": "100000"}


def spawn(role: str, url: str, model: Path, routes: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes),
           **FAST_FAILOVER, **extra}
    return start_laya(role, env)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def collect(client: Client, ids: list[str], channel: str, timeout: float) -> dict[str, list[Result]]:
    """Every result pushed to the channel, per id (to count duplicates), until all ids answered."""
    seen: dict[str, list[Result]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(ids):
        assert time.monotonic() < deadline, f"{len(ids) - len(seen)} of {len(ids)} requests never answered"
        for result in client.poll_channel(channel, timeout=0.5):
            seen.setdefault(result.id, []).append(result)
    for result in client.poll_channel(channel, timeout=0.5):  # late duplicates, if any
        seen.setdefault(result.id, []).append(result)
    return seen


def test_router_killed_mid_stream_loses_nothing(redis: Redis, redis_server: Server, tiny_model: Path,
                                                routes_file: Path) -> None:
    client = Client(redis)
    channel = client.new_channel()
    worker = spawn("worker", redis_server.url, tiny_model, routes_file)
    first = spawn("router", redis_server.url, tiny_model, routes_file)
    second = None
    try:
        prompts = [["hello", "ping", f"job {i} z", "opening hours please"][i % 4] for i in range(3000)]
        ids = client.submit_many(({"prompt": p, "max_tokens": 8} for p in prompts), reply_to=channel)
        wait_for(lambda: redis.exists("laya:stats:router"), 20, "the first router")
        time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert redis.xlen("laya:ingress") > 0, "the router finished before it was killed; nothing was tested"
        second = spawn("router", redis_server.url, tiny_model, routes_file)
        seen = collect(client, ids, channel, timeout=90)
    finally:
        stop_laya(*(p for p in (first, second, worker) if p is not None))
    assert set(seen) == set(ids)
    assert all(len(results) == 1 for results in seen.values()), "a request was answered twice"
    assert {r[0].kind for r in seen.values()} == {"rule", "model"}


def test_entries_of_a_router_that_died_after_reading_are_reclaimed(redis: Redis, redis_server: Server,
                                                                   tiny_model: Path, routes_file: Path) -> None:
    client = Client(redis)
    redis.xgroup_create("laya:ingress", "routers", id="0", mkstream=True)
    ids = [client.submit("hello") for _ in range(20)]
    # What a router killed between its read and its commit leaves behind: delivered, never acknowledged.
    taken = redis.xreadgroup("routers", "dead-router", {"laya:ingress": ">"}, count=100)
    assert len(taken[0][1]) == 20
    router = spawn("router", redis_server.url, tiny_model, routes_file)
    try:
        results = [client.wait(i, timeout=30) for i in ids]
    finally:
        stop_laya(router)
    assert all(r.route == "rule:greeting" for r in results)
    assert redis.xpending("laya:ingress", "routers")["pending"] == 0


@pytest.mark.parametrize("retries", [0, 1])
def test_worker_killed_mid_generation(redis: Redis, redis_server: Server, endless_model: Path,
                                      routes_file: Path, retries: int) -> None:
    client = Client(redis)
    extra = {"LAYA_RUNTIME__JOB_RETRIES": str(retries)}
    router = spawn("router", redis_server.url, endless_model, routes_file, **extra)
    worker = spawn("worker", redis_server.url, endless_model, routes_file, **extra)
    replacement = None
    try:
        request_id = client.submit("tell me everything", max_tokens=6000, cache=False)
        wait_for(lambda: redis.exists(f"laya:lock:{request_id}"), 30, "the job to start")
        time.sleep(0.3)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        killed_at = time.monotonic()
        if retries:
            replacement = spawn("worker", redis_server.url, endless_model, routes_file, **extra)
        result = client.wait(request_id, timeout=120)
        elapsed = time.monotonic() - killed_at
    finally:
        stop_laya(*(p for p in (router, worker, replacement) if p is not None))
    job = Queue("laya:llm:default:normal", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None
    if retries:
        assert result.route == "model:default" and result.usage.completion_tokens == 6000
        # The retry happened: the reaper spent it, and the replacement worker ran the job.
        assert replacement is not None and job.retries_left == 0 and job.get_status() == "finished"
        assert job.worker_name is not None and job.worker_name.endswith(f"-{replacement.pid}")
    else:
        assert result.route == "error:worker_lost" and "heartbeats" in result.error.message  # type: ignore[union-attr]
        assert elapsed < 15  # heartbeat_ttl_s 5 + reap interval, not RQ's timeout + 60 s
        assert job.get_status() == "failed"


def spawn_with_default_heartbeats(role: str, url: str, model: Path, routes: Path, log: Path) -> subprocess.Popen[bytes]:
    """A process as on another host, with the heartbeat, reaper and claim defaults (only sizes raised)."""
    env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes),
           "LAYA_RUNTIME__MAX_SEQ_LEN": "65536", "LAYA_RUNTIME__MAX_TOKENS_LIMIT": "60000"}
    return start_laya(role, env, log)


def holder_pid(redis: Redis, request_id: str) -> int | None:
    """The pid of the worker holding a request's lock (worker names end in their pid)."""
    holder = redis.get(f"laya:lock:{request_id}")
    return int(holder.rsplit(b"-", 1)[1]) if holder else None


def two_workers_on_a_long_job(redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path,
                              tmp_path: Path) -> tuple[list[subprocess.Popen[bytes]], str, str]:
    """A router, two workers, and one 6,000-token job running on one of them: the processes, the request
    id and the reply channel."""
    procs = [spawn_with_default_heartbeats(role, redis_server.url, endless_model, routes_file, tmp_path / f"{i}.log")
             for i, role in enumerate(("router", "worker", "worker"))]
    wait_for(lambda: len(Worker.all(connection=redis)) == 2, 30, "two workers")
    client = Client(redis)
    channel = client.new_channel()
    request_id = client.submit("tell me everything", max_tokens=6000, cache=False, reply_to=channel)
    wait_for(lambda: holder_pid(redis, request_id), 30, "the job to start")
    time.sleep(0.5)
    return procs, request_id, channel


def test_a_worker_killed_without_a_supervisor_has_its_job_started_again_within_the_heartbeat_ttl(
        redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """No `laya up`: only the job's heartbeats (runtime.heartbeat_ttl_s) and a router's reaper
    (router.reap_interval_s) bring the job back, at their defaults."""
    settings = Settings()
    procs, request_id, channel = two_workers_on_a_long_job(redis, redis_server, endless_model, routes_file, tmp_path)
    try:
        victim = holder_pid(redis, request_id)
        [dead] = [p for p in procs if p.pid == victim]
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        killed = time.monotonic()
        wait_for(lambda: holder_pid(redis, request_id) not in (None, victim), 30, "the other worker to take the job")
        restarted = time.monotonic() - killed
        seen = collect(Client(redis), [request_id], channel, timeout=120)
    finally:
        stop_laya(*procs)
    # Killed between two beats: at most the TTL since the last one, and one reaping pass (scores are whole
    # seconds, so up to a second more).
    bound = settings.runtime.heartbeat_ttl_s + settings.router.reap_interval_s + 1.0
    assert restarted < bound, f"started again {restarted:.1f} s after the kill (bound {bound:g} s)"
    [result] = seen[request_id]
    assert result.route == "model:default" and result.usage.completion_tokens == 6000  # type: ignore[union-attr]
    assert Job.fetch(request_id, connection=redis, serializer="json").retries_left == 0  # the kill cost its retry


def test_a_worker_that_was_only_stopped_past_its_ttl_does_not_answer_twice(
        redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """SIGSTOP past the heartbeat TTL looks like a death: the job runs again on the other worker. SIGCONT: the
    first attempt goes on, learns it lost the request's lock, and its answer is not pushed a second time."""
    settings = Settings()
    procs, request_id, channel = two_workers_on_a_long_job(redis, redis_server, endless_model, routes_file, tmp_path)
    try:
        slow = holder_pid(redis, request_id)
        assert slow is not None
        os.kill(slow, signal.SIGSTOP)
        try:
            wait_for(lambda: holder_pid(redis, request_id) not in (None, slow), 30, "the other worker to take the job")
            time.sleep(1.0)
        finally:
            os.kill(slow, signal.SIGCONT)
        seen = collect(Client(redis), [request_id], channel, timeout=120)
        # Both attempts end: the first is not cut off when it learns the lock is gone, it only finishes.
        wait_for(lambda: all(w.get_state() == "idle" for w in Worker.all(connection=redis)), 120,
                 "both workers to finish")
        time.sleep(settings.runtime.heartbeat_interval_s)
        seen = {k: v + [r for r in Client(redis).poll_channel(channel, timeout=0.5) if r.id == k]
                for k, v in seen.items()}
    finally:
        stop_laya(*procs)
    logs = "".join((tmp_path / f"{i}.log").read_text(errors="replace") for i in (1, 2))
    assert len(seen[request_id]) == 1, f"answered {len(seen[request_id])} times"
    assert seen[request_id][0].usage.completion_tokens == 6000  # type: ignore[union-attr]
    assert "lost the lock on request" in logs
    assert "kept the first one" in logs  # the later of the two attempts wrote no second answer


def test_a_redis_stall_longer_than_the_heartbeat_ttl_is_not_a_dead_worker(
        tmp_path: Path, endless_model: Path, routes_file: Path) -> None:
    """Valkey frozen (SIGSTOP) past the heartbeat TTL: nobody could beat or reap meanwhile. Afterwards the router
    waits a whole TTL before it reaps, the worker beats again and takes back its request's lock, which expired:
    the job is neither run again nor charged a retry."""
    server = Server(tmp_path / "stalled").start()
    redis = server.client()
    settings = Settings()
    procs = [spawn_with_default_heartbeats(role, server.url, endless_model, routes_file, tmp_path / f"{role}.log")
             for role in ("router", "worker")]
    try:
        wait_for(lambda: len(Worker.all(connection=redis)) == 1, 30, "the worker")
        client = Client(redis)
        channel = client.new_channel()
        request_id = client.submit("tell me everything", max_tokens=16000, cache=False, reply_to=channel)
        wait_for(lambda: holder_pid(redis, request_id), 30, "the job to start")
        started = time.monotonic()
        valkey = int(redis.info("server")["process_id"])
        os.kill(valkey, signal.SIGSTOP)
        try:
            time.sleep(settings.runtime.heartbeat_ttl_s + 6)  # past the score of a beat sent in the stall
        finally:
            os.kill(valkey, signal.SIGCONT)
        resumed = time.monotonic() - started
        seen = collect(client, [request_id], channel, timeout=120)
        job = Job.fetch(request_id, connection=redis, serializer="json")
    finally:
        stop_laya(*procs)
        server.stop()
    [result] = seen[request_id]
    assert result.route == "model:default" and result.usage.completion_tokens == 16000  # type: ignore[union-attr]
    assert result.timings.generation_ms / 1000 > resumed, "the job ended in the stall: nothing was tested"
    assert job.retries_left == 1, "the stall was taken for a dead worker: the job was requeued"
    assert "lost the lock" not in (tmp_path / "worker.log").read_text(errors="replace")


def test_valkey_killed_and_restarted_with_aof_loses_no_accepted_request(tmp_path: Path, tiny_model: Path,
                                                                       routes_file: Path) -> None:
    server = Server(tmp_path / "aof", appendonly="yes", appendfsync="always").start()
    redis = server.client()
    client = Client(redis)
    router = spawn("router", server.url, tiny_model, routes_file)
    worker = spawn("worker", server.url, tiny_model, routes_file)
    try:
        client.ask("hello", timeout=30)
        wait_for(lambda: Worker.count(connection=redis) > 0, 30, "the worker")
        channel = client.new_channel()
        ids = client.submit_many(({"prompt": f"item {i} e", "max_tokens": 4} for i in range(300)), reply_to=channel)
        server.kill()  # SIGKILL, straight after the producer was told "accepted"
        time.sleep(0.5)
        server.start()
        answered = {r.id: r for r in client.wait_many(ids, channel, timeout=90)}
        assert set(answered) == set(ids)
        assert all(r.route == "model:default" and r.text == "fghijklmnopqrstuvwxyz"[:4] or r.kind == "cache"
                   for r in answered.values())
        assert router.poll() is None and worker.poll() is None, "a process died with the server"
    finally:
        stop_laya(router, worker)
        server.stop()


def test_duplicate_delivery_runs_once_and_answers_once(redis: Redis, redis_server: Server, endless_model: Path,
                                                       routes_file: Path, tmp_path: Path) -> None:
    client = Client(redis)
    channel = client.new_channel()
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    env = {**os.environ, **FAST_FAILOVER, "LAYA_REDIS_URL": redis_server.url, "LAYA_MODEL_PATH": str(endless_model)}
    workers = [start_laya("worker", env, log) for log in logs]
    router = spawn("router", redis_server.url, endless_model, routes_file)
    try:
        wait_for(lambda: Worker.count(connection=redis) == 2, 30, "two workers")
        request = {"id": "same-id", "prompt": "again and again", "max_tokens": 6000, "cache": False}
        client.submit_many([request], reply_to=channel)
        wait_for(lambda: redis.exists("laya:lock:same-id"), 30, "the first run")
        client.submit_many([request], reply_to=channel)  # the same request id delivered a second time
        seen = collect(client, ["same-id"], channel, timeout=120)
        time.sleep(1.0)
        seen["same-id"] += client.poll_channel(channel, timeout=1.0)
    finally:
        stop_laya(router, *workers)
    assert len(seen["same-id"]) == 1
    assert seen["same-id"][0].usage.completion_tokens == 6000
    text = "".join(log.read_text() for log in logs)
    # Which of the two guards stopped the second run depends on timing; test_worker.py checks each alone.
    assert "not running it twice" in text or "already has a result" in text


def test_overload_is_refused_early_and_the_batch_producer_resubmits(redis: Redis, redis_server: Server,
                                                                   endless_model: Path, routes_file: Path,
                                                                   tmp_path: Path) -> None:
    extra = {"LAYA_ROUTER__MAX_QUEUE_DEPTH": "4", "LAYA_ROUTER__RETRY_AFTER_S": "0.2"}
    router = spawn("router", redis_server.url, endless_model, routes_file, **extra)
    worker = spawn("worker", redis_server.url, endless_model, routes_file, **extra)
    lines = tmp_path / "burst.jsonl"
    lines.write_bytes(b"".join(b'{"prompt": "burst %d", "max_tokens": 500, "cache": false}\n' % i
                               for i in range(40)))
    depths: list[int] = []
    sampling = True

    def sample() -> None:
        while sampling:
            depths.append(int(redis.llen("rq:queue:laya:llm:default:bulk")))  # `laya batch` sends as bulk
            time.sleep(0.02)

    import threading

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out = tmp_path / "out.jsonl"
        done = subprocess.run([sys.executable, "-m", "laya", "batch", str(lines), "-o", str(out), "--window", "40"],
                              env={**os.environ, "LAYA_REDIS_URL": redis_server.url}, capture_output=True,
                              text=True, timeout=300, check=False)
    finally:
        sampling = False
        sampler.join()
        stop_laya(router, worker)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, 41))
    assert all(r["route"] == "model:default" for r in records)
    resubmitted = int(done.stdout.split(" resubmitted")[0].rsplit(";", 1)[1])
    assert resubmitted > 0
    assert 0 < max(depths) <= 4  # the lane filled, and never grew past its bound
    stats = redis.hgetall("laya:stats:router")
    assert int(stats[b"count:rejected:overloaded"]) == resubmitted


def test_a_job_whose_worker_died_before_starting_it_is_requeued(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    request_id, other_id = client.submit("a story", max_tokens=4), client.submit("another story", max_tokens=4)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    router.handle(router.read_batch())
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    ttl = settings.runtime.heartbeat_ttl_s
    # RQ dequeues by moving the id to an intermediate list, then marks the job started. A worker
    # SIGKILLed between the two leaves exactly this state (too narrow a window to hit with a real kill).
    redis.lmove(queue.key, queue.intermediate_queue.key, "LEFT", "LEFT")
    redis.lmove(queue.key, queue.intermediate_queue.key, "LEFT", "LEFT")
    assert queue.job_ids == []
    first_seen = queue.intermediate_queue.get_first_seen_key(request_id)
    # A sighting left from an earlier pass through the list (before a retry re-enqueued the job) is stale.
    redis.set(first_seen, time.time() - 3600)
    router.reaper.run_once()  # first sighting since enqueued: a live worker would start it within milliseconds
    assert queue.job_ids == [] and 0 < redis.ttl(first_seen) <= 86_400  # a sighting does not outlive a day
    router.reaper.run_once(now=time.time() + ttl - 1)  # seen again, but not for long enough
    assert queue.job_ids == []
    router.reaper.run_once(now=time.time() + ttl + 1)
    assert sorted(queue.job_ids) == sorted([request_id, other_id]) and queue.intermediate_queue.get_job_ids() == []
    assert not redis.exists(first_seen)
    # Taken again by a worker that dies; run_once() reads the clock itself (a reaper with a short wait).
    redis.lmove(queue.key, queue.intermediate_queue.key, "LEFT", "LEFT")
    quick = Reaper(router.queues, router.results, lock_key="laya:reaper", owner="quick", grace_s=0.3)
    quick.run_once()
    time.sleep(0.4)
    quick.run_once()
    assert sorted(queue.job_ids) == sorted([request_id, other_id])
    run_worker(settings, redis, burst=True, backend=LlamaBackend(settings))
    assert client.wait(request_id, timeout=5).route == "model:default"
    assert client.wait(other_id, timeout=5).route == "model:default"


def test_the_reaper_drops_ids_of_refused_or_deleted_jobs_and_leaves_a_running_one(settings: Settings,
                                                                                  redis: Redis) -> None:
    """A worker on one queue (``rq worker`` on one lane, say) dequeues by moving the id to the queue's
    intermediate list; a job it refused (not Laya's), or one deleted since, leaves its id there. The
    reaper drops such ids instead of queueing the job for another refusal, and leaves to their worker a
    running job's id and one taken a moment ago."""
    client = Client(redis)
    running_id, young_id = client.submit("a story", max_tokens=4), client.submit("another story", max_tokens=4)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    router.handle(router.read_batch())
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    intermediate = queue.intermediate_queue
    start_like_a_worker_that_then_dies(settings, redis)  # started, and its heartbeat has not run out
    redis.rpush(intermediate.key, running_id)
    redis.lmove(queue.key, intermediate.key, "LEFT", "RIGHT")
    redis.set(intermediate.get_first_seen_key(young_id), time.time())  # inside the grace
    queue.enqueue("os.getcwd", job_id="foreign")
    redis.lmove(queue.key, intermediate.key, "LEFT", "RIGHT")
    redis.rpush(intermediate.key, "gone")
    for job_id in ("foreign", "gone"):  # seen long ago: past any grace
        redis.set(intermediate.get_first_seen_key(job_id), time.time() - 3600)
    router.reaper.run_once()
    assert intermediate.get_job_ids() == [running_id, young_id] and queue.job_ids == []
    assert not redis.exists(intermediate.get_first_seen_key("foreign"), intermediate.get_first_seen_key("gone"))


def start_like_a_worker_that_then_dies(settings: Settings, redis: Redis, queue_name: str = "laya:llm:default:normal") -> Job:
    """Take the first job off the model queue and mark it started, as Laya's worker does right
    before it runs a job; a worker SIGKILLed during the job leaves exactly this behind (a real kill
    is the subprocess test above; this one runs in milliseconds)."""
    queue = Queue(queue_name, connection=redis, serializer="json")
    with _StopSignal() as stop:
        doomed = LayaWorker([queue], settings=settings, backend=LlamaBackend(settings), connection=redis,
                            stop=stop, name=f"doomed-{time.monotonic_ns()}")
    taken = doomed.dequeue_job_and_maintain_ttl(timeout=1)
    assert taken is not None
    job = taken[0]
    doomed.prepare_execution(job)
    doomed.prepare_job_execution(job, remove_from_intermediate_queue=True)
    return job


def test_the_reaper_requeues_a_lost_job_while_retries_last_then_answers_worker_lost(settings: Settings,
                                                                                    redis: Redis) -> None:
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(update={"job_retries": 1})})
    client = Client(redis)
    channel = client.new_channel()
    [request_id] = client.submit_many([{"prompt": "a story", "metadata": {"batch": "b7"}}], reply_to=channel)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    router.handle(router.read_batch())
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    ttl = settings.runtime.heartbeat_ttl_s
    start_like_a_worker_that_then_dies(settings, redis)
    bell = Keys("laya").bell("default")
    redis.delete(bell)  # the router rang it when it enqueued the job
    assert router.reaper.run_once(now=time.time() + ttl - 5) == 0  # its heartbeat has not run out yet
    assert queue.job_ids == [] and queue.started_job_registry.get_job_ids() != []
    redis.set("laya:reaper", "another-router", ex=60)
    assert router.reaper.run_once(now=time.time() + ttl + 5) == 0  # one reaper at a time
    assert queue.job_ids == [] and redis.get("laya:reaper") == b"another-router"
    redis.delete("laya:reaper")

    assert router.reaper.run_once(now=time.time() + ttl + 5) == 0  # requeued: a retry is left
    job = queue.fetch_job(request_id)
    assert queue.job_ids == [request_id] and job is not None and job.retries_left == 0
    assert client.result(request_id) is None and not redis.exists("laya:reaper")
    assert redis.llen(bell) == 1  # an idle worker wakes for the requeued job, not at its next rescan

    start_like_a_worker_that_then_dies(settings, redis)  # the retry's worker dies too
    reap = router.reaper._reap
    lock_ttls: list[int] = []

    def reap_and_look_at_the_lock(cutoff: float) -> int:
        lock_ttls.append(int(redis.ttl("laya:reaper")))
        return reap(cutoff)

    router.reaper._reap = reap_and_look_at_the_lock  # type: ignore[method-assign]
    assert router.reaper.run_once(now=time.time() + ttl + 5) == 1
    assert 0 < lock_ttls[0] <= 30  # a router that dies while reaping does not stop all reaping for good
    [result] = client.poll_channel(channel, timeout=1)
    assert result.id == request_id and result.route == "error:worker_lost" and result.ok is False
    assert result.model == "default" and result.finished_at is not None
    assert abs(result.finished_at - time.time()) < 60 and result.metadata == {"batch": "b7"}
    assert result.error is not None and result.error.message.startswith(
        "the worker running this request stopped sending heartbeats (killed, crashed or hung) on every "
        "attempt; check the worker logs")
    assert client.result(request_id) == result and queue.job_ids == []
    assert router.reaper.run_once(now=time.time() + ttl + 5) == 0  # reported once
    assert redis.llen(bell) == 1  # nothing to wake a worker for


def test_the_reaper_handles_every_lost_job_of_every_model_in_one_pass(settings: Settings, redis: Redis) -> None:
    settings = settings.model_copy(update={"router": settings.router.model_copy(update={"models": ["default", "big"]}),
                                           "runtime": settings.runtime.model_copy(update={"job_retries": 0})})
    client = Client(redis)
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    lost = [client.submit(f"story {i}", model="big", cache=False) for i in range(2)]
    router.handle(router.read_batch())
    settings_big = settings.model_copy(update={"model": settings.model.model_copy(update={"name": "big"})})
    jobs = [start_like_a_worker_that_then_dies(settings_big, redis, "laya:llm:big:normal") for _ in lost]
    assert {job.id for job in jobs} == set(lost)
    # The first queue ("default") has nothing lost; both jobs of the second are lost, with no retry left.
    assert router.reaper.run_once(now=time.time() + settings.runtime.heartbeat_ttl_s + 5) == 2
    answers = client.result_many([*lost, "never-sent"])
    assert [r.route if r else None for r in answers] == ["error:worker_lost", "error:worker_lost", None]


def test_a_worker_stops_on_sigterm_while_redis_is_down(tmp_path: Path, tiny_model: Path, routes_file: Path) -> None:
    server = Server(tmp_path / "down").start()
    worker = spawn("worker", server.url, tiny_model, routes_file)
    try:
        redis = server.client()
        wait_for(lambda: Worker.count(connection=redis) == 1, 30, "the worker")
        server.kill()
        time.sleep(1.5)  # the worker is now retrying its connection
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0  # not restarted by the loop that outlives Redis outages
    finally:
        stop_laya(worker)
        server.stop()


IN_PROCESS_WORKER = """
import logging, os, signal, sys
from laya.worker.backend import LlamaBackend
from laya.config import load_settings
from laya.connection import connect
from laya.worker.rqworker import LayaWorker, run_worker

if sys.argv[1] == "signal-during-start-up":
    register_birth = LayaWorker.register_birth

    def register_then_signal(self, *args, **kwargs):
        register_birth(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # before RQ has installed its own handlers

    LayaWorker.register_birth = register_then_signal
elif sys.argv[1] == "signal-after-rq-loop":
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from laya.worker.rqworker import _StopSignal

    def redis_times_out(self, *args, **kwargs):
        raise RedisTimeoutError("simulated")  # RQ's loop gives up and tears down

    pause = _StopSignal.sleep

    def signal_then_sleep(self, seconds):
        os.kill(os.getpid(), signal.SIGTERM)  # outside RQ's loop, before the next one starts
        pause(self, seconds)

    LayaWorker.dequeue_job_and_maintain_ttl = redis_times_out
    _StopSignal.sleep = signal_then_sleep
logging.basicConfig(level=logging.INFO)
settings = load_settings()
run_worker(settings, connect(settings, check=False), backend=LlamaBackend(settings))
"""


@dataclass
class ChildWorker:
    """``run_worker`` in a child process, its log lines collected as they come."""

    proc: subprocess.Popen[bytes]
    lines: list[str]
    reader: threading.Thread

    @classmethod
    def start(cls, url: str, model: Path, routes: Path, case: str) -> ChildWorker:
        env = {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes)}
        proc = subprocess.Popen([sys.executable, "-c", IN_PROCESS_WORKER, case], env=env, stderr=subprocess.PIPE)
        lines: list[str] = []
        assert proc.stderr is not None
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: lines.extend(line.decode(errors="replace") for line in stderr),
                                  daemon=True)
        reader.start()
        return cls(proc, lines, reader)

    def wait(self, timeout: float) -> int:
        """The exit code, once every line the process wrote has been read."""
        code = self.proc.wait(timeout)
        self.reader.join(timeout=5)
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)


def test_a_worker_that_cannot_reach_redis_keeps_trying_and_stops_on_sigterm(
        tmp_path: Path, tiny_model: Path, routes_file: Path) -> None:
    server = Server(tmp_path / "gone").start()
    server.stop()  # nothing listens on its port now: every start of RQ's loop fails
    worker = ChildWorker.start(server.url, tiny_model, routes_file, "plain")
    try:
        wait_for(lambda: worker.log.count("starting the worker loop again") >= 2, 30,
                 "two failed starts of the worker loop")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0, worker.log
    finally:
        stop_laya(worker.proc)


def test_a_signal_while_rq_starts_up_stops_the_worker(redis_server: Server, redis: Redis, tiny_model: Path,
                                                      routes_file: Path) -> None:
    worker = ChildWorker.start(redis_server.url, tiny_model, routes_file, "signal-during-start-up")
    try:
        assert worker.wait(timeout=15) == 0, worker.log  # not serving the queue until a second signal
        assert "got SIGTERM" in worker.log
    finally:
        stop_laya(worker.proc)


def test_a_signal_between_rq_loops_stops_the_worker(redis_server: Server, redis: Redis, tiny_model: Path,
                                                   routes_file: Path) -> None:
    worker = ChildWorker.start(redis_server.url, tiny_model, routes_file, "signal-after-rq-loop")
    try:
        assert worker.wait(timeout=15) == 0, worker.log  # RQ's handlers would raise StopRequested here
        assert "starting the worker loop again" in worker.log and "got SIGTERM" in worker.log
    finally:
        stop_laya(worker.proc)
