"""Wire format: requests in stream entries, results as JSON, all through orjson.

A producer XADDs one entry per request with a single field ``r`` holding the
request as JSON. Decoding never raises anything but :class:`RequestError`, so a
hostile entry turns into an error result instead of a crashed router.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from laya.config import error_message
from laya.errors import InvalidRequest, UnknownModel
from laya.schema import REQUEST_ID_PATTERN, Message, Request, Result
from laya.structured import check_schema

__all__ = ["Limits", "decode_request", "decode_result", "encode_request", "encode_result", "error_fields",
           "error_result", "json_kind", "salvage_identity"]

FIELD = b"r"
_ID_RE = re.compile(REQUEST_ID_PATTERN)
_REPLY_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the router accepts; taken from the config once at start."""

    max_request_bytes: int = 1_000_000
    max_messages: int = 256
    max_tokens_limit: int = 4096
    models: frozenset[str] = frozenset({"default"})


def encode_request(request: Request) -> bytes:
    return Request.__pydantic_serializer__.to_json(request, exclude_none=True)


def encode_result(result: Result) -> bytes:
    return Result.__pydantic_serializer__.to_json(result, exclude_none=True)


def decode_result(data: bytes | str) -> Result:
    return Result.model_validate_json(data)


_PATTERN_HINTS = {
    "id": "use 1-128 letters, digits, '_' or '-' (it is also the RQ job id), or leave it out",
    "model": "use a model name from the config's [router] models",
    "reply_to": "use 1-64 letters, digits, '.', '_' or '-'",
}
_FIELD_HINTS = {
    "priority": ("use one of \"high\", \"normal\", \"bulk\", or leave it out for the default lane (normal; bulk "
                 "in `laya batch`)"),
    "deadline_s": "give the seconds from submit after which the answer is no longer wanted (> 0, at most 7 days), "
                  "or leave it out",
    "response_format": "use {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"schema\": {...}}",
    "stream": "use true or false",
    "messages": ("give a list of {\"role\": \"system\", \"user\" or \"assistant\", \"content\": \"the text\"}; "
                 "content is one string (join a message's text parts into it)"),
    "cache": "use true (the exact cache), \"semantic\" (the exact cache, then answers to prompts that mean the same, "
             "where the model allows it) or false",
}


def _describe_validation(error: ValidationError) -> InvalidRequest:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    shown = _short_repr(first.get("input"))
    where = f"field '{field}' = {shown}: " if field else ""
    hint = _PATTERN_HINTS.get(field or "") if first["type"] == "string_pattern_mismatch" else None
    hint = hint or _FIELD_HINTS.get((field or "").split(".")[0])
    if first["type"] == "extra_forbidden":
        owner, fields = ("a message", Message.model_fields) if field and field.startswith("messages.") else (
            "a request", Request.model_fields)
        hint = f"remove it; {owner}'s fields are {', '.join(fields)}"
    extra = f" (and {error.error_count() - 1} more problems)" if error.error_count() > 1 else ""
    # Only pydantic's "Value error, " prefix goes: the rest of its wording is what producers match today.
    message = error_message(first) if first["type"] == "value_error" else first["msg"]
    return InvalidRequest(f"{where}{message}{'; ' + hint if hint else ''}{extra}", field=field)


def json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words (``null``, not Python's ``NoneType``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def _short_repr(value: Any) -> str:
    """A bounded description of a hostile value (containers may nest thousands deep)."""
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def decode_request(fields: Mapping[bytes, bytes], limits: Limits) -> Request:
    """Turn one stream entry into a validated :class:`Request`, or raise :class:`RequestError`."""
    raw = fields.get(FIELD)
    if raw is None:
        names = ", ".join(repr(k.decode("utf-8", "replace")) for k in list(fields)[:5])
        raise InvalidRequest(f"stream entry has no 'r' field (got {names or 'no fields'}); "
                             "XADD the request JSON under the field 'r'", field="r")
    if len(raw) > limits.max_request_bytes:
        raise InvalidRequest(
            f"request is {len(raw)} bytes, over the limit of {limits.max_request_bytes}; "
            "send a shorter prompt or split the work", code="too_large")
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request is not valid UTF-8 JSON ({exc}); encode it with a JSON library, "
                             "as UTF-8", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"request must be a JSON object, got {json_kind(data)}; "
                             'send {"prompt": "..."} or {"messages": [...]}')
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise InvalidRequest(
            f"{len(messages)} messages, over the limit of {limits.max_messages}; shorten the conversation",
            code="too_large", field="messages")
    try:
        request = Request.model_validate(data)
    except ValidationError as exc:
        raise _describe_validation(exc) from None
    text = request.prompt if request.prompt is not None else "".join(m.content for m in request.messages or ())
    if "\x00" in text:
        raise InvalidRequest("text contains NUL characters; strip them before sending", field="prompt")
    if request.max_tokens is not None and request.max_tokens > limits.max_tokens_limit:
        raise InvalidRequest(
            f"field 'max_tokens' = {request.max_tokens}: over the limit of {limits.max_tokens_limit} "
            "(runtime.max_tokens_limit)", field="max_tokens")
    if request.response_format is not None and request.response_format.schema_ is not None:
        check_schema(request.response_format.schema_)
    if request.model is not None and request.model not in limits.models:
        known = ", ".join(sorted(limits.models))
        raise UnknownModel(f"field 'model' = {request.model!r}: no such model; known: {known}", field="model")
    return request


def salvage_identity(fields: Mapping[bytes, bytes], entry_id: str) -> tuple[str, str | None]:
    """Best-effort (request id, reply channel) of an entry that failed to decode.

    The id falls back to the stream entry id, which the producer got from XADD.
    """
    raw = fields.get(FIELD)
    if raw is not None and len(raw) <= 4_000_000:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            rid, reply = data.get("id"), data.get("reply_to")
            good_id = rid if isinstance(rid, str) and _ID_RE.fullmatch(rid) else entry_id
            good_reply = reply if isinstance(reply, str) and _REPLY_RE.fullmatch(reply) else None
            return good_id, good_reply
    return entry_id, None


def error_fields(error: Exception) -> dict[str, Any]:
    """The result fields that report ``error``: route ``error:<code>`` and the code, message and field."""
    code = getattr(error, "code", "internal")
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return {"route": f"error:{code}", "ok": False,
            "error": {"code": code, "message": message, "field": getattr(error, "field", None)}}


def error_result(request_id: str, error: Exception, **extra: Any) -> Result:
    return Result.model_validate({"id": request_id, **error_fields(error), **extra})
