"""Fixtures of the deployment tests: the chart loaded once by the real Helm engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest

from .chart import CHART_DIR, NAMESPACE, RELEASE, Rendered, RenderFn


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm.Chart) -> RenderFn:
    def _render(
        values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE
    ) -> Rendered:
        return Rendered(chart.render(values or {}, name=name, namespace=namespace, is_install=True))

    return _render
