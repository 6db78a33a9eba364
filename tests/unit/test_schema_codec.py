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


@pytest.mark.parametrize(("fields", "code", "field", "says"), [
    ({b"x": b"1"}, "invalid_request", "r", ["got 'x'", "XADD the request JSON under the field 'r'"]),
    ({k.encode(): b"1" for k in "abcdef"}, "invalid_request", "r", ["(got 'a', 'b', 'c', 'd', 'e'); "]),
    ({}, "invalid_request", "r", ["(got no fields); "]),
    ({b"r": b"{not json"}, "invalid_json", None,
     ["not valid UTF-8 JSON", "line 1 column 2", "encode it with a JSON library"]),
    ({b"r": b"\xff\xfe\x00"}, "invalid_json", None, ["str is not valid UTF-8", "as UTF-8"]),
    ({b"r": b"[1, 2]"}, "invalid_request", None,
     ["must be a JSON object, got an array", 'send {"prompt": "..."} or {"messages": [...]}']),
    ({b"r": b"7"}, "invalid_request", None, ["got a number (7)", 'send {"prompt": "..."}']),
    (entry({"prompt": 42}), "invalid_request", "prompt", ["'prompt' = 42", "should be a valid string"]),
    (entry({"prompt": "   "}), "invalid_request", None, ["'prompt' is empty", "send the text"]),
    (entry({}), "invalid_request", None, ["give exactly one of 'prompt' or 'messages'"]),
    (entry({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}), "invalid_request", None,
     ["give exactly one of 'prompt' or 'messages'"]),
    (entry({"prompt": "a", "colour": "red"}), "invalid_request", "colour",
     ["'colour' = 'red'", "remove it", "fields are id, prompt, messages"]),
    (entry({"messages": [{"role": "user", "content": "a", "name": "bob"}]}), "invalid_request", "messages.0.name",
     ["'messages.0.name' = 'bob'", "remove it; a message's fields are role, content"]),
    (entry({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}), "invalid_request",
     "messages.0.content", ["<list of 1 items>", "content is one string (join a message's text parts into it)"]),
    (entry({"messages": [{"role": "tool", "content": "a"}]}), "invalid_request", "messages.0.role",
     ["'tool'", "\"role\": \"system\", \"user\" or \"assistant\""]),
    (entry({"prompt": "a", "max_tokens": -1}), "invalid_request", "max_tokens",
     ["'max_tokens' = -1", "greater than or equal to 1"]),
    (entry({"prompt": "a", "max_tokens": 101}), "invalid_request", "max_tokens",
     ["'max_tokens' = 101", "over the limit of 100", "runtime.max_tokens_limit"]),
    (entry({"prompt": "a", "temperature": "hot"}), "invalid_request", "temperature",
     ["'temperature' = 'hot'", "should be a valid number"]),
    (entry({"prompt": "a\x00b"}), "invalid_request", "prompt", ["NUL characters", "strip them"]),
    (entry({"messages": [{"role": "user", "content": "a\x00b"}]}), "invalid_request", "prompt",
     ["NUL characters", "strip them"]),
    (entry({"prompt": "a", "model": "gpt-9"}), "unknown_model", "model", ["'model' = 'gpt-9'", "known: default"]),
    (entry({"prompt": "a", "id": "has space"}), "invalid_request", "id",
     ["'id' = 'has space'", "use 1-128 letters, digits, '_' or '-'", "or leave it out"]),
    (entry({"prompt": "x" * 20_000}), "too_large", None,
     ["20013 bytes", "over the limit of 10000", "send a shorter prompt or split the work"]),
    (entry({"messages": [{"role": "user", "content": "m"}] * 5}), "too_large", "messages",
     ["5 messages", "over the limit of 4", "shorten the conversation"]),
    ({b"r": b"[" * 5000 + b"]" * 5000}, "invalid_json", None, ["depth limit exceeded", "encode it with a JSON"]),
])
def test_bad_entries_give_a_code_and_say_what_to_fix(fields: dict[bytes, bytes], code: str, field: str | None,
                                                     says: list[str]) -> None:
    """The code, the field, the value that was wrong and what to do about it (the README's promise)."""
    with pytest.raises(RequestError) as info:
        decode_request(fields, LIMITS)
    assert info.value.code == code
    assert info.value.field == field
    for part in says:
        assert part in info.value.message


def test_a_value_too_long_to_show_is_cut_and_a_container_is_described() -> None:
    with pytest.raises(RequestError) as info:
        decode_request(entry({"prompt": "a", "stop": "s" * 500}), LIMITS)
    assert "'stop' = 'sssss" in info.value.message and "..." in info.value.message
    assert len(info.value.message) < 300
    with pytest.raises(RequestError) as info:
        decode_request(entry({"prompt": ["a"] * 1000}), LIMITS)
    assert "'prompt' = <list of 1000 items>" in info.value.message


def test_a_value_is_shown_whole_up_to_80_characters_then_cut_to_80() -> None:
    for n, shown in ((78, repr("!" * 78)), (79, repr("!" * 79)[:77] + "...")):
        with pytest.raises(RequestError) as info:
            decode_request(entry({"prompt": "a", "id": "!" * n}), LIMITS)
        assert len(shown) == 80 and info.value.message.startswith(f"field 'id' = {shown}: ")


def test_several_problems_are_counted() -> None:
    with pytest.raises(RequestError) as info:
        decode_request(entry({"prompt": 5, "temperature": "hot", "top_k": "x"}), LIMITS)
    assert info.value.message.endswith("(and 2 more problems)")


def test_unknown_model_lists_the_known_ones() -> None:
    limits = Limits(models=frozenset({"default", "big"}))
    with pytest.raises(UnknownModel, match="known: big, default$"):
        decode_request(entry({"prompt": "a", "model": "nope"}), limits)


def test_max_tokens_at_the_limit_is_accepted() -> None:
    assert decode_request(entry({"prompt": "a", "max_tokens": 100}), LIMITS).max_tokens == 100


def test_salvage_identity_keeps_a_valid_id_and_reply_channel() -> None:
    fields = entry({"id": "job-1", "reply_to": "chan", "prompt": 3})
    assert salvage_identity(fields, "1-0") == ("job-1", "chan")
    assert salvage_identity({b"r": b"garbage"}, "1-0") == ("1-0", None)
    assert salvage_identity(entry({"id": "bad id!", "reply_to": "../x"}), "2-0") == ("2-0", None)
    # "$" also matches before a final line break: such an id and channel were once taken as they were.
    assert salvage_identity(entry({"id": "abc\n", "reply_to": "chan\n", "prompt": 3}), "3-0") == ("3-0", None)


def test_salvage_identity_reads_entries_up_to_4_mb_only() -> None:
    """Past the bound, parsing a hostile entry only to name its error costs more than the name is worth."""
    head = b'{"id": "job-1", "prompt": "'

    def sized(n: int) -> dict[bytes, bytes]:
        return {b"r": head + b"x" * (n - len(head) - 2) + b'"}'}

    assert len(sized(4_000_000)[b"r"]) == 4_000_000
    assert salvage_identity(sized(4_000_000), "1-0") == ("job-1", None)
    assert salvage_identity(sized(4_000_001), "1-0") == ("1-0", None)


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
