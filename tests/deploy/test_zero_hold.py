"""The chart sets the zero hold (docs/metrics.md, "How counting works") from the scrape interval, and gives a
stopping leader the time its hand-over needs."""

from __future__ import annotations

from typing import Any

import pytest

from .chart import RenderFn


def rendered(render: RenderFn, values: dict[str, Any]) -> tuple[dict[str, str], int]:
    out = render(values)
    grace = out.one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    return out.env(), int(grace)


@pytest.mark.parametrize(
    ("interval", "hold", "grace"),
    [
        (
            "30s",
            "60",
            3 * 60 + 5 + 10 + 10,
        ),  # the defaults: 2 x 30 s; wait 3 x hold + 5, renew deadline, 10 s
        ("15s", "30", 3 * 30 + 5 + 10 + 10),
        ("1m30s", "180", 3 * 180 + 5 + 10 + 10),
        ("10m", "600", 3 * 600 + 5 + 10 + 10),  # capped at the service's maximum
    ],
)
def test_the_zero_hold_is_twice_the_scrape_interval(
    render: RenderFn, interval: str, hold: str, grace: int
) -> None:
    env, got_grace = rendered(render, {"serviceMonitor": {"interval": interval}})
    assert env["TRAINER_METRICS_ZERO_HOLD_SECONDS"] == hold
    assert got_grace == grace


def test_a_zero_hold_set_in_config_wins_and_sizes_the_grace_period(render: RenderFn) -> None:
    env, grace = rendered(render, {"config": {"zero_hold_seconds": 8, "handover_wait_seconds": None}})
    assert env["TRAINER_METRICS_ZERO_HOLD_SECONDS"] == "8"
    assert grace == 3 * 8 + 5 + 10 + 10
    env, grace = rendered(render, {"config": {"zero_hold_seconds": 8, "handover_wait_seconds": 12}})
    assert grace == 12 + 10 + 10


def test_an_explicit_grace_period_is_kept(render: RenderFn) -> None:
    _, grace = rendered(render, {"terminationGracePeriodSeconds": 45})
    assert grace == 45
