"""The docs: the configuration reference is the fields' own, and every relative link leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from laya.ops.docs import configuration_reference

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_configuration_reference_is_current() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == configuration_reference(), (
        "docs/configuration.md is not what laya/config.py says: run `python -m laya.ops.docs > docs/configuration.md`")


def test_the_reference_lists_every_field_with_its_variable() -> None:
    page = configuration_reference()
    for row in ("| `max_seq_len` | int | `2048` |", "`LAYA_RUNTIME__MAX_SEQ_LEN`", "`LAYA_REDIS_URL`",
                "## `[metrics]`"):
        assert row in page, row


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
