"""The README stays an overview a newcomer can read, and the documentation holds together: the trigger-form
table is the one the field declarations generate, and every link and test the pages name exists."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 400


def _name(page: Path) -> str:
    """``page`` as the tests name it: its path in the repository."""
    return str(page.relative_to(REPO))


def test_readme_trigger_form_table_is_generated_from_the_field_declarations(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "update_readme.py"), "--check"],
        capture_output=True, text=True, env={"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_is_at_most_400_lines():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move depth to a page under docs/"


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks, where a ``](...)`` is code, not a link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> Iterator[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M):
        slug = _anchor(heading)
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def _links(page: Path) -> list[str]:
    """The relative link targets of ``page``'s prose."""
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())) if "://" not in t]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in set(_anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {_name(resolved)}")
    assert not broken, f"{_name(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_test_file_a_page_names_exists(page):
    named = set(re.findall(r"`(tests/[\w/]+\.py)", page.read_text()))
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"{_name(page)} names tests that do not exist: {missing}"


def test_the_anchor_rule_is_githubs():
    assert _anchor("Who sets what: trigger, DAG author, platform admin") == (
        "who-sets-what-trigger-dag-author-platform-admin"
    )
    assert _anchor("Running on Kubernetes (EKS)") == "running-on-kubernetes-eks"
    assert _anchor("How long `make test` takes") == "how-long-make-test-takes"
    assert _anchor("Deploying train_llama") == "deploying-train_llama"
