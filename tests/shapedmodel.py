"""Write GGUF models with real architectures' shapes and quantisations, answering deterministically.

The tiny model (:mod:`laya.worker.tinymodel`) is F16 and 288 wide: llama.cpp never takes
the code paths a user's download takes. Those paths differ by quantisation (CPU
repack and AMX kernels exist only for quantised weights), by shape (grouped-query
attention, a head size that is not ``n_embd / n_head``, a 150,000-token output
matrix) and by architecture (Qwen2's attention biases, Qwen3's Q/K norms). This
module writes a file with a published model's shapes, its tensor table and the
quantisation mix llama.cpp's ``Q4_K_M`` or ``Q8_0`` gives it, in seconds, with
as many layers as a test can afford.

The weights are random except where they steer the output, as the tiny model's
do: embeddings of the 259 byte and control tokens are one-hot, the output matrix
maps each of them to the next letter (so ``"hello"`` is answered ``"pqrstuvwxyz"``,
see :func:`laya.worker.tinymodel.expected_completion`), and the attention output and FFN
down projections are small enough that the random layers cannot change the
argmax. Every other weight is random and every matrix product runs at full size.

The K-quant encoders here are simple (one pass, no error search); they only have
to produce valid blocks, which the tests check against ``gguf``'s decoders.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from laya.worker.tinymodel import VOCAB, next_token_table, vocabulary

if TYPE_CHECKING:
    import gguf

__all__ = ["SHAPES", "ModelShape", "quantize", "write_shaped_model"]

QK_K = 256
_LOGIT = 8.0
_STEER_NOISE = 1e-4
"""Std of the attention output and FFN down weights: small enough that the lookup table wins."""

Quant = Literal["Q4_K_M", "Q8_0", "F16"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A published model's hyperparameters (from its config.json)."""

    name: str
    arch: Literal["qwen2", "qwen3", "llama"]
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    rope_base: float = 1_000_000.0

    def with_layers(self, n_layer: int) -> ModelShape:
        return replace(self, n_layer=n_layer)


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 32768),
    ModelShape("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 32768),
    ModelShape("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960),
    ModelShape("qwen3-4b", "qwen3", 2560, 36, 32, 8, 128, 9728, 151936, 40960),
    ModelShape("llama-3.1-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500_000.0),
)}

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# -- quantisation ---------------------------------------------------------------------------------

def _q4_k(rows: np.ndarray) -> np.ndarray:
    """Q4_K blocks: 256 weights as 8 sub-blocks of 32, each ``d·sc·q - dmin·m`` with 6-bit sc, m."""
    x = rows.reshape(-1, 8, 32).astype(np.float32)
    low = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - low) / 15.0
    d = (scale.max(axis=1) / 63.0).astype(np.float16)
    dmin = (-low.min(axis=1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(np.divide(-low, dmin32, out=np.zeros_like(low), where=dmin32 > 0)), 0, 63).astype(np.uint8)
    step = (d32 * sc)[:, :, None]
    offset = (dmin32 * m)[:, :, None]
    q = np.clip(np.rint(np.divide(x + offset, step, out=np.zeros_like(x), where=step > 0)), 0, 15).astype(np.uint8)
    scales = np.empty((x.shape[0], 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    pairs = q.reshape(-1, 4, 2, 32)  # sub-blocks 2k and 2k+1 share bytes: low and high nibble
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1)


def _q6_k(rows: np.ndarray) -> np.ndarray:
    """Q6_K blocks: 256 weights as 16 sub-blocks of 16, each ``d·sc·(q - 32)`` with an int8 sc."""
    x = rows.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(axis=2) / 31.0
    d = (scale.max(axis=1) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 127).astype(np.int8)
    step = (d32 * sc)[:, :, None]
    q = (np.clip(np.rint(np.divide(x, step, out=np.zeros_like(x), where=step > 0)), -32, 31) + 32).astype(np.uint8)
    # Each half of 128 weights is four runs of 32 (a, b, c, e) packed as ql: a|c<<4, b|e<<4 and
    # qh: the top two bits of a, b, c, e in one byte.
    q = q.reshape(-1, 2, 4, 32)
    a, b, c, e = q[:, :, 0], q[:, :, 1], q[:, :, 2], q[:, :, 3]
    ql = np.concatenate([(a & 0xF) | ((c & 0xF) << 4), (b & 0xF) | ((e & 0xF) << 4)], axis=2).reshape(-1, 128)
    qh = ((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)


def _q8_0(rows: np.ndarray) -> np.ndarray:
    x = rows.reshape(-1, 32).astype(np.float32)
    d = (np.abs(x).max(axis=1) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)[:, None]
    q = np.clip(np.rint(np.divide(x, d32, out=np.zeros_like(x), where=d32 > 0)), -127, 127).astype(np.int8)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)


_ENCODERS = {"Q4_K": _q4_k, "Q6_K": _q6_k, "Q8_0": _q8_0}


def quantize(matrix: np.ndarray, type_name: str) -> np.ndarray:
    """Rows of ``matrix`` as GGUF blocks of ``type_name`` (Q4_K, Q6_K, Q8_0): uint8, one row per row."""
    return _ENCODERS[type_name](matrix).reshape(matrix.shape[0], -1)


# -- the file -------------------------------------------------------------------------------------

def _more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's Q4_K_M rule for which layers keep attn_v and ffn_down in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def _type_for(name: str, layer: int | None, n_layer: int, quant: Quant) -> str:
    if quant != "Q4_K_M":
        return quant
    if name == "output.weight":
        return "Q6_K"
    if layer is not None and name.endswith(("attn_v.weight", "ffn_down.weight")) and _more_bits(layer, n_layer):
        return "Q6_K"
    return "Q4_K"


class _Tensors:
    """Adds tensors of one model: random matrices are a block of random rows, quantised once and
    repeated (a 7B model in seconds, not minutes), with chosen rows overwritten where they steer."""

    _POOL_ROWS = 64

    def __init__(self, writer: gguf.GGUFWriter, shape: ModelShape, quant: Quant, seed: int) -> None:
        self.writer = writer
        self.shape = shape
        self.quant = quant
        self.rng = np.random.default_rng(seed)

    def matrix(self, name: str, rows: int, cols: int, std: float, layer: int | None = None,
               steer: np.ndarray | None = None) -> None:
        """A ``rows × cols`` matrix of N(0, std²) weights whose first rows are ``steer`` when given."""
        import gguf

        kind = _type_for(name, layer, self.shape.n_layer, self.quant)
        pool = self.rng.standard_normal((min(rows, self._POOL_ROWS), cols), dtype=np.float32) * std
        encode = (lambda m: m.astype(np.float16)) if kind == "F16" else (lambda m: quantize(m, kind))
        data = np.tile(encode(pool), (-(-rows // len(pool)), 1))[:rows]
        if steer is not None:
            data[:len(steer)] = encode(steer)
        if kind == "F16":
            self.writer.add_tensor(name, data)
        else:
            self.writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])

    def vector(self, name: str, values: np.ndarray) -> None:
        self.writer.add_tensor(name, values.astype(np.float32))


def write_shaped_model(path: str | Path, shape: ModelShape, quant: Quant = "Q4_K_M", *, stops: bool = True,
                       seed: int = 0) -> Path:
    """Write ``shape`` (use :meth:`ModelShape.with_layers` for fewer layers) in ``quant`` to ``path``.

    With ``stops=False`` the answer never ends (``z`` is followed by ``a``): for timing decoding.
    """
    import gguf

    if shape.n_vocab < VOCAB or shape.n_embd < VOCAB:
        raise ValueError(f"vocabulary and width must be at least {VOCAB} for the steering lookup table")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"{shape.name} (laya random {quant})")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type({"Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "F16": gguf.LlamaFileType.MOSTLY_F16}[quant])
    vocabulary(writer, n_vocab=shape.n_vocab, chat_template=CHATML)
    tensors = _Tensors(writer, shape, quant, seed)
    _add_lookup_table(tensors, shape, stops)
    for layer in range(shape.n_layer):
        _add_layer(tensors, shape, layer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_lookup_table(t: _Tensors, shape: ModelShape, stops: bool) -> None:
    """Byte and control tokens: one-hot in, ``next = f(current)`` out; the rest of the vocabulary random."""
    embedding = np.zeros((VOCAB, shape.n_embd), dtype=np.float32)
    embedding[np.arange(VOCAB), np.arange(VOCAB)] = 1.0
    t.matrix("token_embd.weight", shape.n_vocab, shape.n_embd, 0.02, steer=embedding)
    output = np.zeros((VOCAB, shape.n_embd), dtype=np.float32)
    output[next_token_table(stops), np.arange(VOCAB)] = _LOGIT
    t.vector("output_norm.weight", np.ones(shape.n_embd))
    t.matrix("output.weight", shape.n_vocab, shape.n_embd, 0.02, steer=output)


def _add_layer(t: _Tensors, shape: ModelShape, layer: int) -> None:
    q_dim, kv_dim = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    blk = f"blk.{layer}"
    t.vector(f"{blk}.attn_norm.weight", np.ones(shape.n_embd))
    t.matrix(f"{blk}.attn_q.weight", q_dim, shape.n_embd, 0.02, layer)
    t.matrix(f"{blk}.attn_k.weight", kv_dim, shape.n_embd, 0.02, layer)
    t.matrix(f"{blk}.attn_v.weight", kv_dim, shape.n_embd, 0.02, layer)
    t.matrix(f"{blk}.attn_output.weight", shape.n_embd, q_dim, _STEER_NOISE, layer)
    if shape.arch == "qwen2":
        for part, width in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            t.vector(f"{blk}.attn_{part}.bias", np.zeros(width))
    if shape.arch == "qwen3":
        t.vector(f"{blk}.attn_q_norm.weight", np.ones(shape.head_dim))
        t.vector(f"{blk}.attn_k_norm.weight", np.ones(shape.head_dim))
    t.vector(f"{blk}.ffn_norm.weight", np.ones(shape.n_embd))
    t.matrix(f"{blk}.ffn_gate.weight", shape.n_ff, shape.n_embd, 0.02, layer)
    t.matrix(f"{blk}.ffn_up.weight", shape.n_ff, shape.n_embd, 0.02, layer)
    t.matrix(f"{blk}.ffn_down.weight", shape.n_embd, shape.n_ff, _STEER_NOISE, layer)
