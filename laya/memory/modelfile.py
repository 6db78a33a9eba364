"""Read what the planner needs from a GGUF file's header, never its weights.

GGUF layout (little-endian): magic ``GGUF``, version, tensor count, key/value
count, the key/values, then one info record per tensor (name, shape, type,
offset), then the aligned tensor data. Only the first two parts are read; a
tensor's size follows from its shape and type, so a header-only file plans
exactly like the full model.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from laya.errors import GGUFError, UnplannableModel

__all__ = ["ModelInfo", "TensorInfo", "read_model_info"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_name: str
    nbytes: int

    @property
    def layer(self) -> int | None:
        """Block index for ``blk.<i>.*`` tensors, else ``None``."""
        if self.name.startswith("blk."):
            return int(self.name.split(".", 2)[1])
        return None

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: Path
    file_size: int
    architecture: str
    name: str | None
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]
    """KV heads per layer (a scalar in the header is repeated)."""
    key_length: int
    value_length: int
    n_ff: int
    n_vocab: int
    context_length: int | None
    file_type: str | None
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    @property
    def weights_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(t.elements for t in self.tensors)

    def layer_bytes(self, layer: int) -> int:
        return sum(t.nbytes for t in self.tensors if t.layer == layer)

    @property
    def non_layer_bytes(self) -> dict[str, int]:
        return {t.name: t.nbytes for t in self.tensors if t.layer is None}

    @property
    def truncated(self) -> bool:
        """The file is shorter than its header says (a partial download, or a header-only file)."""
        return self.file_size < self.weights_bytes


class _Reader:
    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self.handle = handle
        self.path = path

    def take(self, size: int) -> bytes:
        data = self.handle.read(size)
        if len(data) != size:
            raise GGUFError(f"{self.path}: file ends inside the GGUF header (truncated download?)")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        length = self.scalar("<Q")
        if length > _MAX_STRING:
            raise GGUFError(f"{self.path}: corrupt GGUF header (string of {length} bytes)")
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind in _SCALARS:
                fmt = _SCALARS[item_kind]
                size = struct.calcsize(fmt)
                raw = self.take(size * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", raw)) if count <= 4096 else _Skipped(count)
            if item_kind == _STRING:
                if count > 4096:  # vocabularies: read past, keep only the count
                    for _ in range(count):
                        self.take(self.scalar("<Q"))
                    return _Skipped(count)
                return [self.string() for _ in range(count)]
            raise GGUFError(f"{self.path}: corrupt GGUF header (array of type {item_kind})")
        raise GGUFError(f"{self.path}: corrupt GGUF header (value type {kind})")


@dataclass(frozen=True, slots=True)
class _Skipped:
    """A long array the planner does not need; only its length is kept."""

    count: int

    def __len__(self) -> int:
        return self.count


def _tensor_bytes(path: Path, name: str, shape: tuple[int, ...], type_id: int) -> tuple[str, int]:
    try:
        kind = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        # Likely a quantisation newer than the installed gguf package: llama.cpp may still load it.
        raise UnplannableModel(f"{path}: tensor {name!r} has type {type_id}, unknown to the planner "
                               "(upgrade the gguf package)") from None
    elements = 1
    for dim in shape:
        elements *= dim
    return kind.name, elements // block * size


def read_model_info(path: str | Path) -> ModelInfo:
    """Parse the header; raise :class:`GGUFError` for anything that is not a usable GGUF model."""
    path = Path(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the `with` below
    except OSError as exc:
        raise GGUFError(f"{path}: cannot open: {exc.strerror}") from None
    with handle:
        reader = _Reader(handle, path)
        if handle.read(4) != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic); llama.cpp needs a .gguf model")
        version = reader.scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = reader.scalar("<Q"), reader.scalar("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise GGUFError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            meta[key] = reader.value(reader.scalar("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = reader.string()
            n_dims = reader.scalar("<I")
            if n_dims > 8:
                raise GGUFError(f"{path}: corrupt GGUF header (tensor {name!r} has {n_dims} dims)")
            shape = tuple(reader.scalar("<Q") for _ in range(n_dims))
            type_name, nbytes = _tensor_bytes(path, name, shape, reader.scalar("<I"))
            reader.scalar("<Q")  # data offset
            tensors.append(TensorInfo(name, shape, type_name, nbytes))
    return _model_info(path, meta, tuple(tensors))


def _model_info(path: Path, meta: dict[str, Any], tensors: tuple[TensorInfo, ...]) -> ModelInfo:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: GGUF header has no general.architecture")

    def field(key: str, default: Any = None) -> Any:
        """The architecture's header value ``<arch>.<key>``; without it and a default, unplannable."""
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise UnplannableModel(f"{path}: architecture {arch!r} is not supported by the planner "
                                   f"(its header has no {arch}.{key})")
        return value

    def number(key: str, value: Any) -> int:
        """``value`` of ``<arch>.<key>`` as an int; a list (one per layer) gives its largest entry."""
        try:
            return int(max(value) if isinstance(value, list) else value)
        except (TypeError, ValueError):
            raise GGUFError(f"{path}: GGUF key {arch}.{key} is {value!r}, not a number") from None

    def count(key: str, default: Any = None) -> int:
        return number(key, field(key, default))

    n_layer = count("block_count")
    n_embd = count("embedding_length")
    n_head = count("attention.head_count")
    kv_raw = field("attention.head_count_kv", field("attention.head_count"))
    if isinstance(kv_raw, list):
        n_head_kv = tuple(number("attention.head_count_kv", v) for v in kv_raw)
    else:
        n_head_kv = (number("attention.head_count_kv", kv_raw),) * n_layer
    if n_head <= 0:
        raise UnplannableModel(f"{path}: architecture {arch!r} has no attention heads (a recurrent model such as "
                               "Mamba?); the planner sizes attention KV caches only")
    if len(n_head_kv) != n_layer:
        raise GGUFError(f"{path}: head_count_kv has {len(n_head_kv)} entries for {n_layer} layers")
    key_length = count("attention.key_length", n_embd // n_head)
    value_length = count("attention.value_length", n_embd // n_head)
    n_ff = count("feed_forward_length", 0)
    vocab = meta.get("tokenizer.ggml.tokens")
    n_vocab = len(vocab) if isinstance(vocab, list | _Skipped) else count("vocab_size", 0)
    context = meta.get(f"{arch}.context_length")
    context_length = number("context_length", context) if context is not None else None
    file_type = meta.get("general.file_type")
    try:
        type_name = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except (TypeError, ValueError):
        type_name = f"type {file_type}"
    return ModelInfo(
        path=path, file_size=os.path.getsize(path), architecture=arch, name=meta.get("general.name"),
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, key_length=key_length,
        value_length=value_length, n_ff=n_ff, n_vocab=n_vocab,
        context_length=context_length, file_type=type_name, tensors=tensors,
    )
