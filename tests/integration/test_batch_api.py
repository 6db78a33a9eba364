"""`/v1/batches` through the official `openai` package: a real `laya serve`, router, worker (tiny model) and Valkey."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest

from tests.conftest import Server, free_port
from tests.integration.test_http import Door, _env, _running


@pytest.fixture
def door(redis_server: Server, tiny_model: Path, routes_file: Path, tmp_path: Path) -> Iterator[Door]:
    port = free_port()
    env = _env(redis_server.url, f"batches{port}", port, tiny_model, routes_file,
               LAYA_HTTP__FILES_DIR=str(tmp_path / "files"))
    yield from _running(redis_server, env, port, f"batches{port}", tmp_path, ("router", "worker"))


def line(custom_id: str, content: str, **body: object) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "default", "messages": [{"role": "user", "content": content}], **body}})


def upload(client: openai.OpenAI, lines: list[bytes]) -> str:
    return client.files.create(file=("input.jsonl", b"\n".join(lines) + b"\n"), purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, states: tuple[str, ...], timeout: float = 90) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in states:
        assert time.monotonic() < deadline, f"batch still {batch.status} after {timeout:g} s"
        time.sleep(0.2)
    return batch


def jsonl(data: bytes) -> list[dict[str, object]]:
    return [orjson.loads(raw) for raw in data.splitlines() if raw.strip()]


def test_a_batch_runs_to_output_and_error_files_in_openai_s_format(door: Door, redis_server: Server) -> None:
    client = door.client()
    file_id = upload(client, [
        line("greet-1", "hello"),
        line("model-1", "jello", max_tokens=4),
        line("greet-2", "hi"),
        b"{not json",
        line("greet-1", "hello again"),  # a custom_id used twice
        orjson.dumps({"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions", "body": {}}),
        line("bad-body", "hello", temperature=9),
    ])
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                    metadata={"pipeline": "nightly"})
    assert created.id.startswith("batch_") and created.status == "validating"
    assert created.metadata == {"pipeline": "nightly"} and created.input_file_id == file_id
    done = wait_for(client, created.id, ("completed", "failed"))
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 3, 4)
    assert done.in_progress_at and done.finalizing_at and done.completed_at

    assert done.output_file_id is not None and done.error_file_id is not None
    output = {r["custom_id"]: r for r in jsonl(client.files.content(done.output_file_id).read())}
    assert set(output) == {"greet-1", "model-1", "greet-2"}
    for record in output.values():
        response = record["response"]
        assert isinstance(response, dict) and response["status_code"] == 200 and record["error"] is None
        assert response["body"]["object"] == "chat.completion" and response["body"]["choices"][0]["message"]["content"]
    assert output["greet-1"]["response"]["body"]["choices"][0]["message"]["content"] == "Hello!"  # type: ignore[index]
    assert output["model-1"]["response"]["body"]["usage"]["completion_tokens"] == 4  # type: ignore[index]

    errors = jsonl(client.files.content(done.error_file_id).read())
    by_line = {e["error"]["line"]: e for e in errors if e["error"]}  # type: ignore[index]
    assert sorted(by_line) == [4, 5, 6, 7]
    assert by_line[4]["error"]["code"] == "invalid_json"  # type: ignore[index]
    assert by_line[5]["error"]["code"] == "duplicate_custom_id" and by_line[5]["custom_id"] == "greet-1"  # type: ignore[index]
    assert by_line[6]["error"]["param"] == "url" and "/v1/chat/completions" in by_line[6]["error"]["message"]  # type: ignore[index]
    assert by_line[7]["error"]["param"] == "body.temperature"  # type: ignore[index]

    assert created.id in [b.id for b in client.batches.list().data]
    metrics = httpx.get(f"{door.url}/metrics").text
    assert 'laya_batch_lines_total{state="completed"} 3.0' in metrics
    assert 'laya_batch_lines_total{state="failed"} 4.0' in metrics
    stats = subprocess.run([sys.executable, "-m", "laya", "stats"], env={**os.environ, "LAYA_REDIS_URL": redis_server.url,
                           "LAYA_REDIS__PREFIX": door.prefix}, capture_output=True, text=True, check=True).stdout
    assert created.id in stats and "completed" in stats
    assert client.batches.cancel(created.id).status == "completed"  # nothing left to cancel
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"


def test_refused_batches_name_the_field(door: Door) -> None:
    client = door.client(max_retries=0)
    file_id = upload(client, [line("a", "hello")])
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert caught.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-0123456789abcdef01234567", endpoint="/v1/chat/completions",
                              completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_0123456789abcdef01234567")


def test_a_cancelled_batch_stops_and_keeps_the_answers_it_had(door: Door) -> None:
    client = door.client()
    file_id = upload(client, [line(f"r{i}", f"story {i} z", max_tokens=200) for i in range(300)])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (seen := client.batches.retrieve(batch.id)).request_counts is None or seen.request_counts.completed == 0:
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_for(client, batch.id, ("cancelled",))
    assert done.cancelled_at and done.request_counts is not None
    assert 0 < done.request_counts.completed < 300
    assert done.output_file_id is not None
    answered = jsonl(client.files.content(done.output_file_id).read())
    assert len(answered) == done.request_counts.completed


def test_a_batch_whose_laya_serve_was_killed_is_finished_by_the_next_with_each_line_once(
        redis_server: Server, tiny_model: Path, routes_file: Path, tmp_path: Path) -> None:
    """SIGKILL the `laya serve` running a batch mid-way; another one, on the same Redis and files directory, takes
    it over once the lease runs out and resumes it: every custom_id in the output exactly once, none sent twice."""
    import signal

    from tests.integration.test_http import _wait_for_port
    from tests.processes import start_laya, stop_laya

    port = free_port()
    env = _env(redis_server.url, f"resume{port}", port, tiny_model, routes_file,
               LAYA_HTTP__FILES_DIR=str(tmp_path / "files"))
    procs = [start_laya(role, env, tmp_path / f"{role}.log") for role in ("router", "worker", "serve")]
    try:
        _wait_for_port(port, procs[-1])
        client = Door(f"http://127.0.0.1:{port}", redis_server.client(), f"resume{port}").client()
        file_id = upload(client, [line(f"r{i}", f"story {i} z", max_tokens=100) for i in range(200)])
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        deadline = time.monotonic() + 60
        while (seen := client.batches.retrieve(batch.id)).request_counts is None or \
                seen.request_counts.completed < 20:
            assert time.monotonic() < deadline, seen
            time.sleep(0.1)
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait()
        procs[-1] = start_laya("serve", env, tmp_path / "serve-2.log")
        _wait_for_port(port, procs[-1])
        done = wait_for(client, batch.id, ("completed",), timeout=150)
        assert done.output_file_id is not None and done.request_counts is not None
        output = jsonl(client.files.content(done.output_file_id).read())
        redis = redis_server.client()
        sent = redis.xinfo_stream(f"resume{port}:ingress")["entries-added"]
    finally:
        stop_laya(*procs)
    assert sorted(r["custom_id"] for r in output) == sorted(f"r{i}" for i in range(200))  # type: ignore[type-var]
    assert done.request_counts.completed == 200 and done.request_counts.failed == 0
    assert sent == 200, f"{sent} requests sent for 200 lines"
    assert "batch " in (tmp_path / "serve-2.log").read_text() and "running it" in (tmp_path / "serve-2.log").read_text()


def test_a_2000_line_batch_mostly_rules_and_cache_answers_every_line_once(door: Door) -> None:
    """70 % of the lines are answered by rules or the cache without the model; each line is in the output once."""
    client = door.client()
    cached = {"max_tokens": 4}
    client.chat.completions.create(model="default", messages=[{"role": "user", "content": "jello z"}], **cached)
    lines = []
    for i in range(2000):
        if i % 10 < 5:
            lines.append(line(f"r{i}", ["hello", "ping", "opening hours please"][i % 3]))
        elif i % 10 < 7:
            lines.append(line(f"r{i}", "jello z", **cached))
        else:
            lines.append(line(f"r{i}", f"story {i} z", max_tokens=4))
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait_for(client, batch.id, ("completed",), timeout=240)
    assert done.output_file_id is not None and done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (2000, 2000, 0)
    output = jsonl(client.files.content(done.output_file_id).read())
    assert sorted(str(r["custom_id"]) for r in output) == sorted(f"r{i}" for i in range(2000))
    routes = [str(r["response"]["body"]["laya"]["route"]) for r in output]  # type: ignore[index]
    without_model = sum(route.startswith(("rule:", "cache")) for route in routes)
    assert without_model == 1400, sorted(set(routes))[:10]


def test_a_batch_past_its_completion_window_expires_with_what_it_had(door: Door) -> None:
    """The window's end stops the run: the answers so far in the output, every line not run in the error file as
    batch_expired (the window is moved into the past here: the shortest one can ask for is an hour)."""
    client = door.client()
    file_id = upload(client, [line(f"r{i}", f"story {i} z", max_tokens=200) for i in range(300)])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")
    assert batch.expires_at == batch.created_at + 3600
    deadline = time.monotonic() + 60
    while (seen := client.batches.retrieve(batch.id)).request_counts is None or seen.request_counts.completed == 0:
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    key = f"{door.prefix}:batch:{batch.id}"
    door.redis.eval("local r = cjson.decode(redis.call('GET', KEYS[1])) r['expires_at'] = tonumber(ARGV[1]) "
                    "redis.call('SET', KEYS[1], cjson.encode(r))", 1, key, int(time.time()) - 1)
    done = wait_for(client, batch.id, ("expired",))
    assert done.expired_at and done.request_counts is not None and done.output_file_id and done.error_file_id
    answered = jsonl(client.files.content(done.output_file_id).read())
    expired = jsonl(client.files.content(done.error_file_id).read())
    assert 0 < len(answered) < 300 and len(answered) + len(expired) == 300
    assert {e["error"]["code"] for e in expired} == {"batch_expired"}  # type: ignore[index]
    assert {str(r["custom_id"]) for r in answered + expired} == {f"r{i}" for i in range(300)}


def test_laya_up_killed_mid_batch_and_started_again_finishes_it_with_each_line_once(
        tmp_path: Path, tiny_model: Path) -> None:
    """SIGKILL `laya up` itself (its router, worker, front door and Valkey go with it) mid-batch, then start it again
    on the same data: the batch ends with every custom_id in the output once."""
    import re
    import signal

    from tests.integration.test_supervisor import Up, write_config

    valkey_port = free_port()
    write_config(tmp_path, valkey_port, tiny_model)
    http_port = int(re.search(r"\[http\]\nport = (\d+)", (tmp_path / "laya.toml").read_text()).group(1))  # type: ignore[union-attr]
    first = Up(tmp_path, name="up-1")
    second = None
    try:
        first.wait_for("laya is up")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="none")
        file_id = upload(client, [line(f"r{i}", f"story {i} z", max_tokens=100) for i in range(200)])
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while (seen := client.batches.retrieve(batch.id)).request_counts is None or \
                seen.request_counts.completed < 20:
            assert time.monotonic() < deadline, seen
            time.sleep(0.1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        time.sleep(2)  # its children see it gone and stop (Valkey saves its data)
        second = Up(tmp_path, name="up-2")
        second.wait_for("laya is up", timeout=90)
        done = wait_for(client, batch.id, ("completed",), timeout=150)
        assert done.output_file_id is not None and done.request_counts is not None
        output = jsonl(client.files.content(done.output_file_id).read())
    finally:
        for up in (second, first):
            if up is not None:
                up.close()
    assert sorted(str(r["custom_id"]) for r in output) == sorted(f"r{i}" for i in range(200))
    assert done.request_counts.completed == 200 and done.request_counts.failed == 0


def test_with_two_laya_serve_one_runs_a_batch(redis_server: Server, tiny_model: Path, routes_file: Path,
                                              tmp_path: Path) -> None:
    """Two front doors on one Redis and one files directory: the batch's lease lets exactly one of them run it."""
    from tests.integration.test_http import _wait_for_port
    from tests.processes import start_laya, stop_laya

    ports = [free_port(), free_port()]
    prefix = f"two{ports[0]}"
    envs = [_env(redis_server.url, prefix, port, tiny_model, routes_file, LAYA_HTTP__FILES_DIR=str(tmp_path / "files"))
            for port in ports]
    procs = [start_laya("router", envs[0], tmp_path / "router.log"), start_laya("worker", envs[0], tmp_path / "w.log")]
    procs += [start_laya("serve", env, tmp_path / f"serve-{i}.log") for i, env in enumerate(envs)]
    try:
        for port, proc in zip(ports, procs[2:], strict=True):
            _wait_for_port(port, proc)
        first, second = (Door(f"http://127.0.0.1:{port}", redis_server.client(), prefix).client() for port in ports)
        file_id = upload(first, [line(f"r{i}", f"story {i} z", max_tokens=8) for i in range(100)])
        # Created on the second door: both look for it, the second at once, the first within a second.
        batch = second.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(first, batch.id, ("completed",))
        sent = redis_server.client().xinfo_stream(f"{prefix}:ingress")["entries-added"]
    finally:
        stop_laya(*procs)
    assert done.request_counts is not None and done.request_counts.completed == 100
    runs = [(tmp_path / f"serve-{i}.log").read_text().count(f"batch {batch.id}: running it") for i in range(2)]
    assert sorted(runs) == [0, 1], runs
    assert sent == 100
