"""The worker on models with real architectures' shapes and quantisations, not only the tiny F16 one.

The models are written by the test session (tests.shapedmodel): two layers of Qwen2.5-1.5B in Q4_K_M
(GQA 12/2, a 151,936-token vocabulary, Q4_K with Q6_K) and of Qwen3-0.6B in Q8_0 (Q/K norms, a head
size of 128 that is not 1024/16). Their answers are steered, so each test knows the exact text.

On Xeons with AMX, llama.cpp's CPU extra buffers crash the worker on such models (issue 12); the
default ``model.cpu_extra_buffers = "auto"`` turns them off there. On CPUs without AMX the crash does
not happen, so these tests check the answers in every mode there, and in "auto" and "off" on AMX (where
"auto" must choose off, or the test process dies), and that the mode really reaches llama.cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laya.client import Client
from laya.config import Settings
from laya.memory.modelfile import read_model_info
from laya.schema import Request
from laya.worker.backend import Controls, LlamaBackend
from laya.worker.tinymodel import expected_completion
from tests.conftest import Server
from tests.processes import start_laya, stop_laya
from tests.shapedmodel import SHAPES, write_shaped_model

MODELS = {"qwen2.5-1.5b-Q4_K_M": ("qwen2.5-1.5b", "Q4_K_M"), "qwen3-0.6b-Q8_0": ("qwen3-0.6b", "Q8_0")}


@pytest.fixture(scope="session")
def shaped_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("shaped")
    return {key: write_shaped_model(folder / f"{key}.gguf", SHAPES[shape].with_layers(2), quant)  # type: ignore[arg-type]
            for key, (shape, quant) in MODELS.items()}


def test_the_models_have_the_shapes_and_types_users_download(shaped_models: dict[str, Path]) -> None:
    qwen25 = read_model_info(shaped_models["qwen2.5-1.5b-Q4_K_M"])
    assert (qwen25.architecture, qwen25.n_embd, qwen25.n_head, qwen25.n_head_kv[0], qwen25.n_vocab) == \
        ("qwen2", 1536, 12, 2, 151936)
    types = {t.name: t.type_name for t in qwen25.tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    # llama.cpp keeps attn_v and ffn_down in Q6_K on its "more bits" layers: the last of two here
    assert types["blk.1.attn_v.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q4_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["blk.1.attn_q.weight"] == "Q4_K"
    assert qwen25.file_type == "Q4_K_M"
    qwen3 = read_model_info(shaped_models["qwen3-0.6b-Q8_0"])
    assert qwen3.key_length == 128 and qwen3.n_embd // qwen3.n_head == 64 and qwen3.n_head_kv[0] == 8
    assert {t.type_name for t in qwen3.tensors if len(t.shape) == 2} == {"Q8_0"}


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_worker_backend_answers_prompts_and_chats(shaped_models: dict[str, Path], model: str, mode: str) -> None:
    if mode == "on" and "amx_int8" in _cpu_flags():
        pytest.skip("llama.cpp's AMX kernels crash on quantised weights (the process dies): why auto turns them off")
    settings = Settings.model_validate({"model": {"path": str(shaped_models[model]), "cpu_extra_buffers": mode},
                                        "runtime": {"max_seq_len": 512}})
    backend = LlamaBackend(settings)
    assert backend.extra_buffers is {"on": True, "off": False}.get(mode, backend.extra_buffers)
    deadline = time.monotonic() + 120
    prompt = backend.generate(Request(prompt="hello"), max_tokens=40, controls=Controls(deadline=deadline, on_token=lambda n: None))
    assert (prompt.text, prompt.finish_reason) == (expected_completion("hello", 40), "stop")
    chat = backend.generate(Request(messages=[{"role": "user", "content": "hi"}]), max_tokens=40,
                            controls=Controls(deadline=deadline, on_token=lambda n: None))
    assert chat.text == "abcdefghijklmnopqrstuvwxyz" and chat.prompt_tokens > 20  # the ChatML template was used


LOAD_AND_REPORT = r"""
import sys
import llama_cpp
from laya.worker.backend import _model_params
with _model_params(use_extra_bufts=sys.argv[2] == "on"):
    llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, verbose=True)
"""


def test_the_extra_buffer_switch_reaches_llama_cpp(shaped_models: dict[str, Path]) -> None:
    """llama.cpp's own load report: repacked weights only when asked for (on a CPU that repacks Q4_K)."""
    if not {"avx2"} <= _cpu_flags():
        pytest.skip("llama.cpp repacks Q4_K only on AVX2 CPUs")
    reports = {}
    for mode in ("on", "off"):
        proc = subprocess.run([sys.executable, "-c", LOAD_AND_REPORT, str(shaped_models["qwen2.5-1.5b-Q4_K_M"]),
                               mode], capture_output=True, text=True, timeout=120, check=True)
        reports[mode] = proc.stderr
    extra = ("CPU_REPACK model buffer", "AMX model buffer")
    assert any(name in reports["on"] for name in extra)
    assert not any(name in reports["off"] for name in extra)


def _cpu_flags() -> frozenset[str]:
    from laya.memory.machine import cpu_flags

    return cpu_flags()


def test_the_real_stack_answers_on_a_quantised_model(redis_server: Server, shaped_models: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """Router and worker processes, as `laya up` runs them, on the Q4_K_M model."""
    client = redis_server.client()
    client.flushall()
    env = {**os.environ, "LAYA_REDIS_URL": redis_server.url, "LAYA_MODEL_PATH": str(shaped_models["qwen2.5-1.5b-Q4_K_M"]),
           "LAYA_RUNTIME__MAX_SEQ_LEN": "512"}
    log = tmp_path / "worker.log"
    procs = [start_laya("router", env), start_laya("worker", env, log=log)]
    try:
        laya = Client(client)
        answer = laya.ask("hello", max_tokens=40, timeout=120)
        chat = laya.ask(messages=[{"role": "user", "content": "hi"}], max_tokens=40, timeout=60)
    finally:
        stop_laya(*procs)
    assert (answer.route, answer.text) == ("model:default", "pqrstuvwxyz")
    assert chat.text == "abcdefghijklmnopqrstuvwxyz"
    assert "CPU extra buffers" in log.read_text()  # the log says which mode is in use and why
