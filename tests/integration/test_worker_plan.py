"""The worker plans before it loads: it refuses what does not fit and shrinks what nearly does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from redis import Redis

from laya.config import Settings
from laya.errors import DoesNotFit, GGUFError, UnplannableModel
from laya.memory.machine import GiB, Machine
from laya.worker.rqworker import plan_and_load
from laya.worker.tinymodel import TinyModelSpec, write_tiny_model

from ..conftest import Server
from ..gguf_headers import QWEN25_7B, Arch, write_header

# Far more than any machine holds (13 TiB of Q4_K_M weights), so the refusal does not depend on the host.
GIANT = Arch("qwen2", "Qwen-like giant", 400, 65536, 512, 64, 262144, 152064, 32768)
# A small machine to plan for in process (the planner's equivalent of `laya plan --ram 1GiB --vram 0`).
SMALL = Machine(ram_total=2 * GiB, ram_available=1 * GiB, source="given")


def test_worker_refuses_a_model_that_does_not_fit(tmp_path: Path, redis_server: Server) -> None:
    model = write_header(tmp_path / "giant.gguf", GIANT)
    env = {**os.environ, "LAYA_REDIS_URL": redis_server.url, "LAYA_MODEL_PATH": str(model),
           "LAYA_RUNTIME__MAX_SEQ_LEN": "2048"}
    done = subprocess.run([sys.executable, "-m", "laya", "worker", "--burst"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "refuses this configuration" in done.stderr and "--force" in done.stderr
    assert "verdict REFUSE" in done.stderr


def test_worker_shrinks_the_context_and_says_so(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    greedy = settings.model_copy(update={
        "runtime": settings.runtime.model_copy(update={"max_seq_len": 1_048_576}),
        "memory": settings.memory.model_copy(update={"budget_fraction": 0.5}),
    })
    with caplog.at_level("INFO", logger="laya.worker"):
        backend, plan = plan_and_load(greedy, machine=SMALL)
    assert plan is not None and plan.verdict == "shrink"
    assert backend.n_ctx == plan.planned.ctx and 256 <= plan.planned.ctx < 1_048_576
    assert f"max_seq_len 1048576 does not fit this machine: using {plan.planned.ctx} tokens" in caplog.text
    assert "resident memory" in caplog.text


def test_refusal_raises_unless_forced(tmp_path: Path, settings: Settings) -> None:
    model = write_header(tmp_path / "qwen.gguf", QWEN25_7B)  # 4.4 GB of weights
    tight = settings.model_copy(update={"model": settings.model.model_copy(update={"path": model})})
    with pytest.raises(DoesNotFit, match="verdict REFUSE"):
        plan_and_load(tight, machine=SMALL)


def test_worker_publishes_its_plan_and_memory(settings: Settings, redis: Redis) -> None:
    from prometheus_client import CollectorRegistry

    from laya.keys import Keys
    from laya.metrics import WorkerMetrics
    from laya.worker.presence import Presence

    backend, plan = plan_and_load(settings)
    presence = Presence(redis, Keys(), settings, name="w1", metrics=WorkerMetrics(CollectorRegistry(), "default"),
                        plan=plan, n_ctx=backend.n_ctx)
    presence.beat()
    stats = [orjson.loads(v) for v in redis.hgetall("laya:stats:worker").values()]
    assert stats and stats[0]["verdict"] == "fits" and stats[0]["ram_resident"] > 0 and stats[0]["ram_planned"] > 0
    presence.stop()  # a worker that stops leaves the list
    assert not redis.exists("laya:stats:worker")


def test_a_model_the_planner_cannot_read_loads_only_when_forced(tmp_path: Path, settings: Settings,
                                                                 redis: Redis) -> None:
    from laya.client import Client
    from laya.worker.rqworker import run_worker

    from .test_worker import route_all

    model = write_tiny_model(tmp_path / "mamba.gguf", TinyModelSpec(arch="mamba"))
    mamba = settings.model_copy(update={"model": settings.model.model_copy(update={"path": model})})
    with pytest.raises(UnplannableModel, match="no attention heads.*--force"):
        plan_and_load(mamba)
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=4)
    route_all(mamba, redis)
    run_worker(mamba, redis, burst=True, force=True)
    assert client.wait(request_id, timeout=5).text == "pqrs"
    assert not redis.exists("laya:stats:worker")  # no plan to publish


def test_force_does_not_cover_a_broken_file(tmp_path: Path, settings: Settings) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(write_tiny_model(tmp_path / "whole.gguf").read_bytes()[:100])
    cut = settings.model_copy(update={"model": settings.model.model_copy(update={"path": broken})})
    for force in (False, True):
        with pytest.raises(GGUFError, match="truncated") as info:
            plan_and_load(cut, force=force)
        assert not isinstance(info.value, UnplannableModel) and "--force" not in info.value.message
