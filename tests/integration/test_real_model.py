"""The worker on real weights: Gemma 3 270M (base, Q4_K_M), the model of Laya's [model] extra.

A base model continues text, so the prompts here are the start of a document it completes: a question
and "Answer:". Its answers are checked by their first words, which are the same on llama.cpp's AVX2 and
AVX-512 kernels, not by whole texts, whose later tokens may differ between kernels.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from laya.config import Settings
from laya.errors import InvalidRequest
from laya.memory.modelfile import read_model_info
from laya.memory.planner import kv_cache_bytes
from laya.schema import Request
from laya.worker.backend import Controls, Generation, LlamaBackend

FRANCE = "Question: What is the capital of France?\nAnswer:"
PROBE = Path(__file__).with_name("kv_probe.py")


def backend_for(model: Path, **model_fields: object) -> LlamaBackend:
    return LlamaBackend(Settings.model_validate({"model": {"path": str(model), **model_fields},
                                                 "runtime": {"max_seq_len": 1024}}))


@pytest.fixture(scope="module")
def gemma(gemma_model: Path) -> LlamaBackend:
    return backend_for(gemma_model)


def run(backend: LlamaBackend, request: Request, max_tokens: int = 24, **controls: object) -> Generation:
    return backend.generate(request, max_tokens=max_tokens,
                            controls=Controls(deadline=time.monotonic() + 120, **controls))  # type: ignore[arg-type]


def test_greedy_answers_are_ones_a_toy_cannot_give(gemma: LlamaBackend) -> None:
    gen = run(gemma, Request(prompt=FRANCE))
    assert gen.text.startswith(" Paris\n"), gen.text
    assert (gen.finish_reason, gen.completion_tokens) == ("length", 24)
    # The famous counter-example: without the question layout the base model rambles instead.
    assert "Paris" not in run(gemma, Request(prompt="The capital of France is"), max_tokens=12).text


def test_stop_strings_and_max_tokens(gemma: LlamaBackend) -> None:
    stopped = run(gemma, Request(prompt=FRANCE, stop=["\n"]))
    assert (stopped.text, stopped.finish_reason) == (" Paris", "stop")
    short = run(gemma, Request(prompt="Question: What do bees make?\nAnswer:"), max_tokens=3)
    assert (short.completion_tokens, short.finish_reason) == (3, "length")
    assert short.text.startswith(" Bees")


def test_a_stream_joins_into_the_final_text(gemma: LlamaBackend) -> None:
    pieces: list[str] = []
    beats: list[int] = []
    gen = run(gemma, Request(prompt="The three primary colours are", stop=[" and"]), max_tokens=32,
              on_text=pieces.append, on_token=beats.append)
    assert gen.text == "".join(pieces) == " red, yellow", gen.text
    assert len(pieces) > 1 and gen.finish_reason == "stop"
    assert [n for n in beats if n] == list(range(1, gen.completion_tokens + 1))


def test_a_json_schema_answer_validates(gemma: LlamaBackend) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"], "additionalProperties": False}
    gen = run(gemma, Request(prompt="The capital of France as JSON with keys city and country:\n",
                             response_format={"type": "json_schema", "schema": schema}),  # type: ignore[arg-type]
              max_tokens=48)
    assert gen.finish_reason == "stop", gen.text
    value = json.loads(gen.text)
    jsonschema.validate(value, schema)
    assert value["city"] == "Paris"


def test_a_repeated_prefix_is_not_evaluated_again(gemma: LlamaBackend) -> None:
    template = "Label the sentiment of each review as positive or negative.\n" * 8
    first = run(gemma, Request(prompt=template + "Review: I loved it.\nSentiment:", stop=["\n"]), max_tokens=4)
    second = run(gemma, Request(prompt=template + "Review: Awful, broke in a day.\nSentiment:", stop=["\n"]),
                 max_tokens=4)
    shared = len(gemma.llm.tokenize(template.encode()))
    assert first.cached_tokens < shared <= second.cached_tokens < second.prompt_tokens
    cold = backend_for(Path(gemma.path))  # a fresh context: the same answer, evaluated from nothing
    assert run(cold, Request(prompt=template + "Review: Awful, broke in a day.\nSentiment:", stop=["\n"]),
               max_tokens=4).text == second.text


def test_chat_without_a_template_uses_the_plain_layout_and_stops_at_the_next_turn(gemma: LlamaBackend) -> None:
    assert "tokenizer.chat_template" not in gemma.llm.metadata  # a base model
    gen = run(gemma, Request(messages=[{"role": "user", "content": "What is the capital of France?"}]),  # type: ignore[list-item]
              max_tokens=32)
    assert gen.text == " The capital of France is Paris.", gen.text
    assert gen.finish_reason == "stop"


def test_chat_without_a_template_can_be_refused_with_the_fix(gemma_model: Path) -> None:
    refusing = backend_for(gemma_model, chat_without_template="refuse")
    with pytest.raises(InvalidRequest) as info:
        run(refusing, Request(messages=[{"role": "user", "content": "hi"}]))  # type: ignore[list-item]
    assert info.value.field == "messages"
    assert "no chat template" in info.value.message and "send the text to complete as prompt" in info.value.message
    assert run(refusing, Request(prompt=FRANCE, stop=["\n"])).text == " Paris"  # prompts are still served


LOG = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")


@pytest.mark.parametrize("ctx", [1024, 4096])
def test_the_sliding_window_layers_kv_cache_is_planned_exactly(gemma_model: Path, ctx: int) -> None:
    """Gemma 3 keeps two KV caches, one for its sliding-window layers and one for the others; Laya runs
    the sliding-window one at full size (so any prefix can be cut back), and plans both."""
    run_ = subprocess.run([sys.executable, str(PROBE), str(gemma_model), str(ctx), "1", "1"],
                          check=False, capture_output=True, text=True, timeout=120)
    caches = LOG.findall(run_.stderr)
    assert len(caches) == 2, run_.stderr[-2000:]  # the non-SWA cache and the SWA one
    model = read_model_info(gemma_model)
    assert sum(int(layers) for _, _, layers in caches) == model.n_layer
    assert {int(cells) for _, cells, _ in caches} == {ctx}
    k, v = kv_cache_bytes(model, ctx, 1, "f16")
    assert f"{(k + v) / 2**20:.2f}" == f"{sum(float(mib) for mib, _, _ in caches):.2f}"


MEASURE = r"""
import json, sys, time
from laya.config import Settings
from laya.memory.machine import resident_bytes
from laya.schema import Request
from laya.worker.backend import Controls
from laya.worker.rqworker import plan_and_load
settings = Settings.model_validate({"model": {"path": sys.argv[1]}, "runtime": {"max_seq_len": 2048}})
backend, plan = plan_and_load(settings)
sentence = "The queue is the backpressure: one job at a time per GPU. "
per = len(backend.llm.tokenize(sentence.encode(), add_bos=False))
prompt = sentence * ((backend.n_ctx - 100) // per)  # nearly fills the window: every KV page is touched
gen = backend.generate(Request(prompt=prompt), max_tokens=16, controls=Controls(deadline=time.monotonic() + 300))
print(json.dumps({"rss": resident_bytes(), "predicted": plan.ram_predicted, "prompt_tokens": gen.prompt_tokens}))
"""


def test_the_loaded_workers_memory_is_within_a_tenth_of_the_plan(gemma_model: Path) -> None:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(gemma_model)], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    measured = json.loads(out.strip().splitlines()[-1])
    assert measured["prompt_tokens"] > 1800
    assert abs(measured["rss"] - measured["predicted"]) <= 0.10 * measured["rss"], measured
