"""Write a tiny llama-architecture GGUF whose output is known in advance.

Tests and ``laya demo`` need a real model that llama.cpp loads in milliseconds
and that answers deterministically. Random weights babble and stop at random,
so this model is wired by hand instead:

* the vocabulary is ``<unk> <s> </s>`` plus the 256 byte tokens, so any text
  tokenises;
* token embeddings are one-hot (``dim >= vocab``) and every attention output and
  FFN down projection is zero, so the hidden state at the last layer *is* the
  current token's embedding;
* the output matrix is then a lookup table ``next = f(current)``: after a
  lowercase letter comes the next letter of the alphabet, after ``z`` the end
  token, and after anything else ``a``.

So the prompt ``"hello"`` is always answered ``"pqrstuvwxyz"`` and the model
stops by itself; with ``stops=False`` ``z`` wraps to ``a`` and generation runs
until ``max_tokens`` (for timeout and heartbeat tests). Attention and FFN
weights still exist at full size, so the file's memory footprint is that of a
real model of the same shape: use ``dim=512, n_layer=8`` for a ~60 MB model.
"""

from __future__ import annotations

import filecmp
import itertools
import logging
import os
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import gguf

__all__ = ["TinyModelSpec", "expected_completion", "next_token_table", "vocabulary", "write_tiny_model"]

N_SPECIAL = 3  # <unk> <s> </s>
VOCAB = N_SPECIAL + 256
EOS = 2
_LOGIT = 8.0


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    dim: int = 288
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int | None = None
    """Per-head size; ``None`` means ``dim // n_head`` (written as key/value_length otherwise)."""
    ff: int = 384
    context_length: int = 4096
    stops: bool = True
    dtype: str = "f16"
    name: str = "laya-tiny"
    chat_template: str | None = None
    """A Jinja chat template to write (``tokenizer.chat_template``); ``None``: no template."""
    arch: Literal["llama", "mamba"] = "llama"
    """``mamba``: recurrent blocks instead of attention (the head and ff fields are unused)."""


def _byte_token(byte: int) -> int:
    return N_SPECIAL + byte


def next_token_table(stops: bool) -> np.ndarray:
    table = np.full(VOCAB, _byte_token(ord("a")), dtype=np.int64)
    letters = string.ascii_lowercase
    for a, b in itertools.pairwise(letters):
        table[_byte_token(ord(a))] = _byte_token(ord(b))
    table[_byte_token(ord("z"))] = EOS if stops else _byte_token(ord("a"))
    return table


def expected_completion(prompt: str, max_tokens: int, *, stops: bool = True) -> str:
    """What the tiny model answers to a plain-text prompt under greedy decoding."""
    last = prompt[-1] if prompt else " "
    out: list[str] = []
    char = chr(ord(last) + 1) if "a" <= last < "z" else ("a" if last != "z" else None)
    while char is not None and len(out) < max_tokens:
        out.append(char)
        char = chr(ord(char) + 1) if char < "z" else ("a" if not stops else None)
    return "".join(out)


def write_tiny_model(path: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the model to ``path`` and return it. Takes milliseconds.

    The file is written beside ``path`` and renamed over it, and not at all when ``path`` already holds the same
    bytes: a worker that has the model mapped (``laya up`` while ``laya demo`` starts) reads the file as it was,
    where a rewrite in place would cut its pages from under it (SIGBUS).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write(fresh, spec or TinyModelSpec())
        if path.is_file() and filecmp.cmp(fresh, path, shallow=False):
            return path
        os.replace(fresh, path)
    finally:
        fresh.unlink(missing_ok=True)
    return path


def _write(path: Path, spec: TinyModelSpec) -> None:
    import gguf  # only needed here; keeps the router free of numpy-heavy imports

    logging.getLogger("gguf").setLevel(logging.WARNING)  # its writer logs each file it writes, at INFO

    if spec.dim < VOCAB:
        raise ValueError(f"dim must be >= {VOCAB} for one-hot embeddings, got {spec.dim}")
    ftype = np.float16 if spec.dtype == "f16" else np.float32
    rng = np.random.default_rng(0)

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(ftype)

    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(spec.name)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.dim)
    writer.add_block_count(spec.n_layer)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    vocabulary(writer, chat_template=spec.chat_template)
    _add_lookup_table(writer, spec, ftype)
    if spec.arch == "mamba":
        _add_mamba_layers(writer, spec, ftype, small)
    else:
        _add_llama_layers(writer, spec, ftype, small)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def vocabulary(writer: gguf.GGUFWriter, *, n_vocab: int = VOCAB, chat_template: str | None = None) -> None:
    """``<unk> <s> </s>``, the 256 byte tokens, then unused fillers up to ``n_vocab`` (a real model's size)."""
    import gguf

    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"<unused{i}>".encode() for i in range(n_vocab - VOCAB)]
    types += [gguf.TokenType.UNUSED] * (n_vocab - VOCAB)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def _add_lookup_table(writer: gguf.GGUFWriter, spec: TinyModelSpec, ftype: type) -> None:
    """One-hot embeddings in, ``next = f(current)`` out (see the module docstring)."""
    embedding = np.zeros((VOCAB, spec.dim), dtype=np.float32)
    embedding[np.arange(VOCAB), np.arange(VOCAB)] = 1.0
    output = np.zeros((VOCAB, spec.dim), dtype=np.float32)
    output[next_token_table(spec.stops), np.arange(VOCAB)] = _LOGIT
    writer.add_tensor("token_embd.weight", embedding.astype(ftype))
    writer.add_tensor("output_norm.weight", np.ones(spec.dim, dtype=np.float32))
    writer.add_tensor("output.weight", output.astype(ftype))


def _add_llama_layers(writer: gguf.GGUFWriter, spec: TinyModelSpec, ftype: type,
                      small: Callable[..., np.ndarray]) -> None:
    head_dim = spec.head_dim or spec.dim // spec.n_head
    writer.add_feed_forward_length(spec.ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    if spec.head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    q_dim, kv_dim = spec.n_head * head_dim, spec.n_head_kv * head_dim
    for layer in range(spec.n_layer):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(spec.dim, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", small(q_dim, spec.dim))
        writer.add_tensor(f"{prefix}.attn_k.weight", small(kv_dim, spec.dim))
        writer.add_tensor(f"{prefix}.attn_v.weight", small(kv_dim, spec.dim))
        # Zero output projections keep the residual stream equal to the embedding.
        writer.add_tensor(f"{prefix}.attn_output.weight", np.zeros((spec.dim, q_dim), dtype=ftype))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(spec.dim, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", small(spec.ff, spec.dim))
        writer.add_tensor(f"{prefix}.ffn_up.weight", small(spec.ff, spec.dim))
        writer.add_tensor(f"{prefix}.ffn_down.weight", np.zeros((spec.dim, spec.ff), dtype=ftype))


def _add_mamba_layers(writer: gguf.GGUFWriter, spec: TinyModelSpec, ftype: type,
                      small: Callable[..., np.ndarray]) -> None:
    """Mamba blocks: recurrent state instead of a KV cache, so llama.cpp cannot cut its
    memory back to a shared prefix (what the backend's prompt cache must cope with)."""
    inner, state, conv, dt_rank = 2 * spec.dim, 16, 4, 8
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(conv)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(state)
    writer.add_ssm_time_step_rank(dt_rank)
    for layer in range(spec.n_layer):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(spec.dim, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_in.weight", small(2 * inner, spec.dim))
        writer.add_tensor(f"{prefix}.ssm_conv1d.weight", small(inner, conv).astype(np.float32))
        writer.add_tensor(f"{prefix}.ssm_conv1d.bias", np.zeros(inner, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_x.weight", small(dt_rank + 2 * state, inner))
        writer.add_tensor(f"{prefix}.ssm_dt.weight", small(inner, dt_rank))
        writer.add_tensor(f"{prefix}.ssm_dt.bias", np.zeros(inner, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_a", -np.ones((inner, state), dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_d", np.ones(inner, dtype=np.float32))
        # A zero output projection keeps the residual stream equal to the embedding.
        writer.add_tensor(f"{prefix}.ssm_out.weight", np.zeros((spec.dim, inner), dtype=ftype))
