"""Laya's configuration: one validated pydantic tree, loaded once per process.

Sources, later ones winning:

1. the defaults below (desktop-safe: one sequence, 2048 tokens, no CPU offload);
2. a TOML file (``--config``, else ``$LAYA_CONFIG``);
3. environment overrides: ``LAYA_REDIS_URL``, ``LAYA_MODEL_PATH``, ``LAYA_ROUTES``,
   and the general form ``LAYA_<SECTION>__<FIELD>`` (e.g. ``LAYA_RUNTIME__MAX_SEQ_LEN=4096``).

:func:`load_settings` layers them itself rather than through pydantic-settings, whose sources
cannot say which variable set a bad value, pass over a misspelt section (``LAYA_RUTNIME__...``)
and a missing file in silence, and read ``os.environ`` whenever a tree is built.

Names are those of the field report Laya answers, where they mean the same (``[runtime] max_seq_len,
n_parallel``, ``[model] path, quant_type``, ``[memory] kv_cache_policy,
offload_policy``), so its readers recognise them. A bad value is refused at start
with the file, the field, the value and why.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from laya.errors import ConfigError
from laya.sentinel import is_sentinel_url, parse_sentinel_url

__all__ = [
    "MemoryConfig",
    "MetricsConfig",
    "ModelConfig",
    "RedisConfig",
    "RouterConfig",
    "RuntimeConfig",
    "Settings",
    "error_message",
    "format_validation_error",
    "load_settings",
    "read_toml",
    "redact_url",
]

_STRICT = ConfigDict(extra="forbid", validate_assignment=True)


class RedisConfig(BaseModel):
    """Where Redis is, and how writes are confirmed."""

    model_config = _STRICT

    url: str | None = Field(
        None,
        description="redis://, rediss:// (TLS) or unix:// URL, with user and password if the "
        "server needs them; or redis+sentinel://[user:pass@]host:port[,host:port...]/service[/db] "
        "(rediss+sentinel:// for TLS) to follow the primary Sentinel names through failovers. "
        "Unset: the embedded Valkey that `laya up` starts on embedded_port.",
    )
    embedded_port: int = Field(6390, ge=1, le=65535, description="Port of the embedded Valkey.")
    prefix: str = Field(
        "laya", pattern=r"^[A-Za-z0-9_.-]{1,32}$", description="Prefix of every Laya key."
    )
    min_replica_acks: int = Field(
        0, ge=0, le=16,
        description="Replicas that must confirm a write (WAIT) before it counts: a producer's request is "
        "accepted, a router's commit and a worker's result are done, only then. 0: the primary's word is "
        "enough (a failover can lose the last writes).",
    )
    replica_ack_timeout_ms: int = Field(
        1000, ge=1, le=60_000,
        description="How long a write waits for min_replica_acks replicas; a producer whose request is "
        "not confirmed in time gets a not_replicated error instead of an acceptance.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None and is_sentinel_url(value):
            parse_sentinel_url(value)  # its ValueError says which part is wrong
        elif value is not None and urlsplit(value).scheme not in {"redis", "rediss", "unix"}:
            raise ValueError("must start with redis://, rediss://, unix://, redis+sentinel:// or rediss+sentinel://")
        return value

    @property
    def effective_url(self) -> str:
        return self.url or f"redis://127.0.0.1:{self.embedded_port}/0"


class ModelConfig(BaseModel):
    """The model a worker serves: its file, and how llama.cpp loads it."""

    model_config = _STRICT

    name: str = Field(
        "default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name requests use to pick this model."
    )
    path: Path | None = Field(None, description="GGUF file. Unset: `laya demo` makes a tiny random one.")
    quant_type: str | None = Field(
        None, description="The model's quantisation (e.g. Q4_K_M), for operators; the planner reads the real one from the GGUF header."
    )
    n_gpu_layers: int = Field(
        -1, ge=-1, le=1000, description="Layers on the GPU; -1 = all. Ignored by a CPU-only build."
    )
    n_threads: int | None = Field(
        None, ge=1, le=512, description="CPU threads for decode and prompt batches; unset: one per physical core "
        "this process may use (its CPU affinity, under a cgroup CPU quota). The plan and the worker's log say the "
        "count and why.")
    chat_without_template: Literal["plain", "refuse"] = Field(
        "plain", description="Chat requests to a model whose GGUF has no chat template (a base model). plain: "
        "Laya's plain layout, one \"Role: content\" line per message, then \"Assistant:\"; the answer stops "
        "where the model starts another turn. refuse: an invalid_request error naming the fix (send prompt).")
    cpu_extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's CPU extra buffer types (AMX, repacked weights) for quantised weights on the "
        "CPU. auto: off on CPUs with AMX, whose llama.cpp kernels crash on quantised models; on elsewhere.",
    )
    semantic_cache: bool = Field(
        False, description="Let requests with cache = \"semantic\" reuse this model's answers to prompts that "
        "mean the same (embedding near, and a verifier finds no changed negation, number, entity, ...).",
    )


class RuntimeConfig(BaseModel):
    """How jobs run: context, budgets, timeouts, heartbeats, retries and token streams."""

    model_config = _STRICT

    max_seq_len: int = Field(
        2048, ge=64, le=1_048_576, description="Context window (n_ctx) in tokens, prompt plus output."
    )
    n_parallel: int = Field(
        1,
        ge=1,
        le=1,
        description="Sequences per worker. Laya runs one at a time per GPU: the queue is the "
        "backpressure. Start one worker per GPU instead of raising this.",
    )
    n_batch: int = Field(512, ge=1, le=8192, description="Prompt tokens llama.cpp evaluates per step; "
                         "the job deadline is checked between steps.")
    job_timeout_s: int = Field(
        600, ge=1, le=86_400, description="Hard limit on one job; checked between tokens."
    )
    heartbeat_interval_s: float = Field(
        2.0, gt=0, le=60, description="How often a running job proves the worker is alive (from a thread of its "
        "own, whatever the model is doing, until the job's deadline).",
    )
    heartbeat_ttl_s: int = Field(
        5, ge=5, le=86_400,
        description="A running job whose worker sent no heartbeat this long counts as lost, and is run again "
        "(or failed) by a router's reaper. Raise it where Redis can be unreachable longer (failovers, "
        "a flaky network): a worker cut off that long loses its jobs to others.",
    )
    job_retries: int = Field(
        1, ge=0, le=10, description="Times a job whose worker was lost is run again before it fails."
    )
    default_max_tokens: int = Field(256, ge=1, le=1_048_576, description="max_tokens when a request gives none.")
    max_tokens_limit: int = Field(4096, ge=1, le=1_048_576, description="Largest max_tokens a request may ask.")
    stream_flush_ms: float = Field(
        20.0, ge=0, le=10_000,
        description="A streaming request's chunks are gathered this long per stream entry (the first goes at once).",
    )
    stream_max_chunks: int = Field(
        10_000, ge=16, le=10_000_000, description="Entries a request's stream keeps (XADD MAXLEN ~)."
    )

    @model_validator(mode="after")
    def _default_within_limit(self) -> RuntimeConfig:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"default_max_tokens ({self.default_max_tokens}) is over max_tokens_limit "
                             f"({self.max_tokens_limit}); lower it or raise the limit")
        return self

    @model_validator(mode="after")
    def _beats_fit_the_ttl(self) -> RuntimeConfig:
        if self.heartbeat_interval_s * 2 > self.lock_ttl_s:
            raise ValueError(f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be at most half of "
                             f"heartbeat_ttl_s - 1 ({self.lock_ttl_s}) so a live job never looks lost")
        return self

    @property
    def lock_ttl_s(self) -> int:
        """A request's lock outlives a missed beat but expires before the reaper requeues the job."""
        return self.heartbeat_ttl_s - 1


class MemoryConfig(BaseModel):
    """How the memory planner sizes a model against the machine before anything loads."""

    model_config = _STRICT

    kv_cache_policy: Literal["f16", "q8_0", "q4_0"] = Field(
        "f16", description="KV cache element type; q8_0 halves it (llama.cpp flash attention)."
    )
    offload_policy: Literal["disabled", "explicit"] = Field(
        "disabled",
        description="disabled: never put layers on the CPU when a GPU was asked for (refuse instead). "
        "explicit: honour model.n_gpu_layers < all. There is no 'auto': Laya never offloads silently.",
    )
    budget_fraction: float = Field(
        0.85, gt=0.05, le=0.98, description="Share of free memory a plan may use."
    )
    margin_mib: int = Field(256, ge=0, le=65_536, description="Safety margin added to every plan.")

    @field_validator("offload_policy", mode="before")
    @classmethod
    def _no_auto(cls, value: Any) -> Any:
        if value == "auto":
            raise ValueError(
                "'auto' offload would move layers to the CPU unasked (a model that swaps runs at a token a "
                "second or less); use 'disabled' "
                "(refuse what does not fit) or 'explicit' with model.n_gpu_layers"
            )
        return value


class RouterConfig(BaseModel):
    """The ingress router: rules, batching, admission, caches, limits and the semantic stages."""

    model_config = _STRICT

    routes_file: Path | None = Field(None, description="TOML rules file; unset = no rules.")
    models: list[str] = Field(
        default_factory=list, description="Model names besides model.name that requests may target."
    )
    batch_size: int = Field(256, ge=1, le=10_000, description="Stream entries read per round trip.")
    block_ms: int = Field(1000, ge=1, le=60_000, description="How long one read waits for entries.")
    reap_interval_s: float = Field(
        0.5, gt=0, le=600, description="How often a router looks for jobs whose worker was lost."
    )
    claim_idle_ms: int = Field(
        3_000, ge=100, le=3_600_000, description="Entries a router read and has not committed this long "
        "(it died, or lost Redis) are claimed by another router; routers look every claim_idle_ms / 2.",
    )
    max_queue_depth: int = Field(
        256, ge=1, le=10_000_000,
        description="Admission bound: jobs waiting per model and lane (high, normal, bulk each have their own).",
    )
    retry_after_s: float = Field(5.0, ge=0, le=3600, description="Retry-after told to rejected producers.")
    cache_size: int = Field(100_000, ge=0, le=10_000_000, description="Entries in the in-process LRU.")
    cache_ttl_s: int = Field(86_400, ge=1, le=31_536_000, description="Lifetime of a cached answer in Redis.")
    result_ttl_s: int = Field(86_400, ge=10, le=31_536_000, description="Lifetime of a result record.")
    max_request_bytes: int = Field(1_000_000, ge=256, le=64_000_000, description="Largest request accepted.")
    max_messages: int = Field(256, ge=1, le=100_000, description="Most chat messages in one request.")
    semantic: bool = Field(
        True, description="The semantic stages (rule examples, the semantic cache); off: exact routing only, "
        "and the embedding model is never loaded.",
    )
    intent_threshold: float = Field(
        0.85, ge=0.5, le=1.0, description="Similarity a request needs to a rule's example to match it, for rules "
        "that give no threshold of their own.",
    )
    semantic_threshold: float = Field(
        0.7, ge=0.5, le=1.0, description="Similarity a prompt needs to a cached prompt before the verifier "
        "compares them (the verifier decides; this only bounds the candidates).",
    )
    embedder_dir: Path | None = Field(
        None, description="Folder with WordLlama's weights/ and tokenizers/; unset: the wordllama package's own "
        "(nothing is ever downloaded).",
    )
    semantic_cache_size: int = Field(
        10_000, ge=0, le=1_000_000, description="Answers the semantic cache keeps (in each router's memory, "
        "and in its Redis log).",
    )


class MetricsConfig(BaseModel):
    """Prometheus metrics: each router and worker process serves its own ``/metrics`` (see laya.metrics)."""

    model_config = _STRICT

    port: int = Field(9464, ge=0, le=65535, description="Base port of the /metrics endpoints; 0 turns metrics off.")
    offset: int = Field(
        0, ge=0, le=1000, description="Added to port, so several processes on one host each get a port of their "
                                      "own (laya up: router 0, worker 1).")
    bind: str = Field(
        "127.0.0.1", min_length=1, max_length=255,
        description="Address the endpoints listen on; 0.0.0.0 for a Prometheus on another host (containers).")

    @model_validator(mode="after")
    def _port_in_range(self) -> MetricsConfig:
        if self.port and self.port + self.offset > 65535:
            raise ValueError(f"port {self.port} + offset {self.offset} is past 65535; lower one of them")
        return self

    @property
    def serve_port(self) -> int:
        """The port this process serves, 0 when metrics are off."""
        return self.port + self.offset if self.port else 0


class HttpConfig(BaseModel):
    """`laya serve`, the OpenAI-compatible HTTP front door: where it listens and what it accepts."""

    model_config = _STRICT

    port: int = Field(8390, ge=0, le=65535, description="Port of the HTTP API; 0: `laya up` starts no front door.")
    bind: str = Field(
        "127.0.0.1", min_length=1, max_length=255,
        description="Address it listens on. Expose it beyond this host behind a reverse proxy with TLS.")
    api_keys: list[Annotated[str, Field(min_length=8, max_length=256)]] = Field(
        default_factory=list, max_length=256,
        description="Bearer keys a client must send (Authorization: Bearer KEY); empty: no key is asked. In the "
                    "environment, separated by commas.")
    max_body_bytes: int = Field(
        1_000_000, ge=1024, le=64_000_000, description="Largest request body; a larger one is answered 413.")
    request_timeout_s: float = Field(
        600.0, gt=0, le=86_400,
        description="How long a request waits for its answer before a 504 (the request itself goes on).")
    files_dir: Path = Field(
        Path(".laya/files"), description="Where uploaded files (POST /v1/files) are kept; a relative path is "
        "from the directory `laya serve` (or `laya up`) runs in. Several `laya serve` on one Redis share it.")
    max_file_bytes: int = Field(
        200_000_000, ge=1024, le=100_000_000_000, description="Largest upload; a larger one is answered 413 as "
        "soon as it crosses the limit (OpenAI's limit for batch input: 200 MB).")
    max_file_lines: int = Field(
        50_000, ge=1, le=100_000_000, description="Most lines in an upload (OpenAI's limit for batch input: 50,000).")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_from_environment(cls, value: Any) -> Any:
        return [key.strip() for key in value.split(",") if key.strip()] if isinstance(value, str) else value


class Settings(BaseModel):
    """The whole configuration tree."""

    model_config = _STRICT

    redis: RedisConfig = Field(default_factory=RedisConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    models: list[ModelConfig] = Field(
        default_factory=list, max_length=16,
        description="Several models served together ([[models]] tables, instead of [model]): one worker each, "
        "planned as a set; the first is the default. Rules and intents send requests to them by name.",
    )
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    source: str = Field("<defaults>", exclude=True, description="Where this configuration came from.")
    _env: dict[str, str] = PrivateAttr(default_factory=dict)
    """``section.field`` → the environment variable that set it."""

    @model_validator(mode="before")
    @classmethod
    def _first_of_models_is_the_model(cls, data: Any) -> Any:
        """With ``[[models]]``, ``model`` is the first of them, so code that serves one model serves the default."""
        if isinstance(data, dict) and isinstance(data.get("models"), list) and data["models"]:
            # On assignment (validate_assignment) ``model`` is already the first of ``models``.
            if "model" in data and data["model"] != data["models"][0]:
                raise ValueError("give [model] (one model) or [[models]] (several), not both; with [[models]], "
                                 "LAYA_MODEL_PATH does not apply: give each model its path")
            data = {**data, "model": data["models"][0]}
        return data

    @model_validator(mode="after")
    def _model_names_unique(self) -> Settings:
        names = [m.name for m in self.models]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"[[models]] names must be unique; repeated: {repeated}")
        return self

    @property
    def served(self) -> list[ModelConfig]:
        """The models this configuration loads: ``[[models]]``, else ``[model]``."""
        return list(self.models) or [self.model]

    def for_model(self, name: str) -> Settings:
        """This configuration as the worker of model ``name`` sees it: ``model`` is that one."""
        for model in self.served:
            if model.name == name:
                return self.model_copy(update={"model": model})
        raise ConfigError(f"{self.source}: model {name!r} is not one this config serves "
                          f"({', '.join(m.name for m in self.served)}); a worker loads only a model its config "
                          "plans for: add it to [[models]], or start the worker with one of those names")

    @property
    def semantic_models(self) -> frozenset[str]:
        """Models whose answers the semantic cache may reuse."""
        return frozenset(m.name for m in self.served if m.semantic_cache)

    @property
    def model_names(self) -> list[str]:
        served = [m.name for m in self.served]
        return [*served, *(m for m in self.router.models if m not in served)]

    def origin(self, field: str) -> str:
        """Where ``field`` (``"redis.url"``) got its value: an environment variable, the file, or the defaults.

        An error about a value (a server that does not answer) then names what to change.
        """
        if field in self._env:
            return self._env[field]
        return "the built-in defaults" if self.source == "<defaults>" else self.source


_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "string": "a string",
          "list": "a list", "dict": "{mapping}", "model": "{mapping}", "path": "a path"}
_BOUNDS = {"greater_than_equal": "at least {ge}", "greater_than": "more than {gt}",
           "less_than_equal": "at most {le}", "less_than": "less than {lt}",
           "too_short": "at least {min_length} item(s)", "too_long": "at most {max_length} item(s)",
           "string_too_short": "at least {min_length} character(s)",
           "string_too_long": "at most {max_length} character(s)"}


def error_message(item: ErrorDetails, *, mapping: str = "a table") -> str:
    """One pydantic error in Laya's words: what the value must be.

    Pydantic's own messages lead with its internals ("Value error, ",
    "Input should be a valid integer, unable to parse string as an integer");
    a user needs only the rule the value broke. ``mapping`` names a nested
    object as the input format does: a TOML table, a JSON object.
    """
    kind = item["type"]
    ctx = item.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    prefix, _, suffix = kind.partition("_")
    if prefix in _KINDS and suffix in ("parsing", "type", "from_float"):
        return "must be " + _KINDS[prefix].format(mapping=mapping)
    if kind in _BOUNDS:
        return "must be " + _BOUNDS[kind].format(**ctx)
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx['pattern']}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    return str(item["msg"])


def _short(value: Any) -> str:
    """A value as the user wrote it, bounded: a whole misplaced table must not fill the screen."""
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model of the table at ``loc`` in ``model``'s tree (list indexes skipped), if there is one."""
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        candidates = [info.annotation, *get_args(info.annotation)] if info is not None else []
        inner = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if inner is None:
            return None
        model = inner
    return model


def _unknown_field(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """Why an unknown field is refused, with the nearest known name, else the known ones."""
    table = _model_at(model, loc[:-1]) if model is not None else None
    if table is None:
        return "is not a known field"
    known = [name for name, info in table.model_fields.items() if not info.exclude]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if len(loc) == 1 and model is Settings:
        return "is not a section of a Laya config; " + (f"did you mean [{close[0]}]?" if close
                                                          else f"the sections are {', '.join(known)}")
    tables = [part for part in loc[:-1] if isinstance(part, str)]
    what = (f"[[{tables[-1]}]]" if isinstance(loc[-2], int) else f"[{tables[-1]}]") if tables else "this file"
    return f"is not a field of {what}; " + (f"did you mean {close[0]}?" if close else f"{what} has {', '.join(known)}")


def _description(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str | None:
    """The field's description, which says what the value is for (and often what to do instead)."""
    table = _model_at(model, loc[:-1]) if model is not None and loc else None
    info = table.model_fields.get(str(loc[-1])) if table is not None else None
    return info.description if info is not None else None


def format_validation_error(source: str, error: ValidationError, *, model: type[BaseModel] | None = None,
                            env: Mapping[tuple[str | int, ...], str] | None = None) -> str:
    """Each problem as ``where: field = value: what it must be``; one problem is one line.

    ``where`` is the environment variable that set the field when ``env``
    (field location → variable) names one, else ``source``: the value to
    change is where the user wrote it, not the file it was merged into.
    A broken bound or type is followed by the field's description, which
    says what the field is for.
    """
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        field = ".".join(str(part) for part in loc) or "<root>"
        where = next((f"environment variable {env[loc[:n]]}" for n in (len(loc), 1) if env and loc[:n] in env),
                     source)
        if item["type"] == "extra_forbidden":
            shown = f"[{field}]" if len(loc) == 1 and isinstance(item.get("input"), dict) else field
            lines.append(f"{where}: {shown} {_unknown_field(model, loc)}")
            continue
        reason = error_message(item)
        description = _description(model, loc) if item["type"] not in ("value_error", "assertion_error") else None
        lines.append(f"{where}: {field} = {_short(item.get('input'))}: {reason}"
                     + (f". {description}" if description else ""))
    if len(lines) == 1:
        return lines[0]
    return f"{source}: {len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)


_SHORT_ENV = {"LAYA_REDIS_URL": ("redis", "url"), "LAYA_MODEL_PATH": ("model", "path"),
              "LAYA_ROUTES": ("router", "routes_file")}
_FILE_PATHS = (("model", "path"), ("router", "routes_file"), ("router", "embedder_dir"))


def _environment(environ: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, str]]:
    """Each override as ``(section, field)`` → ``(variable, value)``; of two for one field, the later name wins."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for name, value in sorted(environ.items()):
        if name in _SHORT_ENV:
            found[_SHORT_ENV[name]] = (name, value)
        elif name.startswith("LAYA_") and "__" in name:
            section, _, field = name[5:].lower().partition("__")
            found[(section, field)] = (name, value)
    return found


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Relative paths in a config file are relative to the file's folder, not to where a command runs."""
    models = data.get("models")
    tables = [(data.get(section), field) for section, field in _FILE_PATHS]
    tables += [(table, "path") for table in (models if isinstance(models, list) else [])]
    for table, field in tables:
        if not isinstance(table, dict):
            continue
        value = table.get(field)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            table[field] = str(base / value)


def read_toml(file: Path, what: str) -> dict[str, Any]:
    """A TOML file's tables, or a :class:`ConfigError` naming the file and what is wrong."""
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(f"{file}: {what} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None


def _read_config(file: Path) -> dict[str, Any]:
    data = read_toml(file, "config file")
    if isinstance(data.get("rule"), list):
        raise ConfigError(f"{file} is a routes file (it has [[rule]] tables), not a config file: name it in a "
                          f"config's [router] routes_file, or set LAYA_ROUTES={file}")
    _resolve_paths(data, file.parent.resolve())
    return data


def load_settings(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Load the configuration once: defaults, then the file (or ``$LAYA_CONFIG``), then the environment.

    A bad value is blamed on what set it: the variable for a field the
    environment set, and for a section whose every value it set.
    """
    env = os.environ if environ is None else environ
    path = path or env.get("LAYA_CONFIG") or None
    file = Path(path).expanduser() if path is not None else None
    source = str(file) if file is not None else "<defaults>"
    data = _read_config(file) if file is not None else {}
    overrides = _environment(env)
    blame: dict[tuple[str | int, ...], str] = {}
    for (section, field), (name, value) in overrides.items():
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        table[field] = value
        blame[(section, field)] = name
    for (section, _), (name, _) in overrides.items():
        if all((section, field) in blame for field in data[section]):
            blame.setdefault((section,), name)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, model=Settings, env=blame)) from None
    settings.source = source
    settings._env = {f"{section}.{field}": name for (section, field), (name, _) in overrides.items()}
    return settings


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))
