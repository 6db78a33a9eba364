"""The records router and worker exchange: each encodes to what the other side reads back."""

from __future__ import annotations

import importlib

import fakeredis
import orjson
import pytest

from laya.contract import (
    JOB_FUNCTION,
    MAX_RINGS,
    SEMANTIC_LOG_FIELD,
    CachedAnswer,
    JobPayload,
    SemanticLogEntry,
    ring,
)
from laya.schema import Request, Result


def test_the_job_function_is_the_workers() -> None:
    module, _, name = JOB_FUNCTION.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))


def test_a_job_payload_round_trips_as_rq_stores_it() -> None:
    request = Request(id="r1", prompt="hello", metadata={"k": "v"})
    payload = JobPayload(request=request, model="default", lane="bulk", max_tokens=64, routed_at=1.5,
                         route_us=12.0, cache_key="abc")
    raw = orjson.loads(orjson.dumps(payload.encode()))  # through JSON, as RQ's JSON serializer does
    assert (raw["request"]["id"], raw["request"]["prompt"], raw["request"]["metadata"]) == ("r1", "hello", {"k": "v"})
    assert None not in raw["request"].values(), "a request is stored without its unset fields"
    assert raw["expires_at"] is None and raw["semantic_scope"] is None
    assert JobPayload.decode(raw) == payload


def test_a_payload_that_is_not_one_is_refused() -> None:
    for raw in ({"request": "not an object", "model": 5}, {"model": "m"}, "text", None):
        with pytest.raises(ValueError, match="not a Laya job payload"):
            JobPayload.decode(raw)
    with pytest.raises(ValueError, match=r"\(request: Field required; max_tokens: Field required; routed_at: Field"):
        JobPayload.decode({"model": "m"})


def test_a_cached_answer_is_stored_without_json_unless_it_has_one() -> None:
    plain = CachedAnswer(text="hi", model="m", finish_reason="stop", usage={"prompt_tokens": 2})
    assert orjson.loads(plain.encode()) == {"text": "hi", "model": "m", "finish_reason": "stop",
                                            "usage": {"prompt_tokens": 2}}
    structured = CachedAnswer(text='{"a": 1}', json={"a": 1})
    assert orjson.loads(structured.encode())["json"] == {"a": 1}
    assert CachedAnswer.decode(structured.encode()) == structured
    assert CachedAnswer.decode(b'{"text": "old", "usage": {}}').model is None  # any stored entry reads back


def test_a_cached_answer_is_the_fields_of_the_result_it_gives() -> None:
    answer = CachedAnswer(text='{"a": 1}', model="m", finish_reason="stop", json={"a": 1},
                          usage={"prompt_tokens": 3, "completion_tokens": 5})
    result = Result.model_validate({"id": "x", "route": "cache", "ok": True, **answer.as_dict()})
    assert (result.text, result.model, result.json_value, result.usage.completion_tokens) == (
        '{"a": 1}', "m", {"a": 1}, 5)


def test_a_semantic_log_entry_round_trips_and_a_broken_one_is_refused() -> None:
    entry = SemanticLogEntry(scope="s", prompt="p", answer=CachedAnswer(text="a"), expires_at=9.0)
    fields = {k.encode(): v for k, v in entry.fields().items()}
    assert list(fields) == [SEMANTIC_LOG_FIELD.encode()]
    assert SemanticLogEntry.decode(fields) == entry
    with pytest.raises(KeyError):
        SemanticLogEntry.decode({b"other": b"{}"})
    with pytest.raises(ValueError):
        SemanticLogEntry.decode({b"e": b'{"scope": "s"}'})


def test_the_bell_rings_once_per_job_up_to_its_bound() -> None:
    redis = fakeredis.FakeRedis()
    for jobs in (3, 100):
        with redis.pipeline() as pipe:
            ring(pipe, "bell", jobs)
            pipe.execute()
    assert redis.llen("bell") == MAX_RINGS
