"""The labelled sets under tests/data, found through tests/data/manifest.toml.

Tests and benchmarks read these files only through this module, so a set is used
under the name the manifest gives it, with what it says of the set: who wrote it,
and whether the code was changed after reading it (a set that was is no check
the code was not tuned on).

    load("intents/other-opposites.jsonl")       # its records
    labelled_sets("semantic_cache")             # every set of a folder, in the manifest's order
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = DATA / "manifest.toml"

__all__ = ["DATA", "MANIFEST", "Dataset", "dataset", "labelled_sets", "load", "manifest"]


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """One file of tests/data as the manifest describes it."""

    name: str
    """Its path under tests/data, ``semantic_cache/tuning-4.jsonl``."""
    holds: str
    written_by: str
    read_for_fixes: bool
    reading: str
    formerly: str
    made_by: str | None = None
    makes: str | None = None

    @property
    def path(self) -> Path:
        return DATA / self.name

    @property
    def purpose(self) -> str:
        """The folder: what the set is for (``semantic_cache``, ``intents``)."""
        return self.name.partition("/")[0]

    @property
    def is_set(self) -> bool:
        """Whether the file holds records (a generator does not)."""
        return self.makes is None

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]


@cache
def manifest() -> dict[str, Dataset]:
    """Every file the manifest lists, by name, in its order."""
    found = {}
    for entry in tomllib.loads(MANIFEST.read_text(encoding="utf-8"))["file"]:
        name = entry.pop("path")
        found[name] = Dataset(name=name, **entry)
    return found


def dataset(name: str) -> Dataset:
    """The file ``name`` (its path under tests/data); a file the manifest does not list is refused."""
    try:
        return manifest()[name]
    except KeyError:
        raise KeyError(f"{name} is not in {MANIFEST}: list it there (what it holds, who wrote it, "
                       "whether it was read for fixes)") from None


def load(name: str) -> list[dict[str, Any]]:
    """The records of the set ``name``, one JSON object a line."""
    return dataset(name).records()


def labelled_sets(purpose: str) -> list[Dataset]:
    """The sets of the folder ``purpose``, in the manifest's order."""
    found = [entry for entry in manifest().values() if entry.purpose == purpose and entry.is_set]
    if not found:
        raise KeyError(f"{MANIFEST} lists no set in {purpose}/")
    return found
