"""The docs: the configuration reference is the fields' own, and every relative link leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

from laya.config import Settings, load_settings
from laya.errors import ConfigError
from laya.ops.docs import COMMAND, SHORT_NAMES, configuration_reference, environment_name

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_configuration_reference_is_current() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == configuration_reference(), (
        f"docs/configuration.md is not what laya/config.py says: run `{COMMAND}`")


def test_the_reference_lists_every_field_with_its_variable() -> None:
    page = configuration_reference()
    for row in ("| `max_seq_len` | int | `2048` |", "`LAYA_RUNTIME__MAX_SEQ_LEN`", "`LAYA_REDIS_URL`",
                "## `[metrics]`", '| one of "auto", "on", "off" |', "## `[[models]]`"):
        assert row in page, row
    for section, field, _ in _fields():
        assert f"| `{field}` |" in page.split(f"## `[{section}]`", 1)[1].split("\n## ", 1)[0], (section, field)


def _fields() -> list[tuple[str, str, Any]]:
    """(section, field, annotation) of every field of every table of the configuration."""
    found = []
    for section, info in Settings.model_fields.items():
        model = info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            found += [(section, field, sub.annotation) for field, sub in model.model_fields.items()]
    return found


def _refused_value(annotation: Any) -> str | None:
    """A value the field cannot take, in the environment's spelling; None where any text may be valid."""
    kinds = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) is not Literal else []
    kind = kinds[0] if len(kinds) == 1 else annotation
    if get_origin(kind) is Literal:
        return "no-such-choice"
    return {int: "not-a-number", float: "not-a-number", bool: "maybe"}.get(kind)


@pytest.mark.parametrize(("section", "field", "annotation"),
                         [f for f in _fields() if _refused_value(f[2]) is not None], ids=lambda v: str(v))
def test_each_variable_the_reference_names_is_the_one_read(section: str, field: str, annotation: Any) -> None:
    name = environment_name(section, field)
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={name: str(_refused_value(annotation))})
    assert f"environment variable {name}:" in str(refused.value)


def test_the_short_names_set_their_fields() -> None:
    values = {"LAYA_REDIS_URL": "redis://example:6379/0", "LAYA_MODEL_PATH": "/models/m.gguf",
              "LAYA_ROUTES": "/etc/laya/routes.toml"}
    assert set(values) == set(SHORT_NAMES.values())
    settings = load_settings(environ=values)
    assert (settings.redis.url, str(settings.model.path), str(settings.router.routes_file)) == tuple(values.values())


def test_every_relative_link_leads_to_a_file_and_anchor_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            if not found.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and found.suffix == ".md" and anchor not in _anchors(found.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    missing = [p.name for p in PAGES[1:] if p.name != "index.md" and f"({p.name})" not in index]
    assert not missing, missing


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}
