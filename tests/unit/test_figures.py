"""docs/performance.md quotes only figures that a committed results file holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")  # not the digits of a name such as H200 or p50

# Which results file backs each row of the Performance table, by the words its first cell starts with.
ROW_FILES = {
    "routing decision": "routing.md",
    "`Client.ask`": "router_latency.md",
    "(raw round trip": "router_latency.md",
    "throughput": "router_throughput.md",
    "(RQ `enqueue_many`": "router_throughput.md",
}


def numbers(text: str) -> set[str]:
    """Every figure in ``text``, thousands separators dropped ("54,303" and "54303" are one figure)."""
    return {match.replace(",", "") for match in NUMBER.findall(text)}


PAGE = ROOT / "docs" / "performance.md"


def performance_section(page: str) -> str:
    """The page without its title line."""
    return page.split("\n", 1)[1]


def unbacked(section: str, results: dict[str, str]) -> list[str]:
    """Each figure of ``section`` that its results file (a table row's) or no results file (prose) holds."""
    everywhere = numbers("\n".join(results.values()))
    problems = []
    in_code = False
    for line in section.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or not line.strip() or re.fullmatch(r"\|[-:| ]+\|", line.strip()):
            continue
        text = re.sub(r"\([^)]*\.md\)", "", line)  # link targets are not figures
        cells = [cell.strip() for cell in text.strip().strip("|").split("|")] if text.startswith("|") else []
        files = [name for start, name in ROW_FILES.items() if cells and cells[0].startswith(start)]
        backing = numbers(results[files[0]]) if files else everywhere
        problems += [f"{figure} ({files[0] if files else 'any results file'}): {line.strip()[:80]}"
                     for figure in sorted(numbers(text) - backing)]
    return problems


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    return {path.name: path.read_text() for path in RESULTS.glob("*.md")}


def test_every_figure_in_the_performance_section_is_in_a_results_file(results: dict[str, str]) -> None:
    problems = unbacked(performance_section(PAGE.read_text()), results)
    assert not problems, "figures no results file holds:\n" + "\n".join(problems)


def test_the_table_s_rows_each_have_their_results_file(results: dict[str, str]) -> None:
    section = performance_section(PAGE.read_text())
    table = [line for line in section.splitlines() if line.startswith("| ") and "run 1" not in line]
    first_table = table[:next((i for i, line in enumerate(table) if line.startswith("| what")), len(table))]
    assert first_table, "the Performance table is gone"
    for line in first_table:
        first = line.strip("| ").split("|")[0].strip()
        if first == "target":
            continue
        assert any(first.startswith(start) for start in ROW_FILES), f"no results file named for row {first!r}"
    assert set(ROW_FILES.values()) <= set(results)


def test_a_figure_no_results_file_holds_is_caught(results: dict[str, str]) -> None:
    row = "| routing decision p50 ≤ 10 µs, p99 ≤ 50 µs | 123456.78 / 6.5 µs: met |"
    [problem] = [p for p in unbacked(row, results) if p.startswith("123456.78")]
    assert problem.startswith("123456.78 (routing.md): | routing decision")
    assert unbacked("a prose figure of 98765.4321 ms", results) == [
        "98765.4321 (any results file): a prose figure of 98765.4321 ms"]
    assert unbacked("on the H200 machine, p50 and p99", results) == []
