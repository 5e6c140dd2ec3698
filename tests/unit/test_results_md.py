"""benchmarks/RESULTS.md holds the current figures a reader can find: one section per benchmark script,
each opening with its figures (a table within its first screen), then the command it came from."""

from __future__ import annotations

import re

from tests.conftest import REPO

RESULTS = (REPO / "benchmarks" / "RESULTS.md").read_text()
FIRST_SCREEN = 20
"""Lines of a section a reader sees without scrolling."""


def _sections() -> dict[str, list[str]]:
    sections, name = {}, None
    for line in RESULTS.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            sections[name] = []
        elif name is not None:
            sections[name].append(line)
    return sections


def _scripts() -> list[str]:
    """The benchmark scripts make bench-smoke runs (the Makefile's BENCH_SCRIPTS)."""
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^BENCH_SCRIPTS := (.*?)(?<!\\)$", makefile, re.M | re.S).group(1)
    return [s.rsplit(".", 1)[0] for s in listed.replace("\\", " ").split()]


def test_every_benchmark_has_a_section_that_opens_with_its_figures_and_names_its_command():
    sections = _sections()
    for script in _scripts():
        name = next((n for n in sections if script in n.replace(" ", "").split("/")), None)
        assert name is not None, f"RESULTS.md has no section for benchmarks/{script}"
        body = sections[name]
        first = [line for line in body[:FIRST_SCREEN] if line.startswith("|")]
        assert any(re.search(r"\d", line) for line in first), f"## {name}: no figure in its first screen"
        assert any(script in line for line in body), (
            f"## {name}: its command (benchmarks/{script}) is not named"
        )


def test_the_summary_table_links_every_section():
    summary = RESULTS.split("\n## ", 1)[0]
    for name in _sections():
        anchor = re.sub(r"[^\w\- ]", "", name.lower()).replace(" ", "-")
        assert f"(#{anchor})" in summary, f"the summary table does not link ## {name}"
