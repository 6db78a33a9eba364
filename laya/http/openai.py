"""OpenAI's request and response shapes, translated to Laya's and back.

Pure functions, no I/O: :func:`chat_request` and :func:`completion_request` turn
a body as OpenAI's SDKs send it into a :class:`~laya.schema.Request` (or raise
:class:`~laya.errors.InvalidRequest` naming the field), and the ``*_response`` /
``*_chunk`` functions turn a :class:`~laya.schema.Result` back into OpenAI's JSON.

What maps to what:

* ``max_tokens`` and ``max_completion_tokens`` are ``max_tokens``; ``stop``
  may be a string or a list; ``user`` goes into ``metadata["user"]``; ``n``
  must be 1 (the queue runs one answer per job);
* ``response_format``: ``{"type": "text"}`` is plain text, ``json_object`` is
  Laya's, and ``json_schema`` with ``{"name", "schema", "strict"}`` is Laya's
  ``json_schema`` (Laya always enforces the schema, so ``strict`` changes nothing);
* Laya's own fields ride in the body, as the SDKs send ``extra_body``:
  ``priority``, ``deadline_s``, ``cache``, ``metadata``, ``top_k``,
  ``repeat_penalty``;
* OpenAI fields Laya has no use for are accepted at their neutral value
  (``frequency_penalty: 0``, ``logprobs: false``, no tools...) and refused,
  naming the field, at any other; an unknown field is refused.

``finish_reason``: Laya's ``stop`` and ``length`` are OpenAI's; ``context``
(the window filled) and ``deadline`` (``deadline_s`` passed while generating)
are ``length``, since the text was cut; a rule's or the cache's answer is
``stop``. Laya's own value is in the response's ``laya`` object.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from laya.config import error_message
from laya.errors import InvalidRequest
from laya.schema import Request, Result

__all__ = ["OPENAI_FINISH", "chat_chunk", "chat_request", "chat_response", "completion_chunk", "completion_request",
           "completion_response", "laya_facts", "usage"]

OPENAI_FINISH = {"stop": "stop", "length": "length", "context": "length", "deadline": "length", "rule": "stop"}

_LAYA_FIELDS = ("priority", "deadline_s", "cache", "metadata", "top_k", "repeat_penalty")
_SHARED_FIELDS = ("model", "temperature", "top_p", "seed")
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0, None), "presence_penalty": (0, 0.0, None), "logprobs": (False, None),
    "top_logprobs": (None, 0), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False), "functions": (None, []), "function_call": (None, "none", "auto"),
    "service_tier": (None, "auto", "default"), "store": (None, False), "suffix": (None, ""), "echo": (None, False),
    "best_of": (None, 1), "modalities": (None, ["text"]), "reasoning_effort": (None,), "prediction": (None,),
    "audio": (None,), "web_search_options": (None,),
}
"""OpenAI fields Laya does not use, with the values that ask for nothing it would ignore."""
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_request(body: Any, *, request_id: str | None = None) -> Request:
    """The Laya request of a ``/v1/chat/completions`` body."""
    body = _object(body)
    fields = _common(body, extra=("messages",))
    fields["messages"] = _messages(body.get("messages"))
    return _request(fields, request_id)


def completion_request(body: Any, *, request_id: str | None = None) -> Request:
    """The Laya request of a ``/v1/completions`` body."""
    body = _object(body)
    fields = _common(body, extra=("prompt",))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _invalid("prompt", "must be a string (one prompt per request; send several requests for several)")
    fields["prompt"] = prompt
    return _request(fields, request_id)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object, as OpenAI's API takes it", field=None,
                             code="invalid_json")
    return body


def _common(body: dict[str, Any], *, extra: tuple[str, ...]) -> dict[str, Any]:
    """The fields both endpoints share, checked; ``extra`` names the endpoint's own input field."""
    known = {*_SHARED_FIELDS, *_LAYA_FIELDS, *_NEUTRAL, *extra, "max_tokens", "max_completion_tokens", "stop", "user",
             "n", "stream", "stream_options", "response_format"}
    for name in body:
        if name not in known:
            raise _invalid(name, f"is not a field Laya takes; the fields are {', '.join(sorted(known))}")
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise _invalid(name, f"= {body[name]!r:.80} is not supported; leave it out (Laya runs plain generation)")
    if body.get("n", 1) != 1:
        raise _invalid("n", f"= {body['n']!r:.40}: Laya gives one answer per request; send n requests instead")
    fields = {name: body[name] for name in (*_SHARED_FIELDS, *_LAYA_FIELDS) if body.get(name) is not None}
    budgets = {name: body[name] for name in ("max_completion_tokens", "max_tokens") if body.get(name) is not None}
    if len(set(map(repr, budgets.values()))) > 1:
        raise _invalid("max_tokens", "and max_completion_tokens differ; send one of them")
    if budgets:
        fields["max_tokens"] = next(iter(budgets.values()))
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    user = body.get("user")
    if user is not None:
        metadata = fields.get("metadata")
        fields["metadata"] = {**(metadata if isinstance(metadata, dict) else {}), "user": user}
    stream = body.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            raise _invalid("stream", "must be true or false")
        fields["stream"] = stream
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise _invalid("stream_options", 'takes only {"include_usage": true or false}')
    response_format = _response_format(body.get("response_format"))
    if response_format is not None:
        fields["response_format"] = response_format
    return fields


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise _invalid("messages", 'must be a non-empty list of {"role", "content"} objects')
    messages = []
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise _invalid(where, 'must be an object {"role": "user", "content": "..."}')
        role = message.get("role")
        if role not in _ROLES:
            raise _invalid(f"{where}.role", f"= {role!r:.40}: Laya takes system, developer, user and assistant "
                                            "messages (no tools)")
        unknown = set(message) - {"role", "content", "name"}
        if unknown:
            raise _invalid(f"{where}.{min(unknown)}", "is not supported; a message holds role and content")
        messages.append({"role": _ROLES[role], "content": _content(message.get("content"), where)})
    return messages


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid(f"{where}.content.{j}", 'must be a text part {"type": "text", "text": "..."} '
                                                      "(Laya's models read text only)")
            texts.append(part["text"])
        return "".join(texts)
    raise _invalid(f"{where}.content", "must be a string, or a list of text parts")


def _response_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text" and set(raw) == {"type"}:
        return None
    if kind == "json_object" and set(raw) == {"type"}:
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(raw, dict) and set(raw) <= {"type", "json_schema"}:
        spec = raw.get("json_schema")
        if isinstance(spec, dict) and isinstance(spec.get("schema"), dict) and set(spec) <= {
                "name", "schema", "strict", "description"}:
            return {"type": "json_schema", "schema": spec["schema"]}
        raise _invalid("response_format.json_schema", 'must be {"name": "...", "schema": {...}, "strict": true}')
    raise _invalid("response_format", 'must be {"type": "text"}, {"type": "json_object"} or '
                                      '{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}')


def _request(fields: dict[str, Any], request_id: str | None) -> Request:
    if request_id is not None:
        fields["id"] = request_id
    try:
        return Request.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest(f"{field + ': ' if field else ''}{error_message(first, mapping='an object')}",
                             field=field) from None


def _invalid(field: str | None, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field + ' ' if field else ''}{problem}", field=field)


def usage(result: Result) -> dict[str, int]:
    prompt, completion = result.usage.prompt_tokens, result.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def laya_facts(result: Result) -> dict[str, Any]:
    """Laya's own facts about an answer: how it was routed, its finish reason, its timings."""
    facts: dict[str, Any] = {"route": result.route, "finish_reason": result.finish_reason,
                             "timings": result.timings.model_dump(exclude_none=True)}
    if result.similarity is not None:
        facts["similarity"] = result.similarity
    if result.metadata:
        facts["metadata"] = result.metadata
    return facts


def _finish(result: Result) -> str:
    return OPENAI_FINISH.get(result.finish_reason or "stop", "stop")


def chat_response(result: Result, *, model: str, created: int) -> dict[str, Any]:
    return {"id": result.id, "object": "chat.completion", "created": created, "model": result.model or model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text or ""},
                         "finish_reason": _finish(result), "logprobs": None}],
            "usage": usage(result), "laya": laya_facts(result)}


def completion_response(result: Result, *, model: str, created: int) -> dict[str, Any]:
    return {"id": result.id, "object": "text_completion", "created": created, "model": result.model or model,
            "choices": [{"index": 0, "text": result.text or "", "finish_reason": _finish(result), "logprobs": None}],
            "usage": usage(result), "laya": laya_facts(result)}


def chat_chunk(request_id: str, *, model: str, created: int, text: str | None = None, first: bool = False,
               result: Result | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``: the role first, then text, then the finish reason from ``result``."""
    delta: dict[str, Any] = {"role": "assistant"} if first else {}
    if text:
        delta["content"] = text
    chunk: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": _finish(result) if result is not None else None}]}
    if result is not None:
        chunk["laya"] = laya_facts(result)
    return chunk


def completion_chunk(request_id: str, *, model: str, created: int, text: str | None = None,
                     result: Result | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                             "choices": [{"index": 0, "text": text or "", "logprobs": None,
                                          "finish_reason": _finish(result) if result is not None else None}]}
    if result is not None:
        chunk["laya"] = laya_facts(result)
    return chunk
