"""The per-TrainJob series settings: off by default, on in simulate mode, and every bad value stops
start-up in one line naming the setting."""

from __future__ import annotations

import pytest

from app.config import ENV_PREFIX, SettingsError, load_settings


def test_off_by_default_on_in_simulate_mode_unless_set() -> None:
    assert load_settings().per_trainjob_series is False
    assert load_settings(simulate=True).per_trainjob_series is True
    assert load_settings(simulate=True, per_trainjob_series=False).per_trainjob_series is False
    assert load_settings(per_trainjob_series=True).per_trainjob_series is True


def test_namespaces_from_the_environment_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PREFIX + "PER_TRAINJOB_NAMESPACES", " team-a, team-b ")
    assert load_settings().per_trainjob_namespaces == ["team-a", "team-b"]
    monkeypatch.setenv(ENV_PREFIX + "PER_TRAINJOB_NAMESPACES", '["team-c"]')  # as the chart renders a list
    assert load_settings().per_trainjob_namespaces == ["team-c"]
    monkeypatch.setenv(ENV_PREFIX + "PER_TRAINJOB_NAMESPACES", "")
    assert load_settings().per_trainjob_namespaces == []


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("PER_TRAINJOB_SERIES", "maybe", "invalid setting per_trainjob_series"),
        ("PER_TRAINJOB_NAMESPACES", "Team_A", "invalid setting per_trainjob_namespaces"),
        ("PER_TRAINJOB_NAMESPACES", "a,,b", "empty namespace"),
        ("PER_TRAINJOB_NAMESPACES", "a,a", "listed twice"),
        ("PER_TRAINJOB_MAX_JOBS", "-1", "invalid setting per_trainjob_max_jobs"),
        ("PER_TRAINJOB_MAX_JOBS", "2000000", "invalid setting per_trainjob_max_jobs"),
        ("PER_TRAINJOB_MAX_TRAINER_METRICS", "257", "invalid setting per_trainjob_max_trainer_metrics"),
    ],
)
def test_bad_values_are_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(ENV_PREFIX + env, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_an_allow_listed_namespace_must_be_watched() -> None:
    with pytest.raises(SettingsError, match="per_trainjob_namespaces names namespaces that are not watched"):
        load_settings(namespaces=["team-a"], per_trainjob_namespaces=["team-b"])
    assert load_settings(namespaces=["team-a", "team-b"], per_trainjob_namespaces=["team-b"])
