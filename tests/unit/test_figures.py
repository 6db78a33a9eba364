"""The docs quote only figures that a committed results file holds.

docs/performance.md is checked whole: each figure of a table row or paragraph
must be in the results files it links, else in those its section links, else in
some results file. On README.md and the other docs/ pages, only what cites a
benchmark is checked: a row or paragraph that links a results file (its figures
must be there) or names a `bench/` program (they must be in some results file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PERFORMANCE = ROOT / "docs" / "performance.md"
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "configuration.md")]
# A figure, not the digits of a name (H200, p50, AVX-512, UTF-8, 7B) nor a version (0.3.36).
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z0-9]-)\d+(?:,\d{3})*(?:\.\d+)?(?![\w.]*[A-Za-z]|\.\d)")
RESULTS_LINK = re.compile(r"bench/results/([\w.-]+\.md)")
BENCH_PROGRAM = re.compile(r"\bbench/\w+\.py\b")

PAST_STATE = {"semantic_cache_heldout4_before.md", "semantic_routing_before_kernel.md"}
"""Results of code that no longer exists (the verifier and the vector index before a change); not quoted."""


@dataclass(frozen=True)
class Unit:
    """A table row, a list item or a paragraph, with the results files it and its section link."""

    text: str
    links: frozenset[str]
    section_links: frozenset[str]


def numbers(text: str) -> set[str]:
    """Every figure in ``text``, thousands separators dropped ("54,303" and "54303" are one figure)."""
    text = re.sub(r"(\d)x\b", r"\1×", text)  # "1.26x" is a ratio, as "1.26×" is
    return {match.replace(",", "") for match in NUMBER.findall(text)}


def units(page: str) -> list[Unit]:
    """The page's table rows, list items and paragraphs, code blocks left out."""
    sections: list[list[str]] = [[]]
    in_code = False
    for line in page.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            sections[-1].append("")
        elif line.startswith("#") and not in_code:
            sections.append([])
        elif not in_code:
            sections[-1].append(line)
    found = []
    for lines in sections:
        section_links = frozenset(RESULTS_LINK.findall("\n".join(lines)))
        chunks: list[list[str]] = []
        for line in lines:
            starts = line.startswith("|") or re.match(r"\s*(?:[-*]|\d+\.) ", line) is not None
            if not line.strip():
                chunks.append([])
            elif starts or not chunks or chunks[-1][:1] and chunks[-1][0].startswith("|"):
                chunks.append([line])
            else:
                chunks[-1].append(line)
        for chunk in filter(None, chunks):
            text = " ".join(chunk)
            if re.fullmatch(r"\|[-:| ]+\|", text.strip()):
                continue
            found.append(Unit(text, frozenset(RESULTS_LINK.findall(text)), section_links))
    return found


def unbacked(page: str, results: dict[str, str], *, whole: bool) -> list[str]:
    """Each figure of ``page`` that the results files backing it do not hold (``whole``: check every unit)."""
    everywhere = numbers("\n".join(results.values()))
    problems = []
    for unit in units(page):
        files = unit.links or (unit.section_links if whole else frozenset())
        if not files and not whole and not BENCH_PROGRAM.search(unit.text):
            continue
        backing = numbers("\n".join(results.get(name, "") for name in files)) if files else everywhere
        text = re.sub(r"`[^`]*`", "", re.sub(r"\]\([^)]*\)", "]", unit.text))  # commands and link targets
        where = ", ".join(sorted(files)) or "any results file"
        problems += [f"{figure} ({where}): {unit.text.strip()[:90]}" for figure in sorted(numbers(text) - backing)]
    return problems


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    return {path.name: path.read_text() for path in RESULTS.glob("*.md")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_quoted_from_a_benchmark_is_in_its_results_file(page: Path, results: dict[str, str]) -> None:
    problems = unbacked(page.read_text(), results, whole=page == PERFORMANCE)
    assert not problems, f"{page.relative_to(ROOT)} quotes figures no results file holds:\n" + "\n".join(problems)


def test_every_link_to_a_results_file_leads_to_one(results: dict[str, str]) -> None:
    missing = [f"{page.name}: {name}" for page in PAGES for name in RESULTS_LINK.findall(page.read_text())
               if name not in results]
    assert not missing, missing


def test_the_performance_page_covers_every_results_file(results: dict[str, str]) -> None:
    linked = set(RESULTS_LINK.findall(PERFORMANCE.read_text()))
    assert set(results) - PAST_STATE <= linked, sorted(set(results) - PAST_STATE - linked)
    assert not linked & PAST_STATE, sorted(linked & PAST_STATE)


def test_a_figure_no_results_file_holds_is_caught(results: dict[str, str]) -> None:
    row = "| routing decision p50 ([routing.md](../bench/results/routing.md)) | 123456.78 / 6.28 µs | met |"
    [problem] = unbacked(row, results, whole=False)
    assert problem.startswith("123456.78 (routing.md): | routing decision")
    assert unbacked("## A section\n\na prose figure of 98765.4321 ms", results, whole=True) == [
        "98765.4321 (any results file): a prose figure of 98765.4321 ms"]
    assert unbacked("a figure of 98765.4321 ms that cites no benchmark", results, whole=False) == []
    assert unbacked("`python bench/soak.py` lost 98765.4321 requests", results, whole=False) == [
        "98765.4321 (any results file): `python bench/soak.py` lost 98765.4321 requests"]
    assert unbacked("on the H200 machine, p50 and p99", results, whole=True) == []
