"""Real processes: `laya router` and `laya worker` as subprocesses, a real Valkey, the real `rq info`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import orjson
import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from laya.client import Client
from laya.codec import FIELD
from laya.worker.tinymodel import expected_completion

from ..conftest import Server, free_port
from ..processes import start_laya, stop_laya

BIN = Path(sys.executable).parent


def laya_env(url: str, model: Path, routes: Path) -> dict[str, str]:
    return {**os.environ, "LAYA_REDIS_URL": url, "LAYA_MODEL_PATH": str(model), "LAYA_ROUTES": str(routes),
            "LAYA_ROUTER__BLOCK_MS": "100"}


@pytest.fixture
def processes(redis: Redis, redis_server: Server, tiny_model: Path,
              routes_file: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    env = laya_env(redis_server.url, tiny_model, routes_file)
    procs = {role: start_laya(role, env) for role in ("router", "worker")}
    yield procs
    stop_laya(*procs.values())


def test_mixed_traffic_through_real_processes(redis: Redis, redis_server: Server,
                                              processes: dict[str, subprocess.Popen[bytes]]) -> None:
    client = Client(redis)
    expected: dict[str, tuple[str, str | None]] = {}
    for i in range(40):
        expected[client.submit(["hello", "hi", "ping", "our opening hours please"][i % 4])] = (
            "rule", ["Hello!", "Hello!", None, "9 to 5"][i % 4])
    model_prompts = [f"job {i} ends in letter {chr(ord('a') + i % 26)}" for i in range(30)]
    for prompt in model_prompts:
        expected[client.submit(prompt, max_tokens=30)] = ("model", expected_completion(prompt, 30))
    deadline = time.monotonic() + 60
    while redis.llen("rq:queue:laya:llm:default:normal") or redis.xlen("laya:ingress"):
        assert time.monotonic() < deadline, "the worker did not drain its queue"
        time.sleep(0.05)
    while not all(client.result(i) for i, (kind, _) in expected.items() if kind == "model"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for prompt in model_prompts:  # identical requests again: the cache answers
        expected[client.submit(prompt, max_tokens=30)] = ("cache", expected_completion(prompt, 30))
    bad = client.submit_raw({FIELD: b"{definitely not json"})
    wrong = client.submit_raw({FIELD: orjson.dumps({"id": "wrong-types", "prompt": ["a"], "max_tokens": "many"})})
    expected[bad] = ("error", None)
    expected["wrong-types"] = ("error", None)

    results = {rid: client.wait(rid, timeout=30) for rid in expected}
    assert len(results) >= 100
    for rid, (kind, text) in expected.items():
        result = results[rid]
        assert result.kind == kind, (rid, result)
        if text is not None:
            assert result.text == text
    assert results[bad].error.code == "invalid_json"  # type: ignore[union-attr]
    # Answered under the id it carried, not the stream entry id XADD returned for it.
    assert client.result(wrong) is None and results["wrong-types"].error.field == "prompt"  # type: ignore[union-attr]
    assert all(p.poll() is None for p in processes.values()), "a process died"

    info = subprocess.run([str(BIN / "rq"), "info", "-u", redis_server.url, "--raw"], capture_output=True,
                          text=True, timeout=30, check=True).stdout
    assert "laya:llm:default:normal" in info
    assert "laya-default-" in info  # the worker, named after its model


def test_submit_streams_and_asks_for_json_through_real_processes(
        redis_server: Server, tiny_model: Path, routes_file: Path, tmp_path: Path,
        processes: dict[str, subprocess.Popen[bytes]]) -> None:
    env = laya_env(redis_server.url, tiny_model, routes_file)

    def submit(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "laya"), "submit", *argv], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    streamed = submit("--stream", "--priority", "high", "--deadline", "30", "jello")
    assert (streamed.returncode, streamed.stdout) == (0, "pqrstuvwxyz\n"), streamed.stderr
    rule = submit("--stream", "hello")  # no chunks: the rule's answer is printed as it is
    assert (rule.returncode, rule.stdout) == (0, "Hello!\n"), rule.stderr
    schema = tmp_path / "color.json"
    schema.write_bytes(orjson.dumps({"type": "object", "properties": {"color": {"enum": ["red", "blue"]}},
                                     "required": ["color"]}))
    answer = submit("--wait", "--json", "--schema", str(schema), "hello")  # a rule never answers with JSON
    record = orjson.loads(answer.stdout)
    assert record["route"] == "model:default" and record["json"] == {"color": "blue"}, answer.stderr
    refused = submit("--wait", "--schema", str(schema), "--deadline", "0", "x")
    assert refused.returncode == 2 and "--deadline 0.0: must be more than 0" in refused.stderr
    schema.write_bytes(orjson.dumps({"type": "string", "format": "email"}))
    refused = submit("--wait", "--schema", str(schema), "x")
    assert refused.returncode == 2 and "'format' = 'email' cannot be enforced" in refused.stderr


@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep")
def test_laya_up_serves_and_stops_cleanly_on_sigint(tmp_path: Path, tiny_model: Path) -> None:
    port, http_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update({"LAYA_REDIS__EMBEDDED_PORT": str(port), "LAYA_MODEL_PATH": str(tiny_model),
                "LAYA_HTTP__PORT": str(http_port)})
    up = subprocess.Popen([str(BIN / "laya"), "up"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert up.stderr is not None
        for line in up.stderr:
            if "laya is up" in line:
                assert f"OpenAI's API on http://127.0.0.1:{http_port}/v1" in line, line
                break
            assert up.poll() is None, "laya up exited early"
        answer = subprocess.run([str(BIN / "laya"), "submit", "--wait", "--timeout", "30", "jello"], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() == "pqrstuvwxyz"
        over_http = httpx2.post(f"http://127.0.0.1:{http_port}/v1/completions", timeout=30,
                                json={"model": "default", "prompt": "jello"}).json()
        assert over_http["choices"][0]["text"] == "pqrstuvwxyz"
        children = subprocess.run(["pgrep", "-P", str(up.pid)], capture_output=True, text=True,
                                  check=False).stdout.split()
        assert len(children) == 4  # valkey-server, router, worker, serve
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert alive == [], "a process of `laya up` outlived it"
    with pytest.raises(RedisConnectionError):
        Redis(port=port, socket_connect_timeout=1).ping()


def test_demo_runs_to_its_summary(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    demo = subprocess.run([str(BIN / "laya"), "demo", "--requests", "6"], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "runs the [model] extra's gemma 3 270m" in demo.stderr.lower()  # the test extra brings the model
    assert "cache                    ' Paris'" in demo.stdout
    second_pass = demo.stdout.split("second pass")[1]
    for route in ("cache", "rule:greeting", "rule:ping", "error:invalid_request", "error:invalid_json"):
        assert route in second_pass
    assert "model:default" in demo.stdout.split("second pass")[0]
    assert "0 resubmitted" in second_pass


def test_sighup_reloads_rules_and_a_bad_file_keeps_the_old_ones(redis: Redis, redis_server: Server,
                                                                tiny_model: Path, tmp_path: Path) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text('[[rule]]\nname="one"\nmatch="exact"\npatterns=["one"]\nreply="1"\n')
    log = tmp_path / "router.log"
    router = start_laya("router", laya_env(redis_server.url, tiny_model, routes), log)
    client = Client(redis)
    try:
        assert client.ask("one", timeout=20).route == "rule:one"
        routes.write_text('[[rule]]\nname="two"\nmatch="exact"\npatterns=["two"]\nreply="2"\n')
        router.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while client.ask("two", timeout=20, cache=False).route != "rule:two":
            assert time.monotonic() < deadline, "the reload never took effect"
            time.sleep(0.1)
        routes.write_text('[[rule]]\nname="bad"\nmatch="regex"\npatterns=["("]\nreply="x"\n')
        router.send_signal(signal.SIGHUP)
        while "rules reload refused, keeping 1 old rules" not in log.read_text():  # it was tried, and refused
            assert time.monotonic() < deadline, f"the bad file was never loaded: {log.read_text()[-500:]}"
            time.sleep(0.1)
        assert client.ask("two", timeout=20).route == "rule:two"
        assert router.poll() is None
        stats = subprocess.run([str(BIN / "laya"), "stats", "--json"], capture_output=True, text=True, timeout=30,
                               env=laya_env(redis_server.url, tiny_model, routes), check=True).stdout
        assert orjson.loads(stats)["router"]["rules"] == 1
    finally:
        stop_laya(router)


def test_the_routing_benchmark_reports_percentiles_and_baselines() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "bench/routing.py", "--rules", "100", "--cache-entries", "1000",
                           "--requests", "2000", "--no-metrics", "--json"], cwd=root, capture_output=True, text=True,
                          timeout=120, check=True)
    report = orjson.loads(done.stdout)
    assert report["rules"] == 100
    for figures in (report["laya_us"], report["naive_regex_loop_us"]):
        assert 0 < figures["p50"] <= figures["p99"] <= figures["p999"]
    assert report["seed_method_us"]["decode_and_route_p50"] > 0
