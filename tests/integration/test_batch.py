"""`laya batch` as a user runs it: a real Valkey, router and worker, and `python -m laya batch` processes
that are interrupted (Ctrl-C), killed (SIGKILL) and resumed.

What is counted, and where: every XADD to the ingress stream (the stream's
``entries-added``, which deleting routed entries does not lower), and every
execution of an RQ job (RQ keeps one result per execution), so a line sent
twice or a model job run twice cannot hide.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from redis import Redis
from rq.job import Job

from ..conftest import Server
from ..processes import start_laya, stop_laya

HELLO_LINES = 120
MODEL_LINES = 240


def laya_env(server: Server, model: Path, routes: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LAYA_REDIS_URL": server.url, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes),
            "LAYA_ROUTER__BLOCK_MS": "100", **extra}


@pytest.fixture
def stack(redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path
          ) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A router and a worker; the queue bound is far above any window, so nothing is refused as overloaded."""
    env = laya_env(redis_server, endless_model, routes_file, LAYA_ROUTER__MAX_QUEUE_DEPTH="100000")
    procs = {"router": start_laya("router", env), "worker": start_laya("worker", env)}
    yield procs
    procs["worker"].send_signal(signal.SIGCONT)  # a test that failed while the worker was stopped
    stop_laya(*procs.values())


def write_input(path: Path) -> dict[int, dict[str, object] | str]:
    """Greetings a rule answers, model prompts, one line with an id of its own, one line that is not JSON."""
    lines: dict[int, dict[str, object] | str] = {}
    for number in range(1, HELLO_LINES + MODEL_LINES + 1):
        if number % 3 == 0:
            lines[number] = "hello"
        else:
            lines[number] = {"prompt": f"Tell story number {number}", "max_tokens": 120, "cache": False}
    lines[7] = {"id": "order-7", "prompt": "Tell the story of order 7", "max_tokens": 120}
    body = b"".join(orjson.dumps(v) + b"\n" for v in lines.values())
    path.write_bytes(body + b"this line is not JSON\n")
    return lines


def start_batch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def sent(redis: Redis) -> int:
    """Requests ever XADDed to the ingress stream."""
    return int(redis.xinfo_stream("laya:ingress")["entries-added"])


def test_an_interrupted_and_killed_batch_resumes_with_every_line_answered_once(
        redis: Redis, redis_server: Server, stack: dict[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = write_input(source)
    total = len(lines) + 1
    env = {**os.environ, "LAYA_REDIS_URL": redis_server.url}
    first = [sys.executable, "-m", "laya", "batch", str(source), "-o", str(out)]

    # 1. Ctrl-C: the run says how far it got and prints the command that continues it. The worker is
    # stopped, so the run cannot finish first on a busy machine: rules answer, model jobs wait.
    stack["worker"].send_signal(signal.SIGSTOP)
    run = start_batch(first, env, tmp_path / "run1.log")
    wait_for(lambda: line_count(out) >= 20, "the first results")
    run.send_signal(signal.SIGINT)
    assert run.wait(30) == 130
    stack["worker"].send_signal(signal.SIGCONT)
    said = (tmp_path / "run1.log").read_text().strip().splitlines()[-1]
    assert said.startswith("laya batch: interrupted. "), said
    assert re.search(rf"\d+ of {total} lines are in {re.escape(str(out))}", said), said
    command = said.split("To continue: ", 1)[1]
    assert shlex.split(command) == [*first, "--resume"]

    # 2. That command, killed with SIGKILL while the (stopped) worker holds model jobs queued.
    before = line_count(out)
    run = start_batch(shlex.split(command), env, tmp_path / "run2.log")
    wait_for(lambda: line_count(out) >= before + 30, "the resumed run's results")
    stack["worker"].send_signal(signal.SIGSTOP)
    time.sleep(1.0)  # the window fills with model jobs that cannot run
    run.send_signal(signal.SIGKILL)
    run.wait(30)
    # A crash in the middle of a write leaves the last record cut short.
    data = out.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    torn_line = orjson.loads(last)["line"]
    out.write_bytes(data[:len(data) - len(last) // 2 - 1])
    assert not out.read_bytes().endswith(b"\n")

    # 3. Resumed again: the queued jobs are waited for (not sent again) once the worker goes on.
    run = start_batch(shlex.split(command), env, tmp_path / "run3.log")
    wait_for(lambda: "to send" in (tmp_path / "run3.log").read_text(), "the last run to look for its requests")
    stack["worker"].send_signal(signal.SIGCONT)
    assert run.wait(120) == 1  # one line is not JSON: non-zero, after the summary
    said = (tmp_path / "run3.log").read_text()
    assert "in flight from an earlier run, waited for" in said, said
    assert "a torn last line in the results file, redone" in said, said
    assert "1 lines failed" in said and f"{total} lines in" in said, said

    got = records(out)
    assert [r["line"] for r in got] == list(range(1, total + 1))  # each line once, in input order
    assert got[torn_line - 1]["ok"], got[torn_line - 1]
    assert got[6]["id"] == "order-7" and got[6]["route"] == "model:default"
    assert got[-1]["route"] == "error:invalid_json"
    routes = [r["route"] for r in got[:-1]]
    assert routes == ["rule:greeting" if lines[n] == "hello" else "model:default" for n in range(1, total)]
    # Nothing sent twice, no model job run twice.
    assert sent(redis) == total - 1
    model_ids = [str(r["id"]) for r in got if r["route"] == "model:default"]
    jobs = Job.fetch_many(model_ids, connection=redis, serializer="json")
    runs = {job.id: len(job.results()) for job in jobs if job is not None}
    assert len(runs) == MODEL_LINES and set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    assert {job.origin for job in jobs if job is not None} == {"laya:llm:default:bulk"}  # a batch's default lane

    # A new run of the same file asks nothing again: the same line of the same file is the same request.
    again = subprocess.run([*first[:-1], str(tmp_path / "again.jsonl")], env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert again.returncode == 1, again.stderr
    assert f"{total - 1} answered before this run" in again.stdout
    assert sent(redis) == total - 1
    assert [r.get("text") for r in records(tmp_path / "again.jsonl")] == [r.get("text") for r in got]


def run_batch_against_bound(redis_server: Server, model: Path, routes: Path, tmp_path: Path, *, bound: int,
                            told: int, published: bool = True) -> tuple[subprocess.CompletedProcess[str], Path, int]:
    """200 model lines through a router whose queue bound is ``bound``, by a batch whose config says ``told``.
    Without ``published`` the batch does not learn the router's bound (as from a router older than that).

    Returns the finished batch, its results file and how many lines it resubmitted after overload."""
    env = laya_env(redis_server, model, routes, LAYA_ROUTER__MAX_QUEUE_DEPTH=str(bound),
                   LAYA_ROUTER__RETRY_AFTER_S="0.2")
    procs = [start_laya("router", env), start_laya("worker", env)]
    redis = redis_server.client()
    deadline = time.monotonic() + 30
    while not redis.exists("laya:router:admission"):
        assert time.monotonic() < deadline, "the router never said its queue bound"
        time.sleep(0.05)
    if not published:
        redis.delete("laya:router:admission")
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(b'{"prompt": "Tell story %d", "max_tokens": 60, "cache": false}\n' % i
                                for i in range(200)))
    try:
        done = subprocess.run([sys.executable, "-m", "laya", "batch", str(source), "-o", str(out)],
                              env={**env, "LAYA_ROUTER__MAX_QUEUE_DEPTH": str(told)}, capture_output=True,
                              text=True, timeout=300, check=False)
    finally:
        stop_laya(*procs)
    assert done.returncode == 0, done.stderr
    assert [r["route"] for r in records(out)] == ["model:default"] * 200
    found = re.search(r"; (\d+) resubmitted after overload", done.stdout)
    assert found is not None, done.stdout
    return done, out, int(found[1])


def test_a_default_window_is_rarely_refused_and_every_line_is_answered(
        redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """The window starts at a quarter of the queue bound and grows only up to it, so a run that could
    overflow the queue many times over resubmits few of its lines."""
    done, _, resubmitted = run_batch_against_bound(redis_server, endless_model, routes_file, tmp_path, bound=8,
                                                   told=8)
    assert resubmitted <= 10, done.stdout  # 5 %
    assert sent(redis) == 200 + resubmitted


def test_a_batch_configured_for_another_bound_sizes_itself_by_the_router_s(
        redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """`laya batch` without the `-c` that `laya up` runs with: its config says 256, the router admits 8. The
    batch reads the router's bound, so it is refused as rarely as one configured alike (the README's quick start
    ran into a 30 s hold on its first refusal)."""
    done, _, resubmitted = run_batch_against_bound(redis_server, endless_model, routes_file, tmp_path, bound=8,
                                                   told=256)
    assert resubmitted <= 10, done.stdout
    assert sent(redis) == 200 + resubmitted


def test_a_window_too_big_for_the_router_backs_off(
        redis: Redis, redis_server: Server, endless_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """A batch configured for a bound of 256 against a router that admits 8 and does not say so: refusals halve
    its window and hold its sends for the retry-after, so it settles near what the router admits instead of
    resending most of its lines round after round."""
    done, _, resubmitted = run_batch_against_bound(redis_server, endless_model, routes_file, tmp_path, bound=8,
                                                   told=256, published=False)
    # Halving from 64 refuses under 64 + 32 + 16 + 8 lines on the way down, then about one per regrowth;
    # a window that does not back off resends thousands.
    assert 0 < resubmitted <= 150, done.stdout
    assert sent(redis) == 200 + resubmitted


def test_a_batch_that_loses_its_server_says_so_in_one_line_with_the_command_that_continues_it(
        tmp_path: Path) -> None:
    server = Server(tmp_path / "valkey").start()
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b'"hello"\n' * 10)
    watcher = server.client()
    try:
        run = subprocess.Popen([sys.executable, "-m", "laya", "batch", str(source), "-o", str(out)],
                               env={**os.environ, "LAYA_REDIS_URL": server.url}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        # No router runs: the requests wait in the stream, and the batch on its reply channel.
        wait_for(lambda: any(c.get("cmd") == "blpop" for c in watcher.client_list()), "the batch to wait")
    finally:
        watcher.close()
        server.kill()
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 2
    assert len(stderr.splitlines()) == 1, stderr
    said = stderr.strip()
    assert said.startswith(f"laya batch: connection to {server.url} failed while waiting for results"), said
    assert said.endswith(f"0 of 10 lines are in {out}; its 10 requests in flight will still be answered and are "
                         f"collected then. To continue: {sys.executable} -m laya batch {source} -o {out} --resume")


@pytest.mark.parametrize(("written", "bound"), [(None, None), (b"8", 8), (b"eight", None), (b"0", None), (b"-3", None)])
def test_the_queue_bound_is_what_a_router_wrote_or_none(redis: Redis, written: bytes | None,
                                                        bound: int | None) -> None:
    # None sends `laya batch` back to its own config; a value no router writes must not end the batch.
    from laya.client import Client

    if written is not None:
        redis.hset("laya:router:admission", "max_queue_depth", written)
    assert Client(redis).queue_bound() == bound
