"""Several models in one config: routed by intent, one worker each, planned as a set, workers that refuse
a model their config does not plan. Real Valkey, the real router and workers, two generated GGUF models."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from redis import Redis

from laya.cli import main
from laya.client import Client
from laya.config import Settings
from laya.errors import ConfigError
from laya.memory.machine import Machine, MiB
from laya.memory.modelfile import read_model_info
from laya.memory.modelset import plan_models
from laya.memory.planner import make_plan, plan_input
from laya.router.ingress import Router
from laya.worker.rqworker import run_worker
from laya.worker.tinymodel import write_tiny_model

from ..conftest import free_port
from .running import RunningUp

ROUTES = """
[[rule]]
name = "classify"
examples = ["classify this ticket", "what category is this email", "extract the invoice number"]
model = "small"

[[rule]]
name = "writing"
examples = ["write a short story", "write a poem about the sea", "draft a blog post"]
threshold = 0.65
model = "big"
"""


@pytest.fixture(scope="module")
def second_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("second") / "second.gguf")


@pytest.fixture
def two_models(settings: Settings, tiny_model: Path, second_model: Path, tmp_path: Path) -> Settings:
    routes = tmp_path / "routes.toml"
    routes.write_text(ROUTES)
    return Settings.model_validate({
        **settings.model_dump(exclude={"model", "source"}),
        "models": [{"name": "small", "path": str(tiny_model)}, {"name": "big", "path": str(second_model)}],
        "router": {**settings.router.model_dump(), "routes_file": str(routes)}})


def test_requests_go_to_the_model_their_intent_names_and_the_route_summary_shows_the_split(
        two_models: Settings, redis: Redis) -> None:
    client = Client(redis)
    prompts = {"Classify this support ticket": "small", "What category is this email?": "small",
               "Write a short story about a lighthouse": "big", "Write a poem about the sea at night": "big",
               "Summarise the minutes": "small"}  # no intent: the default model, the first of [[models]]
    ids = {client.submit(prompt, max_tokens=4): model for prompt, model in prompts.items()}
    router = Router(two_models, redis, consumer="test")
    router.ensure_group()
    while entries := router.read_batch():
        router.handle(entries)
    router.publish_stats()
    for name in ("small", "big"):  # one worker per model, each serving only its own queues
        run_worker(two_models.for_model(name), redis, burst=True)
    for request_id, model in ids.items():
        result = client.wait(request_id, timeout=10)
        assert result.route == f"model:{model}" and result.model == model
    stats = {k.decode(): v.decode() for k, v in redis.hgetall(router.keys.router_stats).items()}
    assert stats["count:model:small"] == "3" and stats["count:model:big"] == "2"


def test_a_worker_refuses_a_model_its_config_does_not_plan(two_models: Settings) -> None:
    with pytest.raises(ConfigError, match=r"model 'huge' is not one this config serves \(small, big\)"):
        two_models.for_model("huge")


def config_file(settings: Settings, path: Path, head: str) -> Path:
    paths = [m.path for m in settings.served]
    path.write_text(f'{head}\n\n[[models]]\nname = "small"\npath = "{paths[0]}"\n\n'
                    f'[[models]]\nname = "big"\npath = "{paths[1]}"\n')
    return path


def test_laya_plan_plans_the_set_together(two_models: Settings, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = config_file(two_models, tmp_path / "two.toml", "")
    assert main(["-c", str(config), "plan", "--ram", "64GiB", "--vram", "0"]) == 0
    out = capsys.readouterr().out
    assert "== small ==" in out and "== big ==" in out and "set FITS: all 2 stay loaded together" in out
    assert main(["-c", str(config), "plan", "--ram", "700MiB", "--vram", "0"]) == 1
    assert "set does NOT fit" in capsys.readouterr().out


def test_laya_worker_needs_a_model_name_when_the_config_has_several(two_models: Settings, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = config_file(two_models, tmp_path / "two.toml", f'[redis]\nurl = "{two_models.redis.url}"')
    assert main(["-c", str(config), "worker", "--burst"]) == 2
    assert "start one worker per model with --model NAME" in capsys.readouterr().err
    assert main(["-c", str(config), "worker", "--burst", "--model", "huge"]) == 2
    assert "'huge' is not one this config serves" in capsys.readouterr().err


def test_the_set_is_planned_together_and_says_which_model_does_not_fit(two_models: Settings) -> None:
    info = read_model_info(two_models.served[0].path)  # type: ignore[arg-type]
    alone = make_plan(info, Machine(64 * 1024 * MiB, 64 * 1024 * MiB), plan_input(two_models))
    need = next(d.total for d in alone.devices if d.device == "cpu")
    roomy = Machine(64 * 1024 * MiB, 64 * 1024 * MiB)
    assert plan_models(two_models, roomy).fits
    # Room for one and a half: the first fits, the second is refused, and would fit alone.
    tight = Machine(64 * 1024 * MiB, int(need * 1.5 / two_models.memory.budget_fraction))
    plans = plan_models(two_models, tight)
    assert not plans.fits
    assert plans.plan_for("small").verdict != "refuse" and plans.plan_for("big").verdict == "refuse"
    assert plans.alone["big"] != "refuse"
    assert "set does NOT fit: big left without memory" in plans.table()


def test_laya_up_starts_one_worker_per_model_and_answers_through_each(two_models: Settings, tmp_path: Path) -> None:
    port = free_port()
    config_file(two_models, tmp_path / "two.toml",
                f'[redis]\nembedded_port = {port}\n\n[router]\nroutes_file = "{two_models.router.routes_file}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    up = RunningUp(f"{Path(sys.executable).parent / 'laya'} -c two.toml up", cwd=tmp_path, env=env)
    try:
        up.wait_for("laya is up on")
        assert re.search(r"laya worker:small started \(pid \d+\)", up.text())
        assert re.search(r"laya worker:big started \(pid \d+\)", up.text())
        client = Client(Redis(port=port))
        story = client.ask("Write a short story about a lighthouse", max_tokens=4, timeout=30)
        ticket = client.ask("Classify this support ticket", max_tokens=4, timeout=30)
        assert (story.route, ticket.route) == ("model:big", "model:small")
    finally:
        up.close()
