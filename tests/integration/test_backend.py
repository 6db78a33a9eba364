"""The real llama.cpp path, on the tiny hand-wired model (its answers are known in advance)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from laya.config import Settings
from laya.errors import ContextTooLong, GenerationTimeout, ModelLoadError
from laya.schema import Request
from laya.worker.backend import Controls, LlamaBackend
from laya.worker.tinymodel import TinyModelSpec, expected_completion, write_tiny_model


def backend_for(model: Path, **runtime: object) -> LlamaBackend:
    return LlamaBackend(Settings.model_validate({"model": {"path": str(model)},
                                                 "runtime": {"max_seq_len": 256, **runtime}}))


@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> LlamaBackend:
    return backend_for(tiny_model)


def run(backend: LlamaBackend, request: Request, max_tokens: int = 64, deadline_s: float = 30):
    beats: list[int] = []
    gen = backend.generate(request, max_tokens=max_tokens, controls=Controls(deadline=time.monotonic() + deadline_s,
                           on_token=beats.append))
    return gen, beats


@pytest.mark.parametrize("prompt", ["hello", "What is 2+2?", "k", "zebra z"])
def test_answers_are_the_known_ones(backend: LlamaBackend, prompt: str) -> None:
    gen, beats = run(backend, Request(prompt=prompt))
    assert gen.text == expected_completion(prompt, 64)
    assert gen.finish_reason == "stop"
    assert gen.completion_tokens == len(gen.text) == len([n for n in beats if n > 0])
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

    def stall_at_ten(count: int) -> None:
        if count == 10:
            time.sleep(2.5)

    # Ten tokens take milliseconds; 2 s leaves room for a loaded machine to reach them before the deadline.
    with pytest.raises(GenerationTimeout) as info:
        gen_backend.generate(Request(prompt="a"), max_tokens=4000, controls=Controls(deadline=time.monotonic() + 2.0,
                             on_token=stall_at_ten))
    assert "deadline passed after 11 tokens" in info.value.message


def prompt_tokens_evaluated(backend: LlamaBackend, request: Request) -> int:
    """How many prompt tokens llama.cpp itself counted as evaluated for this one request."""
    import llama_cpp

    llama_cpp.llama_synchronize(backend.llm.ctx)  # llama.cpp counts queued work when it waits for it
    llama_cpp.llama_perf_context_reset(backend.llm.ctx)
    run(backend, request)
    return int(llama_cpp.llama_perf_context(backend.llm.ctx).n_p_eval)


def test_a_long_prompt_is_evaluated_in_chunks_with_a_heartbeat_after_each(tiny_model: Path) -> None:
    chunked = backend_for(tiny_model, max_seq_len=2048, n_batch=64)
    prompt = "thequickbrownfoxjumpsoverthelazydog." * 28 + "hello"  # 1,013 bytes, no spaces
    gen, beats = run(chunked, Request(prompt=prompt))
    # BOS, SentencePiece's leading space (3 byte tokens), then a token per byte.
    assert gen.text == expected_completion(prompt, 64) and gen.prompt_tokens == 4 + len(prompt)
    # All but the last of the 1,017 prompt tokens, 64 at a time, a heartbeat (count 0) after each chunk.
    assert beats[:16] == [0] * 16 and beats[16] == 1 and 0 not in beats[16:]
    # Each prompt token is evaluated once: generate() found the chunks in its cache.
    assert prompt_tokens_evaluated(chunked, Request(prompt=prompt + "x")) == 1  # all but "x" cached
    # The next request shares the first 900 bytes (904 tokens): only the other 13 are evaluated.
    second = prompt[:900] + "butnotthecatk"
    assert prompt_tokens_evaluated(chunked, Request(prompt=second)) == 13
    gen, beats = run(chunked, Request(prompt=second))
    assert gen.text == expected_completion(second, 64)
    assert 0 not in beats  # the same prompt again: all but its last token cached, nothing to prefill
    # An unrelated prompt shares only the BOS token.
    gen, beats = run(chunked, Request(prompt="zebra z"))
    assert gen.text == expected_completion("zebra z", 64)


def test_the_deadline_is_checked_while_a_long_prompt_is_evaluated(tiny_model: Path) -> None:
    chunked = backend_for(tiny_model, max_seq_len=2048, n_batch=64)
    prompt = "x" * 996  # 1,000 tokens

    def slow_heartbeat(count: int) -> None:
        time.sleep(0.3)

    with pytest.raises(GenerationTimeout) as info:
        chunked.generate(Request(prompt=prompt), max_tokens=8, controls=Controls(deadline=time.monotonic() + 0.1,
                         on_token=slow_heartbeat))
    assert "while evaluating the 1000-token prompt" in info.value.message
    # The chunk evaluated before the deadline passed stays cached; the next request goes on from it.
    assert prompt_tokens_evaluated(chunked, Request(prompt=prompt)) == 1000 - 64


def test_a_recurrent_model_evaluates_each_prompt_afresh(tmp_path: Path) -> None:
    # Mamba's state cannot be cut back to a shared prefix: the prompt cache must start over.
    model = write_tiny_model(tmp_path / "mamba.gguf", TinyModelSpec(arch="mamba"))
    recurrent = backend_for(model, max_seq_len=512, n_batch=64)
    for prompt in ["hello", "hello", "world", "abc" * 50, "abc" * 50 + "k"]:
        assert prompt_tokens_evaluated(recurrent, Request(prompt=prompt)) == 4 + len(prompt)
        gen, _ = run(recurrent, Request(prompt=prompt), max_tokens=8)
        assert gen.text == expected_completion(prompt, 8)
    # A prompt that begins with everything evaluated so far (a chat's next turn) keeps the state.
    gen, _ = run(recurrent, Request(prompt="hello"))
    assert gen.finish_reason == "stop"
    assert prompt_tokens_evaluated(recurrent, Request(prompt="hello" + gen.text + "abc")) == len("abc")


def test_a_file_that_is_not_a_model_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="could not load"):
        backend_for(bad)


def test_llama_cpp_runs_one_thread_per_usable_core_unless_configured(tiny_model: Path) -> None:
    from laya.memory.machine import cpu_threads

    unset = LlamaBackend(Settings.model_validate({"model": {"path": str(tiny_model)}}))
    assert unset.llm.n_threads == unset.llm.n_threads_batch == cpu_threads().count
    one = LlamaBackend(Settings.model_validate({"model": {"path": str(tiny_model), "n_threads": 1}}))
    assert one.llm.n_threads == one.llm.n_threads_batch == 1
