from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laya.codec import Limits, decode_request, encode_request, salvage_identity
from laya.errors import InvalidRequest, RequestError, UnknownModel
from laya.schema import Request

LIMITS = Limits(max_request_bytes=10_000, max_messages=4, max_tokens_limit=100, models=frozenset({"default"}))


def entry(obj: object) -> dict[bytes, bytes]:
    return {b"r": orjson.dumps(obj)}


def test_round_trip_keeps_every_field() -> None:
    request = Request(prompt="Hi there", max_tokens=12, stop=["\n"], metadata={"job": 7})
    decoded = decode_request({b"r": encode_request(request)}, LIMITS)
    assert decoded == request


def test_chat_request_text_is_last_user_message() -> None:
    request = decode_request(entry({"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]}), LIMITS)
    assert request.text == "second"


@pytest.mark.parametrize(("fields", "code", "field"), [
    ({b"x": b"1"}, "invalid_request", "r"),
    ({b"r": b"{not json"}, "invalid_json", None),
    ({b"r": b"\xff\xfe\x00"}, "invalid_json", None),
    ({b"r": b"[1, 2]"}, "invalid_request", None),
    (entry({"prompt": 42}), "invalid_request", "prompt"),
    (entry({"prompt": "   "}), "invalid_request", None),
    (entry({}), "invalid_request", None),
    (entry({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}), "invalid_request", None),
    (entry({"prompt": "a", "colour": "red"}), "invalid_request", "colour"),
    (entry({"prompt": "a", "max_tokens": -1}), "invalid_request", "max_tokens"),
    (entry({"prompt": "a", "max_tokens": 101}), "invalid_request", "max_tokens"),
    (entry({"prompt": "a", "temperature": "hot"}), "invalid_request", "temperature"),
    (entry({"prompt": "a\x00b"}), "invalid_request", "prompt"),
    (entry({"prompt": "a", "model": "gpt-9"}), "unknown_model", "model"),
    (entry({"prompt": "a", "id": "has space"}), "invalid_request", "id"),
    (entry({"prompt": "x" * 20_000}), "too_large", None),
    (entry({"messages": [{"role": "user", "content": "m"}] * 5}), "too_large", "messages"),
    ({b"r": b"[" * 5000 + b"]" * 5000}, "invalid_json", None),
])
def test_bad_entries_give_a_code_and_say_what_to_fix(fields: dict[bytes, bytes], code: str, field: str | None) -> None:
    with pytest.raises(RequestError) as info:
        decode_request(fields, LIMITS)
    assert info.value.code == code
    assert info.value.field == field
    assert len(info.value.message) > 10


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownModel, match="known: default"):
        decode_request(entry({"prompt": "a", "model": "nope"}), LIMITS)


def test_salvage_identity_keeps_a_valid_id_and_reply_channel() -> None:
    fields = entry({"id": "job-1", "reply_to": "chan", "prompt": 3})
    assert salvage_identity(fields, "1-0") == ("job-1", "chan")
    assert salvage_identity({b"r": b"garbage"}, "1-0") == ("1-0", None)
    assert salvage_identity(entry({"id": "bad id!", "reply_to": "../x"}), "2-0") == ("2-0", None)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.binary(max_size=4), st.binary(max_size=300), max_size=3))
def test_any_bytes_decode_or_raise_request_error(fields: dict[bytes, bytes]) -> None:
    try:
        decode_request(fields, LIMITS)
    except RequestError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=20))
def test_any_json_value_decodes_or_raises_request_error(value: object) -> None:
    try:
        raw = json.dumps({"prompt": "p", "metadata": value}).encode()  # stdlib: big ints, NaN too
        request = decode_request({b"r": raw}, LIMITS)
    except RequestError:
        return
    assert request.prompt == "p"


def test_client_side_validation_raises_invalid_request() -> None:
    import fakeredis

    from laya.client import Client

    client = Client(fakeredis.FakeRedis())
    with pytest.raises(InvalidRequest, match="empty"):
        client.submit("  ")
    request_id = client.submit("fine", max_tokens=5)
    entries = client.redis.xrange("laya:ingress")
    assert len(entries) == 1
    assert orjson.loads(entries[0][1][b"r"])["id"] == request_id
