"""The README and docs/ as a newcomer and an operator read them: the two commands first, the install section
within the README's first 120 lines, every relative link pointing at a file that exists and, where it has an
anchor, at a heading of that file (GitHub's anchors), and every PromQL example valid."""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest

from tests.support.markdown import anchors, headings, is_external, links, promql_examples, slug

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Every Markdown file a reader follows links through: the README, docs/ (design notes included), the chart's
# README and the kustomize manifests' README.
DOCUMENTS = sorted(
    {
        README,
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "helm" / "trainer-metrics" / "README.md",
        ROOT / "manifests" / "README.md",
    }
)
# The references the README's sections link to for their full text.
REFERENCES = ["configuration.md", "metrics.md", "operations.md", "security.md", "deploy.md", "leadership.md"]


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_install_section_is_within_the_readme_s_first_120_lines() -> None:
    found = {title: number for number, level, title in headings(README.read_text()) if level == 2}
    assert "Install on a cluster" in found, sorted(found)
    assert found["Install on a cluster"] <= 120, found
    assert found["Quick start"] < found["Install on a cluster"], found


def test_quick_start_has_the_two_commands() -> None:
    quick = section(README.read_text(), "Quick start")
    first = "python3 -m venv .venv && .venv/bin/pip install . ./sim && .venv/bin/trainer-metrics --simulate"
    assert first in quick
    assert "\nbash .ci/run\n" in quick
    assert quick.index(first) < quick.index("bash .ci/run")


def test_readme_links_every_reference() -> None:
    text = README.read_text()
    targets = {link.target.partition("#")[0] for link in links(text)}
    assert {f"docs/{name}" for name in REFERENCES} <= targets, sorted(targets)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings_that_exist(doc: Path) -> None:
    broken = []
    for link in links(doc.read_text()):
        if is_external(link.target):
            continue
        path, _, anchor = link.target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        where = f"{doc.relative_to(ROOT)}:{link.line}: {link.target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{where}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{where}: no such heading in {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{where}: an anchor into a file that is not Markdown")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Per-TrainJob series (opt-in)", "per-trainjob-series-opt-in"),
        (
            "Coexisting with the upstream Trainer controller's metrics",
            "coexisting-with-the-upstream-trainer-controllers-metrics",
        ),
        ("1. The image", "1-the-image"),
        (
            "Hostile clients: what is bounded, and by how much",
            "hostile-clients-what-is-bounded-and-by-how-much",
        ),
        ("`app/config.py`: `Settings` (`TRAINER_METRICS_`)", "appconfigpy-settings-trainer_metrics_"),
        (
            "What PromQL sees (born at zero, hand over what was served)",
            "what-promql-sees-born-at-zero-hand-over-what-was-served",
        ),
        ("Exemplars and the protobuf exposition (#25)", "exemplars-and-the-protobuf-exposition-25"),
        ("A **bold** [link](x.md) — and more", "a-bold-link--and-more"),
    ],
)
def test_anchors_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    text = "# A\n\n## Limits\n\n```\n# not a heading\n```\n\n## Limits\n"
    assert anchors(text) == {"a", "limits", "limits-1"}


def test_links_in_code_are_not_links() -> None:
    text = "[a](a.md) `[b](b.md)`\n\n```\n[c](c.md)\n```\n[d](d.md#x) [two\nlines](e.md)\n"
    assert [(link.line, link.target) for link in links(text)] == [(1, "a.md"), (6, "d.md#x"), (6, "e.md")]


@pytest.mark.parametrize("doc", [README, ROOT / "docs/metrics.md"], ids=lambda p: p.name)
def test_promql_examples_parse(doc: Path) -> None:
    """Valid PromQL, checked without a Prometheus; tests/e2e/test_prometheus_e2e.py runs them against one."""
    exprs = promql_examples(doc.read_text())
    assert exprs
    for expr in exprs:
        promql_parser.parse(expr)
