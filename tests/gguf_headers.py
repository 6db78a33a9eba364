"""Header-only GGUF files with real models' metadata, for planning without multi-GB downloads.

Shapes and tensor types follow the published GGUF files (Q4_K_M mixes Q4_K with
Q6_K for ``output``, and for ``attn_v``/``ffn_down`` in half of the layers).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGMLQuantizationType as T

F32, Q4_K, Q6_K = T.F32, T.Q4_K, T.Q6_K


@dataclass(frozen=True)
class Arch:
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    ctx_train: int
    head_dim: int | None = None
    qkv_bias: bool = False
    tied_output: bool = False


QWEN25_7B = Arch("qwen2", "Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 18944, 152064, 32768, qkv_bias=True)
LLAMA31_8B = Arch("llama", "Meta-Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 14336, 128256, 131072)
MISTRAL_NEMO_12B = Arch("llama", "Mistral-Nemo-Instruct-2407", 40, 5120, 32, 8, 14336, 131072, 1024000,
                        head_dim=128)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, value: object) -> bytes:
    if isinstance(value, str):
        return _string(key) + struct.pack("<I", 8) + _string(value)
    if isinstance(value, float):
        return _string(key) + struct.pack("<If", 6, value)
    if isinstance(value, list):  # string arrays only (the vocabulary)
        return _string(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    return _string(key) + struct.pack("<II", 4, int(value))  # type: ignore[call-overload]


def tensors(a: Arch) -> list[tuple[str, tuple[int, ...], T]]:
    head_dim = a.head_dim or a.n_embd // a.n_head
    q, kv = a.n_head * head_dim, a.n_head_kv * head_dim
    out: list[tuple[str, tuple[int, ...], T]] = [("token_embd.weight", (a.n_embd, a.n_vocab), Q4_K),
                                                 ("output_norm.weight", (a.n_embd,), F32)]
    if not a.tied_output:
        out.append(("output.weight", (a.n_embd, a.n_vocab), Q6_K))
    for i in range(a.n_layer):
        heavy = Q6_K if i % 2 == 0 else Q4_K  # Q4_K_M: "use_more_bits" layers
        p = f"blk.{i}"
        out += [(f"{p}.attn_norm.weight", (a.n_embd,), F32), (f"{p}.ffn_norm.weight", (a.n_embd,), F32),
                (f"{p}.attn_q.weight", (a.n_embd, q), Q4_K), (f"{p}.attn_k.weight", (a.n_embd, kv), Q4_K),
                (f"{p}.attn_v.weight", (a.n_embd, kv), heavy), (f"{p}.attn_output.weight", (q, a.n_embd), Q4_K),
                (f"{p}.ffn_gate.weight", (a.n_embd, a.n_ff), Q4_K), (f"{p}.ffn_up.weight", (a.n_embd, a.n_ff), Q4_K),
                (f"{p}.ffn_down.weight", (a.n_ff, a.n_embd), heavy)]
        if a.qkv_bias:
            out += [(f"{p}.attn_q.bias", (q,), F32), (f"{p}.attn_k.bias", (kv,), F32),
                    (f"{p}.attn_v.bias", (kv,), F32)]
    return out


def write_header(path: Path, a: Arch, *, vocab_tokens: bool = True, override: dict[str, object] | None = None,
                 tensor_type: int | None = None) -> Path:
    """A header-only GGUF of ``a``; ``override`` replaces header keys, ``tensor_type`` every tensor's type id."""
    meta: dict[str, object] = {
        "general.architecture": a.arch, "general.name": a.name, "general.file_type": 15,  # MOSTLY_Q4_K_M
        f"{a.arch}.block_count": a.n_layer, f"{a.arch}.embedding_length": a.n_embd,
        f"{a.arch}.feed_forward_length": a.n_ff, f"{a.arch}.attention.head_count": a.n_head,
        f"{a.arch}.attention.head_count_kv": a.n_head_kv, f"{a.arch}.context_length": a.ctx_train,
        f"{a.arch}.attention.layer_norm_rms_epsilon": 1e-6,
    }
    if a.head_dim is not None:
        meta[f"{a.arch}.attention.key_length"] = a.head_dim
        meta[f"{a.arch}.attention.value_length"] = a.head_dim
    if vocab_tokens:
        meta["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(a.n_vocab)]
    meta.update(override or {})
    infos = tensors(a)
    body = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta))
    body += b"".join(_kv(k, v) for k, v in meta.items())
    for name, shape, kind in infos:
        body += _string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        body += struct.pack("<IQ", kind.value if tensor_type is None else tensor_type, 0)
    path.write_bytes(body)
    return path
