"""Settings: defaults, environment parsing, and one clear message per bad setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main as cli_main
from app.config import ENV_PREFIX, SIM_ENV_PREFIX, Settings, SettingsError, load_settings, unknown_env_vars
from app.trainer.rules import DEFAULT_ACCELERATOR_PATTERNS
from kubesim.trainer.settings import SimSettings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"  # the full table; the README has the common settings


def test_defaults_follow_client_go_lease_timings() -> None:
    s = load_settings()
    assert (s.lease_duration_seconds, s.renew_deadline_seconds, s.retry_period_seconds) == (15.0, 10.0, 2.0)
    assert s.namespaces == []
    assert s.port == 8080


def test_namespaces_from_comma_separated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}NAMESPACES", " team-a, team-b ")
    assert load_settings().namespaces == ["team-a", "team-b"]
    monkeypatch.setenv(f"{ENV_PREFIX}NAMESPACES", " ")
    assert load_settings().namespaces == []  # only an empty value means all namespaces


def test_identity_and_lease_namespace_from_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "trainer-metrics-7f9c")
    monkeypatch.setenv("POD_NAMESPACE", "monitoring")
    s = load_settings()
    assert (s.identity, s.lease_namespace) == ("trainer-metrics-7f9c", "monitoring")


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("PORT", "abc", "invalid setting port (TRAINER_METRICS_PORT)"),
        ("PORT", "70000", "invalid setting port (TRAINER_METRICS_PORT)"),
        ("LOG_FORMAT", "xml", "invalid setting log_format (TRAINER_METRICS_LOG_FORMAT)"),
        ("LEASE_DURATION_SECONDS", "5", "lease_duration_seconds must be greater than renew_deadline_seconds"),
        ("RETRY_PERIOD_SECONDS", "9", "renew_deadline_seconds must be greater than 1.2"),
        ("TLS_CERT_FILE", "/tmp/cert.pem", "tls_cert_file and tls_key_file must be set together"),
        ("NO_SUCH_SETTING", "1", None),
    ],
)
def test_bad_setting_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str | None
) -> None:
    monkeypatch.setenv(ENV_PREFIX + env, value)
    if needle is None:
        # Unknown TRAINER_METRICS_* variables are not fatal: Kubernetes service links inject variables such
        # as TRAINER_METRICS_SERVICE_HOST for a Service of that name. They are reported by unknown_env_vars().
        load_settings()
        assert unknown_env_vars() == [ENV_PREFIX + env]
        return
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_cli_prints_one_line_and_exits_2_on_bad_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}PORT", "-1")
    assert cli_main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("trainer-metrics: invalid setting port (TRAINER_METRICS_PORT)")


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--simulate", "--sim-rate", "-1"], {}, "invalid setting sim_rate (TRAINER_METRICS_SIM_RATE)"),
        (["--simulate"], {"SIM_JOBS": "many"}, "invalid setting sim_jobs (TRAINER_METRICS_SIM_JOBS)"),
        (["--simulate"], {"SIM_RATE": "inf"}, "invalid setting sim_rate (TRAINER_METRICS_SIM_RATE)"),
    ],
)
def test_simulate_mode_settings_are_checked_apart_from_the_service(
    argv: list[str],
    env: dict[str, str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(ENV_PREFIX + name, value)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("trainer-metrics: " + needle)
    # The service's own settings do not know them, and do not call them unknown either.
    assert "sim_rate" not in Settings.model_fields
    monkeypatch.setenv(SIM_ENV_PREFIX + "RATE", "2")
    assert not [n for n in unknown_env_vars() if n.startswith(SIM_ENV_PREFIX)]


def all_settings() -> set[str]:
    expected = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    return expected | {SIM_ENV_PREFIX + name.upper() for name in SimSettings.model_fields}


def test_configuration_table_lists_every_setting() -> None:
    """docs/configuration.md's table has one row per setting, and no row for a setting that does not exist."""
    rows = re.findall(r"^\| `(TRAINER_METRICS_[A-Z_]+)` \|", CONFIGURATION.read_text(), flags=re.M)
    documented = set(rows)
    assert len(rows) == len(documented), f"a setting has two rows: {sorted(rows)}"
    expected = all_settings()
    assert expected <= documented, f"missing from docs/configuration.md: {sorted(expected - documented)}"
    assert documented - expected == set(), (
        f"docs/configuration.md documents unknown settings: {sorted(documented - expected)}"
    )


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_every_setting_the_documentation_names_exists(doc: str) -> None:
    """The README's table of common settings, and any setting named in the README or docs/, is a real one."""
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    named = set(re.findall(r"\b(TRAINER_METRICS_[A-Z_]*[A-Z])\b", path.read_text()))
    assert named - all_settings() == set(), f"{doc} names unknown settings: {sorted(named - all_settings())}"


def test_readme_has_the_common_settings_and_links_the_full_table() -> None:
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(TRAINER_METRICS_[A-Z_]+)`", section, flags=re.M)
    assert 8 <= len(rows) <= 14, rows
    assert "(docs/configuration.md)" in section


def test_configuration_table_states_the_default_accelerator_patterns() -> None:
    """docs/configuration.md's row of ACCELERATOR_RESOURCE_PATTERNS spells the default list (issue 22: device
    resources only), so the documentation cannot drift from rules.DEFAULT_ACCELERATOR_PATTERNS."""
    row = next(
        line
        for line in CONFIGURATION.read_text().splitlines()
        if line.startswith("| `TRAINER_METRICS_ACCELERATOR_RESOURCE_")
    )
    assert f"`{','.join(DEFAULT_ACCELERATOR_PATTERNS)}`" in row
    assert load_settings().accelerator_resource_patterns == list(DEFAULT_ACCELERATOR_PATTERNS)
