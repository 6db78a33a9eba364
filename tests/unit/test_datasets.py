"""tests/data/manifest.toml and the files under tests/data agree, and a set's name says whether it is held out."""

from __future__ import annotations

from pathlib import PurePosixPath

from tests.datasets import DATA, MANIFEST, manifest


def test_every_file_is_listed_and_every_listed_file_exists() -> None:
    on_disk = {path.relative_to(DATA).as_posix() for path in DATA.rglob("*")
               if path.is_file() and path != MANIFEST and "__pycache__" not in path.parts}
    listed = set(manifest())
    assert not on_disk - listed, f"files under tests/data that {MANIFEST.name} does not list"
    assert not listed - on_disk, f"files {MANIFEST.name} lists that are not under tests/data"


def test_only_a_set_nobody_read_for_fixes_is_called_held_out() -> None:
    for entry in manifest().values():
        if entry.is_set:
            assert PurePosixPath(entry.name).name.startswith("heldout") == (not entry.read_for_fixes), entry.name


def test_a_generated_set_and_its_generator_name_each_other() -> None:
    entries = manifest()
    for entry in entries.values():
        if entry.makes is not None:
            assert entries[entry.makes].made_by == entry.name
        if entry.made_by is not None:
            assert entries[entry.made_by].makes == entry.name


def test_each_set_is_listed_once_under_its_former_name() -> None:
    former = [entry.formerly for entry in manifest().values()]
    assert len(former) == len(set(former))
