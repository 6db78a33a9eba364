"""LLM backends: the one thing a worker runs a request through.

:class:`LlamaBackend` is the real one (llama-cpp-python on a GGUF file).
:class:`ScriptedBackend` answers from a script, for unit tests of the code
around a backend; the real path has its own tests on a tiny real model.

llama-cpp-python reports problems as bare ``ValueError``/``RuntimeError``;
they are turned into Laya errors here, once, by where they happen rather than
by their message.
"""

from __future__ import annotations

import codecs
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from laya.errors import ContextTooLong, GenerationTimeout, InferenceError, InvalidRequest, ModelLoadError
from laya.schema import Request

if TYPE_CHECKING:
    import numpy as np
    from llama_cpp import Llama
    from llama_cpp.llama_grammar import LlamaGrammar

    from laya.config import Settings

__all__ = ["Controls", "Generation", "LLMBackend", "LlamaBackend", "ScriptedBackend"]

# llama.cpp's ggml_type numbers for the KV cache types Laya offers.
GGML_KV_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 8}


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    finish_reason: str
    """``stop`` (model or stop string ended it), ``length`` (max_tokens), ``context`` (window full),
    ``deadline`` (the request's ``cut_at`` passed: the text so far)."""
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    generation_s: float
    decode_tokens_per_s: float | None
    cached_tokens: int = 0
    """Prompt tokens the prompt cache already held (not evaluated again)."""


OnToken = Callable[[int], None]
"""Called with the count of generated tokens so far: after every generated token, and with 0
after every ``n_batch`` chunk of a long prompt (heartbeats)."""

OnText = Callable[[str], None]
"""Called with text as it is generated, for streaming: the pieces, concatenated, are a prefix of the final
text (text that may turn out to be part of a stop string is held back until it cannot)."""


@dataclass(frozen=True, slots=True)
class Controls:
    """What a job asks of a generation beyond the request's sampling parameters."""

    deadline: float
    """Monotonic clock: past it the job failed (``runtime.job_timeout_s``): :class:`GenerationTimeout`."""
    cut_at: float | None = None
    """Monotonic clock: past it the request's own ``deadline_s`` has passed; stop and keep the text so far."""
    on_token: OnToken = lambda _count: None
    on_text: OnText | None = None


class LLMBackend(Protocol):
    name: str
    n_ctx: int

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation: ...


class LlamaBackend:
    """A GGUF model loaded once through llama-cpp-python.

    ``extra_buffers`` says whether llama.cpp may put quantised CPU weights in its extra buffer
    types (AMX, repacked); ``None`` decides from ``model.cpu_extra_buffers`` and this CPU, as the
    planner does (:func:`laya.memory.planner.extra_buffers`).
    """

    def __init__(self, settings: Settings, *, n_ctx: int | None = None, extra_buffers: bool | None = None,
                 n_threads: int | None = None) -> None:
        import llama_cpp  # heavy native import; only GPU workers pay for it

        model = settings.model
        if model.path is None:
            raise ModelLoadError("model.path is not set; point it at a GGUF file (or run `laya demo`)")
        if extra_buffers is None:
            from laya.memory.machine import Machine, cpu_flags
            from laya.memory.planner import extra_buffers as decide

            extra_buffers = decide(model.cpu_extra_buffers, Machine(0, 0, cpu_flags=cpu_flags())).enabled
        self.extra_buffers = extra_buffers
        if n_threads is None:
            from laya.memory.machine import Machine
            from laya.memory.planner import threads

            n_threads = threads(model.n_threads, Machine(0, 0)).count
        self.n_threads = n_threads
        self.cached_tokens = 0
        """Prompt tokens the prompt cache held for the latest request (not evaluated again)."""
        kv = GGML_KV_TYPE[settings.memory.kv_cache_policy]
        self.name = model.name
        self.path = model.path
        try:
            # Extra buffers on is llama.cpp's default: only "off" needs a field Llama() has no argument for.
            with _model_params(**({} if extra_buffers else {"use_extra_bufts": False})):
                self.llm: Llama = llama_cpp.Llama(
                    model_path=str(model.path),
                    n_ctx=n_ctx or settings.runtime.max_seq_len,
                    n_batch=settings.runtime.n_batch,
                    n_ubatch=min(settings.runtime.n_batch, 512),
                    n_gpu_layers=model.n_gpu_layers,
                    n_threads=n_threads,
                    n_threads_batch=n_threads,
                    type_k=kv,
                    type_v=kv,
                    flash_attn=kv != GGML_KV_TYPE["f16"],  # llama.cpp needs it for a quantised V cache
                    # Sliding-window layers keep the whole context, as the planner plans it: then any
                    # prefix of the previous prompt can be kept and the rest cut back.
                    swa_full=True,
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load {model.path}: {exc}") from None
        self.n_ctx = self.llm.n_ctx()
        self.chat_without_template = model.chat_without_template
        self._formatter = self._chat_formatter()

    def _chat_formatter(self) -> Callable[[list[dict[str, str]]], tuple[str, list[str]]]:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        metadata = self.llm.metadata
        template = metadata.get("tokenizer.chat_template")
        if not template:
            return _plain_chat if self.chat_without_template == "plain" else self._refuse_chat

        def token_text(key: str) -> str:
            token_id = metadata.get(key)
            return self.llm._model.token_get_text(int(token_id)) if token_id is not None else ""

        formatter = Jinja2ChatFormatter(template, eos_token=token_text("tokenizer.ggml.eos_token_id"),
                                        bos_token=token_text("tokenizer.ggml.bos_token_id"))

        def render(messages: list[dict[str, str]]) -> tuple[str, list[str]]:
            response = formatter(messages=messages)  # type: ignore[arg-type]
            stop = response.stop if isinstance(response.stop, list) else [response.stop] if response.stop else []
            return response.prompt, stop

        return render

    def _refuse_chat(self, messages: list[dict[str, str]]) -> tuple[str, list[str]]:
        raise InvalidRequest(
            f"model {self.name!r} has no chat template (its GGUF has no tokenizer.chat_template: a base model) "
            "and model.chat_without_template is \"refuse\"; send the text to complete as prompt instead, or set "
            "model.chat_without_template = \"plain\" for Laya's plain User:/Assistant: layout", field="messages")

    def tokenize(self, request: Request) -> tuple[list[int], list[str]]:
        if request.messages is not None:
            try:
                prompt, extra_stop = self._formatter([m.model_dump() for m in request.messages])
            except InvalidRequest:
                raise
            except Exception as exc:  # noqa: BLE001 - templates raise what they like (raise_exception, jinja2)
                raise InvalidRequest(
                    f"the model's chat template refused these messages: {exc}; many templates want "
                    "roles to alternate user/assistant, with at most one leading system message",
                    field="messages") from None
            if self._formatter is _plain_chat:  # plain text, like a prompt: llama.cpp adds the BOS token
                return self.llm.tokenize(prompt.encode(), add_bos=True, special=False), extra_stop
            # A template writes its own BOS and turn markers, which must read as special tokens.
            return self.llm.tokenize(prompt.encode(), add_bos=False, special=True), extra_stop
        assert request.prompt is not None
        return self.llm.tokenize(request.prompt.encode(), add_bos=True, special=False), []

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        tokens, extra_stop = self.tokenize(request)
        room = self.n_ctx - len(tokens)
        if room < 1:
            raise ContextTooLong(
                f"prompt is {len(tokens)} tokens; the context window (runtime.max_seq_len) holds "
                f"{self.n_ctx}; shorten the prompt or raise max_seq_len", field="prompt")
        budget = min(max_tokens, room)
        stops = [*request.stop, *extra_stop]
        grammar = None
        if request.response_format is not None:
            from laya.worker.grammar import grammar_for

            grammar = grammar_for(request.response_format)
        if request.seed is not None:
            self.llm.set_seed(request.seed)
        eos = self.llm.token_eos()
        out = bytearray()
        pieces = _Pieces(controls.on_text, stops)
        count, finish = 0, "length"
        started = time.monotonic()
        first = last = started
        self.cached_tokens = 0
        try:
            if self._evaluate_prompt(tokens, controls):
                finish, budget = "deadline", 0
            for token in self._tokens(tokens[-1], request, grammar) if budget else ():
                last = time.monotonic()
                if count == 0:
                    first = last
                if token == eos:
                    finish = "stop"
                    break
                count += 1
                piece = self.llm.detokenize([token])
                out += piece
                controls.on_token(count)
                if stops and _hit_stop(out, stops):
                    finish = "stop"
                    break
                pieces.add(piece)
                if count >= budget:
                    finish = "length" if budget == max_tokens else "context"
                    break
                if controls.cut_at is not None and last > controls.cut_at:
                    finish = "deadline"
                    break
                if last > controls.deadline:
                    raise GenerationTimeout(
                        f"job deadline passed after {count} tokens; raise runtime.job_timeout_s "
                        "or ask for fewer max_tokens")
        except (ValueError, RuntimeError) as exc:
            raise InferenceError(f"llama.cpp failed during generation: {exc}") from None
        text = out.decode("utf-8", errors="replace")
        if finish == "stop" and stops:
            text = _cut_at_stop(text, stops)
        pieces.finish(text)
        decode_rate = (count - 1) / (last - first) if count > 1 and last > first else None
        return Generation(text=text, finish_reason=finish, prompt_tokens=len(tokens), completion_tokens=count,
                          ttft_s=first - started, generation_s=last - started, decode_tokens_per_s=decode_rate,
                          cached_tokens=self.cached_tokens)

    def _tokens(self, last_prompt_token: int, request: Request, grammar: LlamaGrammar | None) -> Iterator[int]:
        """Generated tokens, one at a time, from the cache :meth:`_evaluate_prompt` left.

        Greedy requests (temperature 0, no repeat penalty, no grammar) take the most likely token
        straight from llama.cpp's logits, which are read in place, not copied: the same token
        llama.cpp's greedy sampler picks (the first of equal maxima), without building its
        candidate list of the whole vocabulary for every token. Others go through
        llama-cpp-python's chain of llama.cpp's own samplers.
        """
        llm = self.llm
        if request.temperature > 0 or request.repeat_penalty != 1.0 or grammar is not None:
            # reset=False: continue from the cache as it is, without generate's own prefix logic.
            yield from llm.generate([last_prompt_token], reset=False, top_k=request.top_k, top_p=request.top_p,
                                    temp=request.temperature, repeat_penalty=request.repeat_penalty,
                                    grammar=grammar)
            return
        import llama_cpp
        import numpy as np

        n_vocab = llm.n_vocab()
        token = last_prompt_token
        while True:
            llm.eval([token])
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            token = int(logits.argmax())
            yield token

    def _evaluate_prompt(self, tokens: list[int], controls: Controls) -> bool:
        """Bring llama.cpp's cache to all but the last prompt token, one ``n_batch`` chunk at a time;
        ``True`` if the request's own deadline (``controls.cut_at``) passed on the way.

        ``Llama.generate`` would evaluate the whole prompt in one native call, during which no
        heartbeat can be sent: a long prompt on a slow machine would look like a dead worker.
        Here the heartbeat comes after every chunk, and ``generate`` is then given only the last
        token. The prefix shared with the previous request stays cached, as ``generate`` keeps
        it; a model whose memory cannot be cut back (recurrent or hybrid) starts from empty.
        """
        import llama_cpp

        llm = self.llm
        cached = _common_prefix(llm.input_ids[:llm.n_tokens], tokens[:-1])
        if cached < llm.n_tokens and not llama_cpp.llama_memory_seq_rm(
                llama_cpp.llama_get_memory(llm.ctx), 0, cached, -1):
            cached = 0  # eval() then clears the whole sequence, which every kind of memory allows
        llm.n_tokens = self.cached_tokens = cached
        for start in range(cached, len(tokens) - 1, llm.n_batch):
            clock = time.monotonic()
            if controls.cut_at is not None and clock > controls.cut_at:
                return True
            if clock > controls.deadline:
                raise GenerationTimeout(
                    f"job deadline passed while evaluating the {len(tokens)}-token prompt; raise "
                    "runtime.job_timeout_s or send a shorter prompt")
            llm.eval(tokens[start:min(start + llm.n_batch, len(tokens) - 1)])
            controls.on_token(0)
        return False


@contextlib.contextmanager
def _model_params(**fields: object) -> Iterator[None]:
    """Set fields of ``llama_model_params`` that ``Llama()`` has no argument for, while it loads.

    ``Llama.__init__`` starts from ``llama_model_default_params()`` and sets only the fields it
    knows; wrapping that function for the duration of the call is the one place to set the others.
    A field this llama-cpp-python build does not have is an error, not a silent no-op.
    """
    import llama_cpp.llama_cpp as native

    known = {name for name, *_ in native.llama_model_params._fields_}
    missing = sorted(set(fields) - known)
    if missing:
        raise ModelLoadError(f"this llama-cpp-python has no model parameter {', '.join(missing)}; upgrade it "
                             "(pip install -U llama-cpp-python) or set model.cpu_extra_buffers = \"on\"")
    defaults = native.llama_model_default_params

    def patched() -> object:
        params = defaults()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    native.llama_model_default_params = patched
    try:
        yield
    finally:
        native.llama_model_default_params = defaults


def _common_prefix(have: np.ndarray, want: list[int]) -> int:
    """How many leading tokens two sequences share."""
    import numpy as np  # here, not at the top: routers import this module's types and never need numpy

    n = min(len(have), len(want))
    differs = np.flatnonzero(have[:n] != np.asarray(want[:n], dtype=have.dtype))
    return int(differs[0]) if differs.size else n


PLAIN_TURNS = ["\nUser:", "\nAssistant:", "\nSystem:"]
"""Where a model writing in the plain chat layout starts another turn: the answer ends there."""


def _plain_chat(messages: list[dict[str, str]]) -> tuple[str, list[str]]:
    """Chat layout for models without a chat template: one ``Role: content`` line per message, then
    ``Assistant:``. Base models continue it as a transcript, so the answer stops at the next turn."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"]), PLAIN_TURNS


def _hit_stop(out: bytearray, stops: list[str]) -> bool:
    window = max(len(s.encode()) for s in stops) + 8
    tail = bytes(out[-window:]).decode("utf-8", errors="ignore")
    return any(s in tail for s in stops)


class _Pieces:
    """Hands generated text to an :data:`OnText` callback as it comes.

    Bytes are decoded incrementally (a character split across tokens waits for its last byte), and the
    last ``len(longest stop)`` characters are held back: they could still turn out to start a stop string,
    which the final text does not contain. So what was handed out is always a prefix of the final text,
    and :meth:`finish` hands out the rest.
    """

    __slots__ = ("_decoder", "_emit", "_hold", "_sent", "_text")

    def __init__(self, emit: OnText | None, stops: list[str]) -> None:
        self._emit = emit
        self._hold = max((len(s) for s in stops), default=0)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._sent = 0

    def add(self, piece: bytes) -> None:
        if self._emit is None:
            return
        self._text += self._decoder.decode(piece)
        ready = len(self._text) - self._hold
        if ready > self._sent:
            self._emit(self._text[self._sent:ready])
            self._sent = ready

    def finish(self, final: str) -> None:
        if self._emit is not None and len(final) > self._sent:
            self._emit(final[self._sent:])


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


class ScriptedBackend:
    """A fake backend: answers ``script[prompt]`` (or ``default``) one character per token."""

    def __init__(self, script: dict[str, str] | None = None, *, default: str = "ok", name: str = "default",
                 n_ctx: int = 2048, seconds_per_token: float = 0.0) -> None:
        self.script = script or {}
        self.default = default
        self.name = name
        self.n_ctx = n_ctx
        self.seconds_per_token = seconds_per_token
        self.calls: list[Request] = []

    def generate(self, request: Request, *, max_tokens: int, controls: Controls) -> Generation:
        self.calls.append(request)
        if len(request.text) >= self.n_ctx:
            raise ContextTooLong(f"prompt is {len(request.text)} tokens; the window holds {self.n_ctx}")
        answer = self.script.get(request.text, self.default)[:max_tokens]
        started = time.monotonic()
        finish = "length" if len(answer) == max_tokens else "stop"
        count = 0
        for count in range(1, len(answer) + 1):
            if self.seconds_per_token:
                time.sleep(self.seconds_per_token)
            controls.on_token(count)
            if controls.on_text is not None:
                controls.on_text(answer[count - 1])
            clock = time.monotonic()
            if controls.cut_at is not None and clock > controls.cut_at and count < len(answer):
                answer, finish = answer[:count], "deadline"
                break
            if clock > controls.deadline:
                raise GenerationTimeout(f"job deadline passed after {count} tokens")
        elapsed = time.monotonic() - started
        return Generation(answer, finish, len(request.text), count, 0.0, elapsed, None)
