"""The newcomer's pages hold together: the tutorial path, one diagram on the concepts page, links
that resolve, notebooks that exist, and comparison figures that are really in benchmarks/README.md.

(The pages' code blocks run in tests/test_docs.py; docs/cli.md is checked by test_cli_reference.py.)
"""

from __future__ import annotations

import re

from conftest import REPO

DOCS = REPO / "docs"
PAGES = ["tutorial.md", "concepts.md", "cli.md", "migrating.md", "comparison.md", "notebooks.md"]
FIGURE = re.compile(r"(?<![\w.])~?\d[\d,.]*(?:[-–]\d[\d,.]*)?\s?(?:µs|us|ms|s|KB|MB|x)(?![\w])")


def normal(text: str) -> str:
    return text.replace("µs", "us").replace("–", "-").replace("~", "")


def test_the_tutorial_walks_the_path_in_order():
    text = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    steps = re.findall(r"^## (\d)\. (.+)$", text, re.M)
    assert [title.split()[0].lower() for _, title in steps] == ["install", "a", "in", "agents:", "forks:", "shared"]
    assert [n for n, _ in steps] == ["1", "2", "3", "4", "5", "6"]


def test_the_concepts_page_has_one_diagram_and_every_concept():
    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    assert text.count("```mermaid") == 1
    for concept in ("Run", "Attempt", "Journal", "Waypoint", "Effects", "Lease", "Checkpoint", "Fork", "Store", "Formats"):
        assert f"\n## {concept}\n" in text, concept
    assert "sqlite:///" in text and "postgresql://" in text and "s3://" in text and "https://" in text


def test_links_and_notebooks_named_on_the_pages_exist():
    for page in PAGES:
        text = (DOCS / page).read_text(encoding="utf-8")
        for target in re.findall(r"\]\((?!https?:)([^)#\s]+\.(?:md|ipynb))(?:#[^)]*)?\)", text):
            assert (DOCS / target).resolve().exists(), (page, target)
        for notebook in re.findall(r"notebooks/([\w-]+\.ipynb)", text):
            assert (REPO / "notebooks" / notebook).exists(), (page, notebook)


def test_comparison_quotes_only_figures_the_benchmarks_report():
    source = normal((REPO / "benchmarks" / "README.md").read_text(encoding="utf-8"))
    text = (DOCS / "comparison.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("|") or "measured" in line or "ms" in line]
    quoted = {normal(m.group(0)) for line in rows for m in FIGURE.finditer(line)}
    assert len(quoted) > 20
    missing = sorted(f for f in quoted if f not in source and f.replace(" ", "") not in source.replace(" ", ""))
    assert missing == [], f"figures in docs/comparison.md that benchmarks/README.md does not report: {missing}"
