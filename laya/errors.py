"""Every error Laya raises, rooted at :class:`LayaError`.

    LayaError
    ├── ConfigError ............ a config or routes file is invalid (file, field, value, why)
    ├── RequestError ........... a request is malformed; becomes an ``error:<code>`` result
    │   ├── InvalidRequest       code ``invalid_request`` / ``invalid_json`` / ``too_large`` ...
    │   └── UnknownModel         code ``unknown_model``
    ├── CapacityError
    │   ├── Overloaded ......... the model queue is at its admission bound (retry later)
    │   ├── Expired ............ the request's deadline passed before a worker started it
    │   └── DoesNotFit ......... the memory planner refused a configuration
    ├── InferenceError
    │   ├── ContextTooLong ..... prompt tokens do not fit the model's context window
    │   ├── GenerationTimeout .. the job ran past its deadline
    │   └── ModelLoadError ..... llama.cpp could not load the model
    ├── GGUFError .............. a file is not a readable GGUF model
    │   └── UnplannableModel ... a readable GGUF the planner cannot size (no attention heads, ...)
    ├── ServerError ............ the Redis/Valkey server could not be reached or started
    │   ├── ConnectionLost ..... the server stopped answering during a producer's call
    │   └── NotReplicated ...... fewer replicas than redis.min_replica_acks confirmed a write
    ├── FileAccessError ........ a file named on the command line cannot be read or written
    └── ResumeError ............ a results file cannot continue this batch (another input's, or not one)

Every :class:`RequestError` and :class:`InferenceError` carries a stable ``code``
that ends up in the result record, so producers match on codes, never on text.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "ConfigError",
    "ConnectionLost",
    "ContextTooLong",
    "DoesNotFit",
    "Expired",
    "FileAccessError",
    "GGUFError",
    "GenerationTimeout",
    "InferenceError",
    "InvalidRequest",
    "LayaError",
    "ModelLoadError",
    "NotReplicated",
    "Overloaded",
    "RequestError",
    "ResumeError",
    "ServerError",
    "UnknownModel",
    "UnplannableModel",
]


class LayaError(Exception):
    """Root of every error Laya raises on purpose."""

    code: str = "internal"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.field = field


class ConfigError(LayaError):
    code = "bad_config"


class RequestError(LayaError):
    code = "invalid_request"


class InvalidRequest(RequestError):
    code = "invalid_request"


class UnknownModel(RequestError):
    code = "unknown_model"


class CapacityError(LayaError):
    code = "capacity"


class Overloaded(CapacityError):
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Expired(CapacityError):
    """Not started before its ``deadline_s``: answered without running, so no GPU time goes to a producer that
    gave up."""

    code = "expired"


class DoesNotFit(CapacityError):
    code = "does_not_fit"


class InferenceError(LayaError):
    code = "inference_failed"


class ContextTooLong(InferenceError):
    code = "context_too_long"


class GenerationTimeout(InferenceError):
    code = "timeout"


class ModelLoadError(InferenceError):
    code = "model_load_failed"


class GGUFError(LayaError):
    code = "bad_gguf"


class UnplannableModel(GGUFError):
    """A well-formed GGUF whose architecture the planner cannot size; ``--force`` loads it unplanned."""

    code = "unplannable_model"


class ServerError(LayaError):
    code = "server_unavailable"


class ConnectionLost(ServerError):
    """A call on the server failed for want of a connection, after the client had been made.

    Raised by :class:`~laya.client.Client` instead of redis-py's connection
    errors (kept as ``__cause__``), so a producer catches one Laya class.
    ``url`` is the server's URL without its password; ``request_id`` names the
    request the call was about, when there was one, so it can be fetched later.
    """

    code = "connection_lost"

    def __init__(self, message: str, *, url: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.request_id = request_id


class FileAccessError(LayaError):
    """A file the user named cannot be read or written; the message gives its path and the OS's reason."""

    code = "file_access"


class NotReplicated(ServerError):
    """The primary took a write, but fewer replicas than ``redis.min_replica_acks`` confirmed it in time.

    For a producer this means *not accepted*: a failover now could lose the
    request. It may still be answered (the primary has it), so resubmitting
    it with the same ``id`` is safe: one request id gets one result.
    """

    code = "not_replicated"

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class ResumeError(LayaError):
    """``laya batch --resume`` was pointed at a results file that does not belong to this input."""

    code = "resume_mismatch"
