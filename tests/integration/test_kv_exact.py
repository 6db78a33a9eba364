"""The planner's KV cache size equals what llama.cpp itself allocates and logs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from laya.memory.modelfile import read_model_info
from laya.memory.planner import kv_cache_bytes, padded_ctx
from laya.worker.backend import GGML_KV_TYPE
from laya.worker.tinymodel import TinyModelSpec, write_tiny_model

PROBE = Path(__file__).with_name("kv_probe.py")
LOG = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/\d+ seqs\), "
                 r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
MODELS = {
    # GQA: 4 query heads share 2 KV heads; head_dim = 288 / 4 = 72.
    "gqa": TinyModelSpec(dim=288, n_layer=2, n_head=4, n_head_kv=2),
    # head_dim (64) differs from embedding / heads (72); GQA 4:2.
    "head64": TinyModelSpec(dim=288, n_layer=3, n_head=4, n_head_kv=2, head_dim=64),
    # head_dim 128 (differs from 288 / 8 = 36), GQA 8:4, more layers: sizes large enough that
    # llama.cpp's two printed decimals pin the byte count down.
    "head128": TinyModelSpec(dim=288, n_layer=6, n_head=8, n_head_kv=4, head_dim=128),
}
CASES = [("gqa", 300, 1, "f16"), ("gqa", 2048, 1, "f16"), ("gqa", 1000, 3, "f16"), ("head64", 257, 1, "f16"),
         ("head64", 5000, 4, "f16"), ("head64", 1000, 3, "q8_0"), ("head128", 4096, 1, "f16"),
         ("head128", 2048, 2, "q8_0"), ("head128", 3000, 2, "q4_0"), ("head128", 8192, 1, "q8_0")]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("kv")
    return {name: write_tiny_model(folder / f"{name}.gguf", spec) for name, spec in MODELS.items()}


@pytest.mark.parametrize(("name", "ctx", "n_seq", "kv"), CASES)
def test_kv_bytes_match_llama_cpp(models: dict[str, Path], name: str, ctx: int, n_seq: int, kv: str) -> None:
    # Laya's max_seq_len is per sequence; llama.cpp's n_ctx is the total over sequences.
    run = subprocess.run([sys.executable, str(PROBE), str(models[name]), str(ctx * n_seq), str(n_seq),
                          str(GGML_KV_TYPE[kv])], check=False, capture_output=True, text=True, timeout=60)
    found = LOG.search(run.stderr)
    assert found, run.stderr[-2000:]
    total, cells, layers, seqs, k_type, k_mib, v_type, v_mib = found.groups()
    model = read_model_info(models[name])
    k, v = kv_cache_bytes(model, ctx, n_seq, kv)
    assert (int(cells), int(layers), int(seqs), k_type, v_type) == (padded_ctx(ctx), model.n_layer, n_seq, kv, kv)
    mib = 1024 * 1024
    assert (f"{k / mib:.2f}", f"{v / mib:.2f}", f"{(k + v) / mib:.2f}") == (k_mib, v_mib, total)
