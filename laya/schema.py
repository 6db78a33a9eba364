"""Request and result records: what producers send and what they get back.

A request carries a prompt *or* chat messages, generation parameters, an
optional target model and free-form metadata. Its ``id`` follows it from submit
to result. Every request ends in exactly one :class:`Result` whose ``route``
says how it was answered: ``cache``, ``cache:semantic``, ``rule:<name>``, ``model:<name>``,
``error:<code>`` or ``rejected:overloaded``.

Pipelines can ask for more than text: ``response_format`` (JSON that parses,
optionally to a JSON schema), ``stream`` (chunks as they are generated),
``priority`` (which lane of the model's queue) and ``deadline_s`` (when to stop
caring). :mod:`laya.structured` and :mod:`laya.streaming` hold the details.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

__all__ = ["LANES", "ErrorInfo", "Lane", "Message", "Request", "ResponseFormat", "Result", "Timings", "Usage",
           "new_request_id"]

REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
"""Letters, digits, ``_`` and ``-``: the id is also the RQ job id, and RQ accepts nothing else."""

MetaValue = StrictStr | StrictInt | StrictFloat | StrictBool | None

Lane = Literal["high", "normal", "bulk"]
LANES: tuple[Lane, ...] = ("high", "normal", "bulk")
"""Priority lanes, highest first: a worker always takes its next job from the highest non-empty lane."""

MAX_DEADLINE_S = 7 * 86_400


def new_request_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: StrictStr


class ResponseFormat(BaseModel):
    """Structured output: ``{"type": "json_object"}``, or ``{"type": "json_schema", "schema": {...}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    type: Literal["json_object", "json_schema"]
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="A JSON schema (an object).")

    @model_validator(mode="after")
    def _schema_goes_with_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("'json_schema' needs a 'schema' object; or use {\"type\": \"json_object\"} for any "
                             "JSON object")
        if self.type == "json_object" and self.schema_ is not None:
            raise ValueError("'json_object' takes no 'schema'; use {\"type\": \"json_schema\", \"schema\": ...}")
        return self


class Request(BaseModel):
    """One text request. Unknown fields are refused so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(pattern=REQUEST_ID_PATTERN)] = Field(default_factory=new_request_id)
    prompt: StrictStr | None = None
    messages: list[Message] | None = None
    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None
    max_tokens: StrictInt | None = Field(None, ge=1, description="Default: runtime.default_max_tokens.")
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: StrictInt = Field(40, ge=0, le=100_000)
    repeat_penalty: float = Field(1.0, ge=0.0, le=10.0)
    seed: StrictInt | None = Field(None, ge=0, le=2**32 - 1)
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(default_factory=list, max_length=16)
    cache: bool | Literal["semantic"] = Field(
        True, description="true: the exact response cache; \"semantic\": the exact cache, then the semantic cache "
        "where the model allows it; false: neither.")
    metadata: dict[Annotated[str, Field(max_length=128)], MetaValue] = Field(default_factory=dict, max_length=64)
    reply_to: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = Field(
        None, description="Shared reply channel of a producer waiting on many requests."
    )
    submitted_at: float | None = Field(None, description="Producer's clock (unix seconds) at submit.")
    priority: Lane = Field("normal", description="Queue lane: high, normal or bulk.")
    deadline_s: float | None = Field(
        None, gt=0, le=MAX_DEADLINE_S,
        description="Seconds from submit: not started by then is answered error:expired; still generating is cut.")
    response_format: ResponseFormat | None = Field(None, description="Ask for JSON (any object, or to a schema).")
    stream: StrictBool = Field(False, description="Append text chunks to the request's stream as they come.")

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_mode(cls, value: Any) -> Any:
        if value is True or value is False or value == "semantic":
            return value
        raise ValueError("must be true, false or \"semantic\"")

    @model_validator(mode="after")
    def _one_input(self) -> Request:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("'prompt' is empty; send the text to answer")
        if self.messages is not None and not any(m.content.strip() for m in self.messages):
            raise ValueError("'messages' is empty; send at least one message with content")
        return self

    @property
    def text(self) -> str:
        """The text rules and the cache look at: the prompt, or the last user message."""
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None
        for message in reversed(self.messages):
            if message.role == "user":
                return message.content
        return self.messages[-1].content


class ErrorInfo(BaseModel):
    code: str
    message: str
    field: str | None = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Timings(BaseModel):
    """How long each stage took. Absent stages stay ``None``."""

    route_us: float | None = Field(None, description="Router decision: decode to verdict, microseconds.")
    queue_wait_ms: float | None = None
    ttft_ms: float | None = Field(None, description="Job start to first token.")
    generation_ms: float | None = None
    tokens_per_s: float | None = None
    total_ms: float | None = Field(None, description="Producer submit to result written.")


class Result(BaseModel):
    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    id: str
    route: str
    ok: bool
    text: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    """``stop``, ``length`` (max_tokens), ``context`` (window full), ``deadline`` (``deadline_s`` passed), ``rule``."""
    json_value: Any = Field(None, alias="json", description="The parsed answer of a request with response_format.")
    similarity: float | None = Field(None, description="cache:semantic and semantic intents: how similar the "
                                     "prompt was to the stored prompt or the intent's example (cosine, 0-1).")
    error: ErrorInfo | None = None
    retry_after_s: float | None = None
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    finished_at: float | None = None

    @property
    def kind(self) -> str:
        """``cache``, ``rule``, ``model``, ``error`` or ``rejected``."""
        return self.route.partition(":")[0]
