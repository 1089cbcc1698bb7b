"""The chart's README.md lists every value of values.yaml with its `# --` comment: helm/values_readme.py
writes that table, and this test fails when README.md and values.yaml disagree or a value has no comment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .chart import CHART_DIR, helm_script

gen = helm_script("values_readme")


def test_readme_table_is_what_values_yaml_says() -> None:
    current = (CHART_DIR / "README.md").read_text()
    assert gen.render(current) == current, (
        "helm/trainer-metrics/README.md is out of date: python3 helm/values_readme.py"
    )
    assert gen.main(["--check"]) == 0


def _leaf_paths(values: dict[str, object], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out |= _leaf_paths(value, f"{prefix}{key}.")  # type: ignore[arg-type]
        else:
            out.add(f"{prefix}{key}")
    return out


def test_every_value_is_in_the_readme() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    readme = (CHART_DIR / "README.md").read_text()
    documented = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")}
    for path in _leaf_paths(values):
        # A leaf is in the table, or one of its parents is (documented as a whole, e.g. `resources`).
        parts = path.split(".")
        assert any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1)), path
    # The values this work added are among them, each with its own row.
    for new in (
        "serviceMonitor.authorization",
        "serviceMonitor.bearerTokenSecret",
        "serviceMonitor.jobLabel",
        "serviceMonitor.sampleLimit",
        "serviceMonitor.scrapeToken.create",
        "podMonitor.enabled",
        "extraVolumes",
        "extraVolumeMounts",
        "envFrom",
        "extraContainers",
        "tls.certManager.enabled",
        "auth.debugReaderSubjects",
        "prometheusRule.selector",
        "prometheusRule.extraAggregationLabels",
        "prometheusRule.runbookBaseURL",
        "namespaceOverride",
        "global.imageRegistry",
        "global.imagePullSecrets",
        "image.registry",
        "rbac.useClusterRole",
        "watchClusterRuntimes",
        "revisionHistoryLimit",
        "serviceMonitor.targetLabels",
        "serviceMonitor.podTargetLabels",
        "testFramework.enabled",
    ):
        assert new in documented, new


def test_a_value_without_a_comment_fails(tmp_path: Path) -> None:
    text = "# -- Documented.\na: 1\nb:\n  # -- Documented too.\n  c: true\n  d: x\n"
    with pytest.raises(gen.UndocumentedValue, match=r"b\.d"):
        gen.rows(yaml.safe_load(text), gen.descriptions(text.splitlines()))


def test_comment_conventions() -> None:
    text = (
        "# A file comment, not a description.\n"
        "\n"
        "# -- Subjects, e.g.\n"
        "#   - {kind: Group, name: a|b}\n"
        "# then <fullname> prose.\n"
        "subjects: []\n"
        "# -- A map documented as a whole.\n"
        "resources:\n"
        "  limits:\n"
        "    memory: 1Gi\n"
        "svc:\n"
        "  # -- Port.\n"
        "  port: 80\n"
    )
    docs = gen.descriptions(text.splitlines())
    assert (
        docs["subjects"] == "Subjects, e.g.<br>`- {kind: Group, name: a\\|b}`<br>then &lt;fullname&gt; prose."
    )
    rows = {r.key: r for r in gen.rows(yaml.safe_load(text), docs)}
    assert set(rows) == {"subjects", "resources", "svc.port"}
    assert rows["resources"].default == '`{"limits": {"memory": "1Gi"}}`'
    assert (rows["svc.port"].kind, rows["svc.port"].default) == ("int", "`80`")
