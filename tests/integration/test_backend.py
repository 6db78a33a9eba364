"""The real llama.cpp path, on the tiny hand-wired model (its answers are known in advance)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from laya.backend import LlamaBackend
from laya.config import Settings
from laya.errors import ContextTooLong, GenerationTimeout, ModelLoadError
from laya.schema import Request
from laya.tinymodel import expected_completion


def backend_for(model: Path, **runtime: object) -> LlamaBackend:
    return LlamaBackend(Settings.model_validate({"model": {"path": str(model)},
                                                 "runtime": {"max_seq_len": 256, **runtime}}))


@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> LlamaBackend:
    return backend_for(tiny_model)


def run(backend: LlamaBackend, request: Request, max_tokens: int = 64, deadline_s: float = 30):
    beats: list[int] = []
    gen = backend.generate(request, max_tokens=max_tokens, deadline=time.monotonic() + deadline_s,
                           on_token=beats.append)
    return gen, beats


@pytest.mark.parametrize("prompt", ["hello", "What is 2+2?", "k", "zebra z"])
def test_answers_are_the_known_ones(backend: LlamaBackend, prompt: str) -> None:
    gen, beats = run(backend, Request(prompt=prompt))
    assert gen.text == expected_completion(prompt, 64)
    assert gen.finish_reason == "stop"
    assert gen.completion_tokens == len(gen.text) == len(beats)
    assert gen.prompt_tokens > len(prompt)  # BOS and the leading-space bytes


def test_max_tokens_and_stop_strings(backend: LlamaBackend) -> None:
    gen, _ = run(backend, Request(prompt="hello"), max_tokens=3)
    assert (gen.text, gen.finish_reason, gen.completion_tokens) == ("pqr", "length", 3)
    gen, _ = run(backend, Request(prompt="hello", stop=["tu"]))
    assert (gen.text, gen.finish_reason) == ("pqrs", "stop")


def test_chat_messages_use_the_fallback_layout(backend: LlamaBackend) -> None:
    gen, _ = run(backend, Request(messages=[{"role": "user", "content": "hello"}]))  # type: ignore[list-item]
    # "Assistant:" ends in ':', which is not a letter, so the model starts at 'a'.
    assert gen.text == "abcdefghijklmnopqrstuvwxyz"


def test_prompt_over_the_context_window_is_refused_before_generation(backend: LlamaBackend) -> None:
    with pytest.raises(ContextTooLong) as info:
        run(backend, Request(prompt="x" * 300))
    assert "max_seq_len" in info.value.message and info.value.code == "context_too_long"


def test_output_is_cut_by_the_context_window(endless_model: Path) -> None:
    gen, _ = run(backend_for(endless_model), Request(prompt="x" * 200), max_tokens=200)
    assert gen.finish_reason == "context"
    assert gen.prompt_tokens + gen.completion_tokens == 256


def test_deadline_is_checked_between_tokens(endless_model: Path) -> None:
    gen_backend = backend_for(endless_model, max_seq_len=4096)
    with pytest.raises(GenerationTimeout):
        run(gen_backend, Request(prompt="a"), max_tokens=4000, deadline_s=0.0)


def test_a_file_that_is_not_a_model_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="could not load"):
        backend_for(bad)
