"""What the router and the worker hand each other through Redis, as typed records.

The router and the worker run in different processes (often on different
hosts) and never import each other. Everything that crosses between them is
defined here, once, with its encoding:

* :class:`JobPayload`: the one argument of every RQ job the router enqueues,
  the request and what the router worked out for it;
* :data:`JOB_FUNCTION`: the job function's import path, which RQ stores in the
  job record (a string, so the router names it without importing the worker);
  :func:`is_laya_job` checks a job names it and nothing else;
* :class:`CachedAnswer`: a model answer the worker stores under the exact
  cache key and the router answers a repeat from;
* :class:`SemanticLogEntry`: a cacheable answer the worker appends to the
  semantic log, which routers index by meaning;
* :func:`ring`: the wake-up signal, the model's *bell* list that the router
  pushes to in the same write that enqueues jobs and idle workers block on.

Renaming a field here changes both sides at once, and the type checker sees
every reader.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from laya.codec import error_result
from laya.schema import Request, Result

if TYPE_CHECKING:
    from redis.client import Pipeline
    from rq.job import Job

    from laya.errors import LayaError

__all__ = ["ALLOWED_FUNCTIONS", "JOB_FUNCTION", "MAX_RINGS", "SEMANTIC_LOG_FIELD", "CachedAnswer", "JobPayload",
           "SemanticLogEntry", "cacheable", "is_laya_job", "job_error_result", "job_reply_to", "ring"]

JOB_FUNCTION = "laya.worker.jobs.generate"
"""The import path RQ calls for every Laya job (``tests/unit/test_contract.py`` checks the worker defines it)."""
ALLOWED_FUNCTIONS = frozenset({JOB_FUNCTION})

MAX_RINGS = 16
"""Bell entries kept: enough to wake every worker of a model, bounded when none is running."""

SEMANTIC_LOG_FIELD = "e"
"""The one field of a semantic-log stream entry: the JSON of a :class:`SemanticLogEntry`."""


class JobPayload(BaseModel):
    """The argument of a Laya job: the request, and the router's decisions about it."""

    model_config = ConfigDict(frozen=True)

    request: Request
    model: str = Field(description="The model that runs it (the worker's queue is this model's).")
    lane: str = Field("normal", description="The priority lane it was queued in: high, normal or bulk.")
    max_tokens: int = Field(description="The effective budget: the request's, or the model's default.")
    routed_at: float = Field(description="Unix time the router enqueued it; the worker measures queue wait from it.")
    route_us: float | None = Field(None, description="The router's decision time, microseconds.")
    expires_at: float | None = Field(None, description="Unix time its deadline_s passes; None without a deadline.")
    cache_key: str | None = Field(None, description="Exact-cache digest; None when the request is not cached.")
    semantic_scope: str | None = Field(None, description="Semantic-cache bucket; set when a semantic lookup missed.")

    def encode(self) -> dict[str, Any]:
        """The job argument as RQ's JSON serializer stores it (the request without its unset fields)."""
        return {"request": self.request.model_dump(mode="json", exclude_none=True),
                **self.model_dump(mode="json", exclude={"request"})}

    @classmethod
    def decode(cls, raw: Any) -> JobPayload:
        """The payload of a job argument; :class:`ValueError` naming each bad field, on one line, when it is not one."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the argument'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"not a Laya job payload ({problems})") from None


def _raw_payload(job: Job) -> dict[str, Any]:
    payload = job.args[0] if job.args else None
    return payload if isinstance(payload, dict) else {}


def _raw_request(job: Job) -> dict[str, Any]:
    request = _raw_payload(job).get("request")
    return request if isinstance(request, dict) else {}


def is_laya_job(job: Job) -> bool:
    """A job Laya enqueued: its function is Laya's, and it names no callbacks or dependencies.

    RQ imports whatever function a job record names, and any callback it
    carries, so a job naming ``os.system`` written into a Laya queue must run
    nothing: workers and the reaper check every job with this first.
    """
    try:
        func_name = job.func_name
    except Exception:  # noqa: BLE001 - undecodable data (e.g. pickled by a foreign producer)
        return False
    return (func_name in ALLOWED_FUNCTIONS and not job._success_callback_name
            and not job._failure_callback_name and not job._stopped_callback_name
            and not job._dependency_ids)


def job_error_result(job: Job, error: LayaError) -> Result:
    """The error result of a failed Laya job, from whatever part of its payload is well formed."""
    model = _raw_payload(job).get("model")
    metadata = _raw_request(job).get("metadata")
    model = model if isinstance(model, str) else None
    try:
        return error_result(job.id, error, model=model, metadata=metadata if isinstance(metadata, dict) else {},
                            finished_at=time.time())
    except ValidationError:  # metadata values of kinds a request may not carry
        return error_result(job.id, error, model=model, finished_at=time.time())


def job_reply_to(job: Job) -> str | None:
    """The shared reply channel a failed Laya job's producer waits on, if any."""
    reply_to = _raw_request(job).get("reply_to")
    return reply_to if isinstance(reply_to, str) else None


def cacheable(finish_reason: str | None, completion_tokens: int, max_tokens: int) -> bool:
    """Whether a model answer may be cached.

    ``stop`` (the model ended) always may. ``length`` may only when the answer
    used the whole requested budget: the same request would get the same text.
    Answers cut by a deadline or the context window never are.
    """
    if finish_reason == "stop":
        return True
    return finish_reason == "length" and completion_tokens >= max_tokens


class CachedAnswer(BaseModel):
    """A complete model answer, stored under its exact cache key and in the semantic log."""

    model_config = ConfigDict(frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    text: str
    model: str | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    json_value: Any = Field(None, alias="json", description="The parsed answer of a request with response_format.")

    def encode(self) -> bytes:
        return orjson.dumps(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """The stored form: ``{"text", "model", "finish_reason", "usage"}``, and ``json`` for structured output.

        These are also the fields of the :class:`~laya.schema.Result` that answers from the entry."""
        stored: dict[str, Any] = {"text": self.text, "model": self.model, "finish_reason": self.finish_reason,
                                  "usage": self.usage}
        if self.json_value is not None:
            stored["json"] = self.json_value
        return stored

    @classmethod
    def decode(cls, raw: bytes | str) -> CachedAnswer:
        return cls.model_validate_json(raw)


class SemanticLogEntry(BaseModel):
    """One cacheable answer in the semantic log: its scope, the prompt, the answer, when it expires."""

    model_config = ConfigDict(frozen=True)

    scope: str
    prompt: str
    answer: CachedAnswer
    expires_at: float

    def fields(self) -> dict[str, bytes]:
        """The stream entry's fields, for XADD."""
        return {SEMANTIC_LOG_FIELD: orjson.dumps({"scope": self.scope, "prompt": self.prompt,
                                                  "answer": self.answer.as_dict(), "expires_at": self.expires_at})}

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> SemanticLogEntry:
        """The entry in a stream entry's fields; :class:`KeyError` or :class:`pydantic.ValidationError` if malformed."""
        return cls.model_validate_json(fields[SEMANTIC_LOG_FIELD.encode()])


def ring(pipe: Pipeline, bell: str, jobs: int) -> None:
    """Wake up to ``jobs`` idle workers of a model (queued on the router's commit pipeline)."""
    pipe.rpush(bell, *["1"] * min(jobs, MAX_RINGS))
    pipe.ltrim(bell, -MAX_RINGS, -1)
