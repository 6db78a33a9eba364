"""Structured output, streaming, priority lanes and deadlines, end to end on the real parts.

Each test routes with the real router and runs the real RQ worker in-process on a
generated GGUF model (the tiny hand-wired one, or two layers of Qwen2.5-1.5B in
Q4_K_M) against the session's Valkey server.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import jsonschema
import pytest
from pydantic import BaseModel, Field
from redis import Redis
from rq import Queue
from rq.job import Job

from laya.client import Chunk, Client
from laya.config import Settings
from laya.keys import Keys
from laya.results import ResultStore
from laya.router.ingress import Router
from laya.schema import Request, Result
from laya.streaming import END
from laya.worker.backend import Controls, Generation, LlamaBackend
from laya.worker.rqworker import run_worker


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    name: str = Field(max_length=8)


T = TypeVar("T")


class Tree(BaseModel, Generic[T]):
    """Pydantic names this generic's definition "Tree_int_": the converter wrote that unescaped into a rule name
    for the recursive step, and llama.cpp crashed the worker on the grammar."""

    value: T
    children: list[Tree[T]] = Field(default=[], max_length=2)


class Pet(BaseModel):
    """A discriminated union and a property named like an annotation, as Pydantic writes them."""

    pet: Cat | Dog = Field(discriminator="kind")
    title: str = Field(max_length=8, description="a property named like an annotation")


SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "ok": {"type": "boolean"}}, "required": ["name", "ok"]},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    "array": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2, "maxItems": 4},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {
            "type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["id", "tags"]},
        "note": {"type": ["string", "null"], "maxLength": 5}}, "required": ["user", "note"]},
    "bounded": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 65},
                                                 "score": {"type": "integer", "exclusiveMinimum": -3,
                                                           "exclusiveMaximum": 3}},
                "required": ["age", "score"]},
    "refs": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                 "required": ["x", "y"]}},
             "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}}, "required": ["a"]},
    # Pydantic's model_json_schema() of a recursive model: a '$ref' beside the '$defs' that refer to themselves.
    "recursive": {"$defs": {"Node": {"type": "object", "title": "Node", "required": ["value"], "properties": {
        "value": {"type": "integer", "title": "Value"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": [], "maxItems": 2}}}},
        "$ref": "#/$defs/Node"},
    # Pydantic's tuple[int, str]: the item counts beside 'prefixItems' say what the grammar writes anyway.
    # A type list beside '$defs' at the top: the references into them must still resolve.
    "typelist_defs": {"type": ["object", "null"], "$defs": {"S": {"type": "string", "maxLength": 3}},
                      "properties": {"a": {"$ref": "#/$defs/S"}}, "required": ["a"]},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 4}],
              "minItems": 2, "maxItems": 2},
    "pydantic": Pet.model_json_schema(),
    "generic_recursive": Tree[int].model_json_schema(),
    "formats": {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                                 "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
                "required": ["day", "code"]},
}


def route_all(settings: Settings, redis: Redis) -> Router:
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    while entries := router.read_batch():
        router.handle(entries)
    return router


def work(settings: Settings, redis: Redis, backend: LlamaBackend | None = None) -> None:
    run_worker(settings, redis, burst=True, backend=backend or LlamaBackend(settings))


def with_model(settings: Settings, path: Path, **runtime: Any) -> Settings:
    return settings.model_copy(update={"model": settings.model.model_copy(update={"path": path}),
                                       "runtime": settings.runtime.model_copy(update=runtime)})


# -- structured output --------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny", "q4km"])
def test_every_schema_gets_json_that_validates(settings: Settings, redis: Redis, q4km_model: Path,
                                               model: str) -> None:
    if model == "q4km":
        settings = with_model(settings, q4km_model)
    client = Client(redis)
    ids = {name: client.submit("hello", max_tokens=200, response_format={"type": "json_schema", "schema": schema})
           for name, schema in SCHEMAS.items()}
    ids["json_object"] = client.submit("{", max_tokens=200, response_format={"type": "json_object"}, cache=False)
    route_all(settings, redis)
    work(settings, redis)
    for name, request_id in ids.items():
        result = client.wait(request_id, timeout=5)
        if name == "json_object":  # free-form keys: a steered model may run to max_tokens inside a string
            # ... but never fails: a broken JSON grammar is an error with no finish_reason
            assert result.finish_reason in ("stop", "length") and result.ok == (result.finish_reason == "stop"), result
            if result.ok:
                assert isinstance(result.json_value, dict)
            continue
        assert result.ok and result.finish_reason == "stop", (name, result)
        jsonschema.validate(result.json_value, SCHEMAS[name])
        assert result.json_value == __import__("json").loads(result.text)


def test_a_schema_is_part_of_the_cache_key_and_key_order_is_not(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    schema = SCHEMAS["enum"]
    first = client.submit("pick a color", response_format={"type": "json_schema", "schema": schema})
    route_all(settings, redis)
    work(settings, redis)
    assert client.wait(first, timeout=5).json_value == {"color": "blue"}
    reordered = {"required": ["color"], "properties": schema["properties"], "type": "object"}
    same = client.submit("pick a color", response_format={"type": "json_schema", "schema": reordered})
    other = client.submit("pick a color", response_format={"type": "json_schema", "schema": SCHEMAS["object"]})
    plain = client.submit("pick a color")
    route_all(settings, redis)
    hit = client.wait(same, timeout=5)
    assert hit.route == "cache" and hit.json_value == {"color": "blue"}
    assert client.result(other) is None and client.result(plain) is None  # both went to the model queue


def test_json_cut_by_max_tokens_says_so_and_is_never_cached(settings: Settings, redis: Redis,
                                                            counted_jobs: list[dict[str, Any]]) -> None:
    client = Client(redis)
    fmt = {"type": "json_schema", "schema": SCHEMAS["object"]}
    cut = client.submit("hello", max_tokens=5, response_format=fmt)
    route_all(settings, redis)
    work(settings, redis)
    result = client.wait(cut, timeout=5)
    assert [c["outcome"] for c in counted_jobs] == ["incomplete_json"]  # counted as the error it is, not "ok"
    assert (result.ok, result.finish_reason, result.json_value) == (False, "length", None)
    assert result.error is not None and result.error.code == "incomplete_json" and result.error.field == "max_tokens"
    assert "before the JSON closed" in result.error.message and "Raise max_tokens" in result.error.message
    assert result.text and result.text.startswith("{")
    again = client.submit("hello", max_tokens=5, response_format=fmt)
    route_all(settings, redis)
    assert client.result(again) is None  # no cached answer: queued for the model again


@pytest.mark.parametrize(("schema", "names"), [
    ({"type": "object", "properties": {"email": {"type": "string", "format": "email"}}}, ["'format'", "'email'"]),
    ({"type": "number", "minimum": 0}, ["'minimum'", "only on integers"]),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, ["'uniqueItems'", "remove it"]),
    ({"type": "integer", "minimum": 0, "maximum": 5000}, ["0..5000", "5001 values"]),
    ({"type": "integer", "minimum": 0}, ["both 'minimum' and 'maximum'"]),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, ["#/properties/a", "'not'"]),
    ({"$ref": "https://example.com/s.json"}, ["'$ref'", "inside the schema"]),
    ({"type": "strnig"}, ["'strnig'", "not a JSON type"]),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, ["'maxLength' beside 'pattern'", "silently ignored"]),
    ({"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 3}, ["'maxLength' beside 'anyOf'"]),
    ({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}], "minItems": 2}}},
     ["#/properties/a", "one item per 'prefixItems' part, 1 in all", "'minItems'/'maxItems'"]),
    ({"type": "array", "prefixItems": [{"type": "string"}], "maxItems": 0}, ["1 in all"]),
    ({"type": "object", "required": ["a"]}, ["'required' here"]),
    ([1, 2], ["<list of 2 items>", "valid dictionary"]),
    # Found by a helper hunting hostile inputs on 7 December: the first three crashed the worker (llama.cpp refused
    # the grammar and llama-cpp-python went on), the next four were answered error:internal, the last one too.
    ({"type": "string", "maxLength": 1001}, ["'maxLength' = 1001", "from 0 to 1000"]),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 1500}, ["'maxItems' = 1500"]),
    ({"type": "string", "pattern": "^a{0,100000}$"}, ["'pattern' repeats 100000 times"]),
    ({"type": {}}, ["'type' = {}", "a string or an array"]),
    ({"allOf": [1]}, ["#/allOf/0", "a JSON object, got int"]),
    ({"format": []}, ["'format' = []", "must be a string"]),
    ({"type": "array", "items": True}, ["'items' = True", "an object or an array"]),
    ({"type": "string", "description": functools.reduce(lambda inner, _: {"d": inner}, range(300), {})},
     ["nested deeper than 64 levels"]),
    # Found on 7 December: the router let these through, and the worker's converter failed on them with a message
    # that named no field (a missing '$ref' target echoed the whole schema back).
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
     ["#/properties/a", "'$ref' = '#/$defs/nope' points at nothing", "'$defs'"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/b/type"}, "b": {"type": "string"}}},
     ["at #/properties/a:", "points at str, not at a schema"]),
    ({"type": "object", "properties": {"a": {}}, "required": [{}]}, ["'required' lists {}", "property names"]),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(501)}},
     ["501 optional properties", "at most 500", "list more in 'required'"]),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5000)}, "required": [f"p{i}" for i in range(5000)]},
     ["more than 5000 subschemas"]),
    # Found by a review on 7 December: these crashed the worker (llama.cpp on a rule that starts with itself, or
    # with no alternative), hung it (the converter loops forever on a ']' or '}' that closes nothing), or were
    # enforced as something else.
    ({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"},
     ["'$ref' = '#/$defs/A' leads back to itself before anything is written"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
     ["at #/properties/a:", "leads back to itself"]),
    ({"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(40)} | {"d40": {"type": "string"}},
      "$ref": "#/$defs/d0"}, ["leads through more than 32 '$ref's"]),
    ({"anyOf": []}, ["'anyOf' is empty"]),
    ({"type": "string", "enum": []}, ["'enum' is empty"]),
    ({"type": []}, ["'type' is empty"]),
    ({"type": "string", "pattern": "^a]$"}, ["'pattern' has a ']' at index 2 that closes nothing"]),
    ({"type": "string", "pattern": "^[[:alpha:]]$"}, ["a ']' at index 11"]),
    ({"type": "string", "pattern": "^a}$"}, ["'pattern' has a '}' at index 2"]),
    ({"type": "object", "default": {"type": "string"}, "properties": {"a": {"$ref": "#/default"}}},
     ["'$ref' = '#/default' points at nothing the grammar can follow"]),
    ({"$defs": {"a": {"type": "string"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a#b"}}},
     ["at #/properties/x:", "reads a reference after its last '#'"]),
    ({"definitions": {"Color": {"enum": ["red"]}}, "type": "object", "properties": {"c": {
        "allOf": [{"$ref": "#/definitions/Color"}]}}}, ["#/properties/c/allOf/0", "refers to '#/definitions/Color'"]),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": [{"type": "integer"}]},
     ["'prefixItems' and an 'items' list"]),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},
     ["'required' lists 'b', which 'properties' does not define"]),
    ({"type": "string", "format": "x" * 5000}, ["'format' = 'xxxx"]),
    # Found by mutation testing on 7 December: each check, where no other test reached it.
    ({"type": "string", "minLength": True}, ["'minLength' = True", "from 0 to 1000"]),
    ({"type": "object", "additionalProperties": "no"}, ["'additionalProperties' = 'no'", "a boolean or an object"]),
    ({"type": "object", "properties": {"a": 1}}, ["at #/properties/a:", "a JSON object, got int"]),
    ({"type": "object", "properties": {"a": {"type": "string", "format": []}}},
     ["at #/properties/a:", "'format' = []"]),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^" + "a" * 3999 + "$"}}},
     ["at #/properties/code:", "'pattern' is 4001 characters", "keep it under 4000"]),
    ({"anyOf": [{"type": "string", "pattern": "^a{0,1001}$"}, {"type": "null"}]},
     ["at #/anyOf/0:", "'pattern' repeats 1001 times"]),
    ({"type": "array", "items": {"type": "array", "items": {"type": "string"}, "maxItems": 1001}},
     ["at #/items:", "'maxItems' = 1001"]),
    ({"type": "object", "additionalProperties": {"type": "string", "format": "email"}},
     ["at #/additionalProperties:", "'format' = 'email'"]),
    (functools.reduce(lambda inner, _: {"type": "array", "items": inner}, range(33), {"type": "string"}),
     ["at #" + "/items" * 33 + ":", "nested deeper than 32 levels"]),
    # Found by mutation testing of the reference and pattern checks: a 'oneOf' that starts with itself crashes
    # llama.cpp as an 'anyOf' does, a ']' after an escape, a count or a class hangs the converter, 33 '$ref's are one
    # too many, and a reference into a list (JSON Pointer's "/0"), reached through another reference, is refused,
    # not an error.
    ({"$defs": {"A": {"oneOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"},
     ["'$ref' = '#/$defs/A' leads back to itself before anything is written"]),
    ({"type": "string", "pattern": "^X\\d]$"}, ["'pattern' has a ']' at index 4 that closes nothing"]),
    ({"type": "string", "pattern": "^a{2}]$"}, ["a ']' at index 5"]),
    ({"type": "string", "pattern": "^[\\d]]$"}, ["a ']' at index 5"]),
    ({"type": "string", "pattern": "^[a]]$"}, ["a ']' at index 4"]),
    ({"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(32)} | {"d32": {"type": "string"}},
      "$ref": "#/$defs/d0"}, ["at #:", "leads through more than 32 '$ref's"]),
    ({"allOf": [{"type": "object"}]}, ["at #/allOf/0:", "this part has none"]),
    ({"type": "object", "allOf": [{"$ref": "#/$defs/nope"}]},
     ["at #/allOf/0:", "refers to '#/$defs/nope', which has none"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/b"}, "b": {"$ref": "#/properties/c/anyOf/0"},
                                       "c": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
     ["at #/properties/b:", "'$ref' = '#/properties/c/anyOf/0' points at nothing"]),
])
def test_the_router_refuses_a_schema_the_grammar_cannot_enforce(settings: Settings, redis: Redis, schema: Any,
                                                                 names: list[str]) -> None:
    client = Client(redis)
    # The standard library's encoder, not orjson's: it writes the 300 levels a sender may send.
    entry = client.submit_raw({b"r": json.dumps(
        {"id": "schema-check", "prompt": "x", "response_format": {"type": "json_schema", "schema": schema}}).encode()})
    route_all(settings, redis)
    result = client.wait("schema-check", timeout=5)
    assert entry and result.route == "error:invalid_request" and result.error is not None
    assert result.error.field == "response_format.schema" or result.error.field == "response_format"
    for name in names:
        assert name in result.error.message, result.error.message
    assert Queue("laya:llm:default:normal", connection=redis, serializer="json").count == 0


# -- streaming ----------------------------------------------------------------------------------------


def collect(client: Client, request_id: str, *, kill_after: int | None = None, admin: Redis | None = None,
            **kwargs: Any) -> tuple[list[tuple[float, Chunk]], list[Result], threading.Thread]:
    chunks: list[tuple[float, Chunk]] = []
    results: list[Result] = []

    def read() -> None:
        for item in client.follow(request_id, timeout=30, **kwargs):
            if isinstance(item, Result):
                results.append(item)
                continue
            chunks.append((time.time(), item))
            if kill_after is not None and len(chunks) == kill_after and admin is not None:
                # The server drops this reader's connection mid-stream; it must go on from this chunk.
                admin.client_kill_filter(_id=client.redis.client_id())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return chunks, results, thread


def test_chunks_arrive_while_the_model_generates_and_join_into_the_text(
        settings: Settings, redis: Redis, redis_server: Any, q4km_model: Path) -> None:
    settings = with_model(settings, q4km_model, stream_flush_ms=0)
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=40, stream=True)
    route_all(settings, redis)
    reader = Client(redis_server.client())
    chunks, results, thread = collect(reader, request_id, kill_after=3, admin=redis_server.client())
    work(settings, redis)
    thread.join(30)
    (result,) = results
    assert result.ok and result.text == "pqrstuvwxyz" and result.route == "model:default"
    assert "".join(c.text for _, c in chunks) == result.text  # nothing missed or repeated across the kill
    assert len(chunks) == len(result.text)  # one chunk per token with stream_flush_ms = 0
    assert result.finished_at is not None and chunks[0][0] < result.finished_at - 0.005  # streamed, not at the end
    # A reader that joins late reads on from any chunk it names.
    late = [c for c in Client(redis).follow(request_id, after=chunks[4][1].id) if isinstance(c, Chunk)]
    assert "".join(c.text for c in late) == result.text[5:]


def test_stop_strings_never_leak_into_chunks(settings: Settings, redis: Redis) -> None:
    settings = with_model(settings, settings.model.path, stream_flush_ms=0)
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=40, stream=True, stop=["tuv"])
    route_all(settings, redis)
    work(settings, redis)
    items = list(client.follow(request_id, timeout=5))
    result = items[-1]
    assert isinstance(result, Result) and result.text == "pqrs" and result.finish_reason == "stop"
    assert "".join(c.text for c in items[:-1] if isinstance(c, Chunk)) == "pqrs"


def test_a_long_stream_is_capped_at_stream_max_chunks(settings: Settings, redis: Redis, endless_model: Path) -> None:
    settings = with_model(settings, endless_model, stream_flush_ms=0, stream_max_chunks=16)
    client = Client(redis)
    request_id = client.submit("a", max_tokens=400, stream=True)
    route_all(settings, redis)
    work(settings, redis)
    result = client.wait(request_id, timeout=10)
    assert result.usage.completion_tokens == 400
    # MAXLEN ~ trims whole stream nodes (100 entries each), so the cap is approximate, but 400 chunks are cut.
    entries = redis.xrange(Keys().stream(request_id))
    assert len(entries) < 200 and END in entries[-1][1]


def test_a_rule_answer_ends_the_stream_at_once(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    started = time.monotonic()
    items: list[Any] = []
    thread = threading.Thread(target=lambda: items.extend(client.stream("hello", timeout=5)), daemon=True)
    thread.start()
    time.sleep(0.05)
    route_all(settings, redis)
    thread.join(5)
    assert len(items) == 1 and isinstance(items[0], Result) and items[0].route.startswith("rule:")
    assert time.monotonic() - started < 0.9  # the router's end entry, not the one-second result check


def test_a_retried_job_tells_readers_to_start_over(settings: Settings, redis: Redis) -> None:
    keys = Keys()
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=40, stream=True)
    route_all(settings, redis)
    redis.xadd(keys.stream(request_id), {b"t": b"pq"})  # what a worker that died mid-job had sent
    work(settings, redis)
    items = list(client.follow(request_id, timeout=5))
    resets = [i for i, c in enumerate(items) if isinstance(c, Chunk) and c.reset]
    assert resets == [1]
    text = "".join(c.text for c in items[resets[0] + 1:] if isinstance(c, Chunk))
    assert isinstance(items[-1], Result) and text == items[-1].text == "pqrstuvwxyz"


class AnsweredMeanwhile(LlamaBackend):
    """Another worker answers each request while this one generates it (a duplicate delivery)."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        super().__init__(settings)
        self.results = ResultStore(redis, Keys(), ttl_s=60)

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        self.results.write(Result(id=request.id, route="model:default", ok=True, text="first"), None)
        return super().generate(request, max_tokens=max_tokens, controls=controls)


def test_the_stream_ends_with_the_result_kept_when_another_worker_answered_first(
        settings: Settings, redis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    client = Client(redis)
    request_id = client.submit("jello", max_tokens=8, stream=True)
    route_all(settings, redis)
    with caplog.at_level(logging.INFO, logger="laya.worker"):
        work(settings, redis, AnsweredMeanwhile(settings, redis))
    items = list(client.follow(request_id, timeout=5))
    assert isinstance(items[-1], Result) and items[-1].text == "first"  # what every reader of the id gets
    assert client.result(request_id).text == "first"  # type: ignore[union-attr]
    assert f"request {request_id} already had a result; kept the first one" in caplog.messages


# -- priority lanes -----------------------------------------------------------------------------------


def test_a_high_job_runs_before_a_backlog_of_bulk(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    bulk = [client.submit(f"bulk {i}", max_tokens=8, priority="bulk") for i in range(6)]
    normal = client.submit("normal one", max_tokens=8)
    high = client.submit("urgent one", max_tokens=8, priority="high")
    route_all(settings, redis)
    names = {q.name for q in Queue.all(connection=redis, serializer="json")}  # what `rq info` lists
    assert {"laya:llm:default:high", "laya:llm:default:normal", "laya:llm:default:bulk"} <= names
    work(settings, redis)
    order = sorted([high, normal, *bulk], key=lambda i: client.wait(i, timeout=5).finished_at or 0)
    assert order[:2] == [high, normal] and sorted(order[2:]) == sorted(bulk)


def lane_worker(settings: Settings, redis: Redis) -> Any:
    from laya.schema import LANES
    from laya.worker.lanes import LaneQueue
    from laya.worker.rqworker import LayaWorker, _StopSignal

    queues = [LaneQueue(Keys().queue_name("default", lane), connection=redis, serializer="json") for lane in LANES]
    with _StopSignal() as stop:
        return LayaWorker(queues, settings=settings, backend=LlamaBackend(settings), connection=redis, stop=stop,
                          name=f"lanes-{time.monotonic_ns()}")


def test_a_job_taken_from_a_lane_is_never_in_no_list_so_the_reaper_can_requeue_it(settings: Settings,
                                                                                  redis: Redis) -> None:
    client = Client(redis)
    bulk = client.submit("bulk job", priority="bulk")
    high = client.submit("high job", priority="high")
    router = route_all(settings, redis)
    bulk_queue, high_queue = router.queues[("default", "bulk")], router.queues[("default", "high")]
    worker = lane_worker(settings, redis)
    job, queue = worker.dequeue_job_and_maintain_ttl(timeout=1)  # a worker that dies right after this
    assert (job.id, queue.name) == (high, "laya:llm:default:high")
    assert high_queue.job_ids == [] and high_queue.intermediate_queue.get_job_ids() == [high]  # not lost
    ttl = settings.runtime.heartbeat_ttl_s
    router.reaper.run_once()
    router.reaper.run_once(now=time.time() + ttl + 1)
    assert high_queue.job_ids == [high]  # requeued: the next worker runs it
    work(settings, redis)
    assert client.wait(high, timeout=5).route == client.wait(bulk, timeout=5).route == "model:default"
    for lane_queue in (high_queue, bulk_queue):  # a started job leaves no id behind for the reaper to find
        assert lane_queue.intermediate_queue.get_job_ids() == []


def test_an_idle_worker_wakes_on_the_router_s_bell(settings: Settings, redis: Redis) -> None:
    from laya.worker.lanes import IDLE_RESCAN_S

    worker = lane_worker(settings, redis)
    taken: list[Any] = []

    def take() -> None:
        job = worker.dequeue_job_and_maintain_ttl(timeout=10)
        taken.append((time.monotonic(), job))

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    time.sleep(0.1)  # blocked on the bell now, with most of a rescan interval to go
    request_id = Client(redis).submit("bulk job", priority="bulk")
    sent = time.monotonic()
    route_all(settings, redis)
    thread.join(10)
    [(when, (job, _))] = taken
    assert job.id == request_id and when - sent < IDLE_RESCAN_S * 0.5  # the bell, not the rescan


def test_a_flood_of_bulk_never_refuses_a_high_request(settings: Settings, redis: Redis) -> None:
    settings = settings.model_copy(update={"router": settings.router.model_copy(update={"max_queue_depth": 3})})
    client = Client(redis)
    bulk = [client.submit(f"bulk {i}", priority="bulk") for i in range(5)]
    high = client.submit("urgent", priority="high")
    route_all(settings, redis)
    routes = [r.route if (r := client.result(i)) else "queued" for i in bulk]
    assert routes == ["queued"] * 3 + ["rejected:overloaded"] * 2
    assert "bulk lane" in client.result(bulk[-1]).error.message  # type: ignore[union-attr]
    assert client.result(high) is None and redis.llen("rq:queue:laya:llm:default:high") == 1


# -- deadlines ----------------------------------------------------------------------------------------


def test_a_job_not_started_by_its_deadline_is_answered_expired_without_running(
        settings: Settings, redis: Redis, caplog: pytest.LogCaptureFixture, counted_jobs: list[dict[str, Any]]) -> None:
    counted = counted_jobs
    client = Client(redis)
    late = client.submit("a story", deadline_s=0.4, stream=True, metadata={"job": "late"})
    fine = client.submit("another story", deadline_s=60)
    route_all(settings, redis)
    time.sleep(0.5)  # the queue was busy for longer than the producer would wait
    with caplog.at_level(logging.INFO, logger="laya.worker"):
        work(settings, redis)
    expired = client.wait(late, timeout=5)
    assert expired.route == "error:expired" and not expired.ok and expired.error is not None
    assert expired.model == "default" and expired.metadata == {"job": "late"}
    found = re.fullmatch(r'deadline_s 0\.4 passed (\d+\.\d) s before a worker could start the request; nothing ran\. '
                         r'Raise deadline_s, or send it with priority "high"', expired.error.message)
    assert found is not None, expired.error.message
    assert 0 <= float(found.group(1)) < 5  # seconds past the deadline, as measured
    assert f"request {late} expired in the queue; not run" in caplog.messages
    # What `rq info` and RQ's job record show for it.
    assert Job.fetch(late, connection=redis, serializer="json").return_value() == {"route": "error:expired"}
    assert {"outcome": "expired", "ttft_s": None, "rate": None, "prompt_tokens": 0, "cached_tokens": 0,
            "completion_tokens": 0} in [{k: v for k, v in c.items() if k != "queue_wait_s"} for c in counted]
    wait_s = next(c["queue_wait_s"] for c in counted if c["outcome"] == "expired")
    assert wait_s >= 0.4 and expired.timings.queue_wait_ms == pytest.approx(wait_s * 1000, rel=1e-9)
    assert expired.usage.completion_tokens == 0 and expired.timings.ttft_ms is None
    assert expired.timings.queue_wait_ms is not None and expired.timings.queue_wait_ms >= 400
    assert [i for i in client.follow(late, timeout=5)] == [expired]  # a streaming reader gets the end too
    # ... from the worker's end entry in the stream, which expires with the result (not from the fallback
    # that reads the result when a stream stays silent)
    stream_key = Keys().stream(late)
    entries = redis.xrange(stream_key)
    assert len(entries) == 1 and Result.model_validate_json(entries[0][1][END]) == expired
    assert 0 < redis.ttl(stream_key) <= settings.router.result_ttl_s
    assert client.wait(fine, timeout=5).route == "model:default"


def test_a_request_expired_before_routing_never_becomes_a_job(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    request_id = client.submit("a story", deadline_s=0.05)
    time.sleep(0.1)
    in_time = client.submit("another story")  # the same batch: admitted as if the expired one were not there
    route_all(settings, redis)
    result = client.wait(request_id, timeout=1)
    assert result.route == "error:expired" and result.error is not None
    assert result.error.message.startswith("deadline_s 0.05 passed before the router reached the request")
    assert result.error.message.endswith("nothing ran. Raise deadline_s")
    assert Queue("laya:llm:default:normal", connection=redis, serializer="json").job_ids == [in_time]


@pytest.fixture(scope="module")
def endless_q4km(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Qwen2.5-1.5B layers in Q4_K_M that never stop: decoding at a real model's pace on this CPU."""
    from tests.shapedmodel import SHAPES, write_shaped_model

    return write_shaped_model(tmp_path_factory.mktemp("endless") / "endless-q4_k_m.gguf",
                              SHAPES["qwen2.5-1.5b"].with_layers(2), "Q4_K_M", stops=False)


def test_generation_past_the_deadline_is_cut_with_the_text_so_far(settings: Settings, redis: Redis,
                                                                  endless_q4km: Path) -> None:
    settings = with_model(settings, endless_q4km)
    backend = LlamaBackend(settings)
    client = Client(redis)
    request_id = client.submit("a", max_tokens=4000, deadline_s=1.5)
    route_all(settings, redis)
    started = time.monotonic()
    work(settings, redis, backend)
    assert time.monotonic() - started < 5  # not the 4,000 tokens
    result = client.wait(request_id, timeout=5)
    assert result.ok and result.finish_reason == "deadline" and result.route == "model:default"
    assert 5 < result.usage.completion_tokens < 4000 and len(result.text or "") == result.usage.completion_tokens
    again = client.submit("a", max_tokens=4000, deadline_s=1.5)
    route_all(settings, redis)
    assert client.result(again) is None  # a cut answer is never cached


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"deadline_s": -1}, "deadline_s", ["-1", "greater than 0", "seconds from submit"]),
    ({"deadline_s": "soon"}, "deadline_s", ["'soon'", "seconds from submit"]),
    ({"priority": "urgent"}, "priority", ["'urgent'", "\"high\", \"normal\", \"bulk\""]),
    ({"stream": "yes"}, "stream", ["'yes'", "true or false"]),
    ({"response_format": {"type": "xml"}}, "response_format.type", ["'xml'", "json_object"]),
    ({"response_format": {"type": "json_schema"}}, "response_format", ["needs a 'schema'"]),
    ({"response_format": {"type": "json_schema", "schema": "{}"}}, "response_format.schema", ["'{}'"]),
])
def test_bad_pipeline_fields_name_the_field_the_value_and_the_fix(settings: Settings, redis: Redis,
                                                                  fields: dict[str, Any], field: str,
                                                                  words: list[str]) -> None:
    import orjson

    client = Client(redis)
    client.submit_raw({b"r": orjson.dumps({"id": "bad-field", "prompt": "x", **fields})})
    route_all(settings, redis)
    result = client.wait("bad-field", timeout=5)
    assert result.route == "error:invalid_request" and result.error is not None and result.error.field == field
    for word in words:
        assert word in result.error.message, result.error.message


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 0, "maxLength": 1000},
    {"type": "array", "items": {"type": "string"}, "minItems": 0, "maxItems": 1000},
    {"type": "string", "pattern": "^a{0,1000}$"},
    {"type": "string", "pattern": "^" + "a" * 3998 + "$"},  # 4000 characters
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
    functools.reduce(lambda inner, _: {"type": "array", "items": inner}, range(32), {"type": "string"}),
    {"type": "string", "description": functools.reduce(lambda inner, _: {"d": inner}, range(62), {})},  # 64 levels
    # 32 '$ref's in a chain (33 are refused); an 'allOf' part that refers to an object's properties without
    # 'type'; escaped brackets, which close nothing and are no stray one, and classes side by side; a '$defs' name
    # the grammar cannot take, referred to from an 'anyOf' (Pydantic's Optional[Tree[int]]); a value holding what
    # separates a grammar rule's name from its body.
    {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(31)} | {"d31": {"type": "string"}},
     "$ref": "#/$defs/d0"},
    {"type": "string", "pattern": "^a\\]\\}$"},
    {"type": "string", "pattern": "^[\\]]$"},
    {"type": "string", "pattern": "^[a-z][0-9]$"},
    {"$defs": {"Tree_int_": {"type": "object", "properties": {"value": {"type": "integer"}}}},
     "anyOf": [{"$ref": "#/$defs/Tree_int_"}, {"type": "null"}]},
    {"enum": ["x ::= y"]},
    {"$defs": {"Base": {"properties": {"a": {"type": "string"}}}}, "allOf": [{"$ref": "#/$defs/Base"}]},
    # Pydantic 1 writes 'definitions': a recursive one's name is renamed as in '$defs'.
    {"definitions": {"Node_1": {"type": "object", "properties": {"next": {
        "anyOf": [{"$ref": "#/definitions/Node_1"}, {"type": "null"}]}}}}, "$ref": "#/definitions/Node_1"},
])
def test_a_schema_at_each_limit_is_accepted(schema: dict[str, Any]) -> None:
    # The limits are the largest values llama.cpp takes, not one less; the subschemas of anyOf, oneOf, allOf and
    # prefixItems are read, not refused.
    from laya.schema import ResponseFormat
    from laya.structured import check_schema
    from laya.worker.grammar import grammar_for

    check_schema(schema)
    assert grammar_for(ResponseFormat.model_validate({"type": "json_schema", "schema": schema})) is not None


def test_references_that_fan_out_are_followed_once_each() -> None:
    # Each '$ref' the loop check has followed is remembered: through 'anyOf's of two references 30 levels deep
    # there are 2**30 paths, and a check that walked each of them would hold the router for hours.
    from laya.structured import check_schema

    schema = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
                        for i in range(30)} | {"d30": {"type": "string"}}, "$ref": "#/$defs/d0"}
    checking = threading.Thread(target=check_schema, args=(schema,), daemon=True)
    checking.start()
    checking.join(timeout=10)
    assert not checking.is_alive(), "the loop check walked every path through the references"


def test_renaming_a_definition_changes_only_the_references_to_it() -> None:
    # A '$defs' name the grammar cannot take is renamed, and so is each '$ref' to it, or into it; a name already
    # taken is never reused (one definition would replace the other), and a 'const' that reads like a reference is
    # a value, which the grammar must still write as it is.
    from laya.structured import _def_renames, _prepare

    for key in ("$defs", "definitions"):
        defs = {"c": {"type": "string"}, "Tree_int_": {"type": "object", "properties": {"v": {"type": "string"}}},
                "Tree-int": {"type": "integer"}, "a_b": {"type": "boolean"}, "a.b": {"type": "null"},
                "__": {"type": "number"}}
        refs = {name: {"$ref": f"#/{key}/{name}"} for name in defs}
        schema = {key: defs, "type": "object", "properties": {
            **refs, "y": {"const": f"#/{key}/a_b"}, "z": {"$ref": f"#/{key}/Tree_int_/properties/v"}}}
        prepared = _prepare(schema, _def_renames(schema))
        new = {"c": "c", "Tree_int_": "Tree-int-2", "Tree-int": "Tree-int", "a_b": "a-b", "a.b": "a-b-2", "__": "def"}
        assert prepared[key] == {new[name]: value for name, value in defs.items()}
        assert prepared["properties"] == {**{name: {"$ref": f"#/{key}/{new[name]}"} for name in defs},
                                          "y": {"const": f"#/{key}/a_b"},
                                          "z": {"$ref": f"#/{key}/Tree-int-2/properties/v"}}


def test_a_bounded_integer_in_the_definitions_of_a_top_level_ref_is_listed() -> None:
    # Pydantic's recursive model with a Field(ge=1, le=3): the converter reads the '$defs' beside the top-level
    # '$ref' only as the prepared schema gives them, so their bounds must be listed there too.
    from laya.structured import _def_renames, _prepare

    schema = {"$defs": {"Node": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                                 "required": ["n"]}}, "$ref": "#/$defs/Node"}
    assert _prepare(schema, _def_renames(schema))["$defs"]["Node"]["properties"]["n"] == {"enum": [1, 2, 3]}


def test_a_schema_the_converter_cannot_handle_is_a_request_error_in_the_worker() -> None:
    # A lookahead in a pattern passes the router's check, and the converter refuses it; the worker must answer
    # invalid_request, not fail the job with a traceback.
    from laya.errors import InvalidRequest
    from laya.schema import ResponseFormat
    from laya.worker.grammar import grammar_for

    # So does a bracket that never closes (the router's check for a stray one reads to the end of the pattern).
    for schema in ({"type": "string", "pattern": "^(?=x)a$"}, {"type": "string", "pattern": "^[ab$"}):
        with pytest.raises(InvalidRequest, match="converter refused it") as refused:
            grammar_for(ResponseFormat.model_validate({"type": "json_schema", "schema": schema}))
        assert refused.value.field == "response_format.schema"


def test_a_grammar_llama_cpp_cannot_read_is_refused_before_it_reaches_llama_cpp() -> None:
    # llama.cpp crashes the worker on a grammar it cannot parse; the converter writes one for a recursive '$ref'
    # whose last part is no rule name (here a property's name).
    from laya.errors import InvalidRequest
    from laya.schema import ResponseFormat
    from laya.worker.grammar import grammar_for

    schema = {"type": "object", "properties": {"my_node": {"type": "object", "properties": {
        "next": {"$ref": "#/properties/my_node"}}}}}
    with pytest.raises(InvalidRequest, match="grammar llama.cpp cannot read \\(rule name 'my_node'\\)") as refused:
        grammar_for(ResponseFormat.model_validate({"type": "json_schema", "schema": schema}))
    assert refused.value.field == "response_format.schema"


def test_the_grammar_check_refuses_a_rule_name_no_rule_defines() -> None:
    # llama.cpp crashes on a grammar that uses a rule it does not define, however well the rule is named.
    from laya.errors import InvalidRequest
    from laya.worker.grammar import check_grammar

    with pytest.raises(InvalidRequest, match="rule name 'item'"):
        check_grammar('root ::= "[" item "]"\n')


def test_a_value_of_any_type_is_any_json_value_not_only_an_object() -> None:
    # The converter reads an empty schema as any object: Pydantic's Any, and the values of extra="allow".
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from laya.structured import _def_renames, _prepare

    for schema in ({"type": "object", "properties": {"x": {"title": "Anything", "default": None}}},
                   {"type": "object", "properties": {"x": {}}},
                   {"type": "object", "properties": {}, "additionalProperties": True}):
        rules = dict(line.partition(" ::= ")[::2]
                     for line in json_schema_to_gbnf(json.dumps(_prepare(schema, _def_renames(schema)))).splitlines())
        value = rules.get("x", rules.get("additional-value", ""))  # the rule for the property's value
        assert value.split(" | ")[1:] == ["array", "string", "number", "boolean", "null"], rules


@pytest.mark.parametrize("schema", [
    {"type": "object", "additionalProperties": True, "title": "Meta"},  # Pydantic's dict[str, Any]
    {"title": "Anything", "default": None},  # Pydantic's Any: annotations only, so any value
    {"additionalProperties": True},
])
def test_a_schema_that_allows_any_value_or_any_object_gets_a_grammar(schema: dict[str, Any]) -> None:
    # The converter knew none of these (it reads a schema of annotations as one it does not know), and the router
    # let them through: the worker answered invalid_request for a schema that asks for nothing it cannot enforce.
    from laya.schema import ResponseFormat
    from laya.worker.grammar import grammar_for

    grammar_for(ResponseFormat.model_validate({"type": "json_schema", "schema": schema}))


def test_an_error_s_path_shows_the_start_of_a_long_property_name() -> None:
    from laya.errors import InvalidRequest
    from laya.structured import check_schema

    with pytest.raises(InvalidRequest) as raised:
        check_schema({"type": "object", "properties": {"n" * 100_000: {"not": {}}}})
    assert f"at #/properties/{'n' * 40}...: keyword 'not'" in raised.value.message
    assert len(raised.value.message) < 300


def test_the_converter_finishes_on_every_pattern_the_router_lets_through() -> None:
    # A ']' or '}' that closes nothing made the converter loop forever, holding the worker; 3,000 random patterns
    # over the characters that matter, each given half a second (a loop raises at the alarm).
    import random
    import signal

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from laya.errors import InvalidRequest
    from laya.structured import check_schema

    def too_long(*_: object) -> None:
        raise TimeoutError

    rng, hung = random.Random(7), []
    previous = signal.signal(signal.SIGALRM, too_long)
    try:
        for _ in range(3000):
            schema = {"type": "string", "pattern": "^" + "".join(rng.choices("ab[]{}()|*+?.\\-0123,:", k=8)) + "$"}
            try:
                check_schema(schema)
            except InvalidRequest:
                continue
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            try:
                json_schema_to_gbnf(json.dumps(schema))
            except TimeoutError:
                hung.append(schema["pattern"])
                break
            except Exception:  # noqa: BLE001, S112 - refusing is the converter's right; looping forever is not
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert hung == []


def test_the_worker_lists_a_bounded_integer_wherever_it_is_and_keeps_a_constant_whole() -> None:
    # The router leaves bounded integers unlisted; the worker must list them in lists, type lists and maps, and an
    # object given as 'const' or 'enum' is a value, not a schema to strip annotations from (mutation run's finds).
    from laya.structured import _def_renames, _prepare

    cases = [({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3}}, lambda p: p["items"]),
             ({"type": ["integer", "null"], "minimum": 1, "maximum": 3}, lambda p: p["anyOf"][0]),
             ({"type": "object", "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 3}},
              lambda p: p["additionalProperties"])]
    for schema, found in cases:
        assert found(_prepare(schema, _def_renames(schema)))["enum"] == [1, 2, 3]
    for key, value in (("const", {"title": "t"}), ("enum", [{"default": 1}])):
        assert _prepare({key: value}, {})[key] == value
