"""Semantic intents and the semantic cache end to end: real Valkey, the real router, the real worker on a
generated GGUF model, and the real embedder (WordLlama, loaded from its package)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from laya.client import Client
from laya.config import Settings
from laya.keys import Keys
from laya.router.ingress import Router

from .test_pipeline_features import route_all, work

SEMANTIC_ROUTES = """
[[rule]]
name = "greeting"
match = "exact"
patterns = ["hello"]
reply = "Hello!"

[[rule]]
name = "tracking"
examples = ["where is my parcel", "track my order", "when will my package arrive"]
reply = "See the tracking link in your confirmation email."
"""


@pytest.fixture
def semantic(settings: Settings, tmp_path: Path) -> Settings:
    routes = tmp_path / "semantic_routes.toml"
    routes.write_text(SEMANTIC_ROUTES)
    return settings.model_copy(update={
        "model": settings.model.model_copy(update={"semantic_cache": True}),
        "router": settings.router.model_copy(update={"routes_file": routes})})


def answered_by_model(client: Client, settings: Settings, redis: Redis, prompt: str, **params: object) -> str:
    request_id = client.submit(prompt, cache="semantic", max_tokens=8, **params)
    route_all(settings, redis)
    work(settings, redis)
    result = client.wait(request_id, timeout=10)
    assert result.route == "model:default", result
    return result.text or ""


def test_a_paraphrase_is_answered_from_the_semantic_cache_and_a_negation_is_not(semantic: Settings,
                                                                                 redis: Redis) -> None:
    client = Client(redis)
    text = answered_by_model(client, semantic, redis, "Please refund my order")
    paraphrase = client.submit("Can you refund my order?", cache="semantic", max_tokens=8)
    negation = client.submit("Please do not refund my order", cache="semantic", max_tokens=8)
    exact_only = client.submit("Can you refund my order?", max_tokens=8)  # cache: true, the exact cache only
    route_all(semantic, redis)
    hit = client.wait(paraphrase, timeout=5)
    assert hit.route == "cache:semantic" and hit.text == text and hit.similarity is not None
    assert 0.7 <= hit.similarity < 1
    assert client.result(negation) is None and client.result(exact_only) is None  # both queued for the model


def test_the_semantic_log_is_capped_at_semantic_cache_size(semantic: Settings, redis: Redis) -> None:
    semantic = semantic.model_copy(update={"router": semantic.router.model_copy(update={"semantic_cache_size": 10})})
    client = Client(redis)
    for i in range(250):
        client.submit(f"story number {i}", cache="semantic", max_tokens=1)
    route_all(semantic, redis)
    work(semantic, redis)
    # MAXLEN ~ trims whole stream nodes (100 entries each): approximate, but 250 answers are cut.
    assert redis.xlen(Keys().semantic_log) < 200


def test_answers_never_cross_sampling_parameters_schemas_or_models(semantic: Settings, redis: Redis) -> None:
    client = Client(redis)
    answered_by_model(client, semantic, redis, "Please refund my order")
    others = [client.submit("Can you refund my order?", cache="semantic", max_tokens=8, temperature=0.7),
              client.submit("Can you refund my order?", cache="semantic", max_tokens=9),
              client.submit("Can you refund my order?", cache="semantic", max_tokens=8,
                            response_format={"type": "json_object"})]
    route_all(semantic, redis)
    assert all(client.result(request_id) is None for request_id in others)


def test_a_model_that_does_not_allow_it_is_never_answered_by_meaning(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    answered_by_model(client, settings, redis, "Please refund my order")
    assert redis.xlen(Keys().semantic_log) == 0  # nothing recorded for a model without semantic_cache
    paraphrase = client.submit("Can you refund my order?", cache="semantic", max_tokens=8)
    route_all(settings, redis)
    assert client.result(paraphrase) is None


def test_a_router_started_later_knows_the_answers_in_the_log(semantic: Settings, redis: Redis) -> None:
    client = Client(redis)
    text = answered_by_model(client, semantic, redis, "Please refund my order")
    Router(semantic, redis, consumer="fresh")  # nothing carried in memory from the router that routed it
    paraphrase = client.submit("Can you refund my order?", cache="semantic", max_tokens=8)
    route_all(semantic, redis)  # route_all builds a new router: it reads the log from the start
    assert client.wait(paraphrase, timeout=5).text == text


def test_an_intent_matches_by_meaning_after_the_exact_rules(semantic: Settings, redis: Redis) -> None:
    client = Client(redis)
    ids = [client.submit(text) for text in ("hello", "Where is my parcel now?", "Write a haiku about queues")]
    route_all(semantic, redis)
    exact, intent = client.wait(ids[0], timeout=5), client.wait(ids[1], timeout=5)
    assert exact.route == "rule:greeting" and exact.similarity is None
    assert intent.route == "rule:tracking" and intent.similarity is not None and intent.similarity >= 0.85
    assert client.result(ids[2]) is None  # no intent near enough: the model answers


def test_an_embedder_that_fails_to_load_turns_the_semantic_stages_off_and_exact_routing_goes_on(
        semantic: Settings, redis: Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = semantic.model_copy(update={"router": semantic.router.model_copy(
        update={"embedder_dir": tmp_path / "no-weights-here"})})
    client = Client(redis)
    ids = [client.submit(text, cache="semantic") for text in ("hello", "Where is my parcel now?")]
    with caplog.at_level(logging.ERROR, logger="laya.router.stages"):
        router = route_all(broken, redis)
    lines = [r for r in caplog.records if r.name == "laya.router.stages"]
    assert len(lines) == 1 and "semantic stages off" in lines[0].getMessage()
    assert "exact routing goes on" in lines[0].getMessage()
    assert router.intent_stage.index is None and router.semantic_stage.cache is None
    assert client.wait(ids[0], timeout=5).route == "rule:greeting"
    assert client.result(ids[1]) is None  # no intent stage: queued for the model, not lost
    assert Queue(Keys().queue_name("default"), connection=redis).job_ids == [ids[1]]
