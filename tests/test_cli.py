"""The command line: every setting is a flag with help text (its variable, bounds and default), a flag wins
over its variable and is checked as the variable is, and --version prints the version with the git revision,
read from the checkout or from the file the wheel build writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from app import __version__, version
from app.cli import _parser, main, parse_flags
from app.config import ENV_PREFIX, Settings, load_settings
from kubesim.trainer.settings import SimSettings

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")

# A valid value, not the default, for every setting, as typed on a command line.
FLAG_SAMPLE: dict[str, list[str]] = {
    "kubeconfig": ["--kubeconfig", "/etc/kube/config"],
    "kube_context": ["--kube-context", "prod"],
    "namespaces": ["--namespaces", "team-a,team-b"],
    "watch_cluster_runtimes": ["--no-watch-cluster-runtimes"],
    "leader_election": ["--no-leader-election"],
    "lease_name": ["--lease-name", "tm-lock"],
    "lease_namespace": ["--lease-namespace", "monitoring"],
    "identity": ["--identity", "pod-0"],
    "lease_duration_seconds": ["--lease-duration-seconds", "20"],
    "renew_deadline_seconds": ["--renew-deadline-seconds", "12.5"],
    "retry_period_seconds": ["--retry-period-seconds", "3"],
    "host": ["--host", "::"],
    "port": ["--port", "9443"],
    "probe_port": ["--probe-port", "off"],
    "max_connections": ["--max-connections", "100"],
    "max_connections_per_client": ["--max-connections-per-client", "10"],
    "http_header_timeout_seconds": ["--http-header-timeout-seconds", "7.5"],
    "http_keep_alive_timeout_seconds": ["--http-keep-alive-timeout-seconds", "3"],
    "debug_endpoints": ["--no-debug-endpoints"],
    "auth_enabled": ["--auth-enabled"],
    "auth_cache_seconds": ["--auth-cache-seconds", "12.5"],
    "auth_outage_grace_seconds": ["--auth-outage-grace-seconds", "90"],
    "auth_reviews_per_second": ["--auth-reviews-per-second", "7.5"],
    "auth_reviews_per_client_per_second": ["--auth-reviews-per-client-per-second", "2.5"],
    "tls_cert_file": ["--tls-cert-file", "/etc/tls/tls.crt"],
    "tls_key_file": ["--tls-key-file", "/etc/tls/tls.key"],
    "log_level": ["--log-level", "DEBUG"],
    "log_format": ["--log-format", "json"],
    "watch_timeout_min_seconds": ["--watch-timeout-min-seconds", "120"],
    "watch_timeout_max_seconds": ["--watch-timeout-max-seconds", "240"],
    "watch_inactivity_timeout_seconds": ["--watch-inactivity-timeout-seconds", "45.5"],
    "list_page_size": ["--list-page-size", "250"],
    "streaming_list": ["--streaming-list", "auto"],
    "initial_events_timeout_seconds": ["--initial-events-timeout-seconds", "45.5"],
    "max_unknown_runtime_refs": ["--max-unknown-runtime-refs", "7"],
    "accelerator_resource_patterns": ["--accelerator-resource-patterns", "nvidia.com/gpu,example.com/npu-*"],
    "max_accelerator_classes": ["--max-accelerator-classes", "9"],
    "max_failure_reasons": ["--max-failure-reasons", "11"],
    "max_object_bytes": ["--max-object-bytes", "8388608"],
    "terminal_page_max": ["--terminal-page-max", "77"],
    "handover_journal_size": ["--handover-journal-size", "123456"],
    "heap_trim_interval_seconds": ["--heap-trim-interval-seconds", "120"],
    "zero_hold_seconds": ["--zero-hold-seconds", "30"],
    "exemplars": ["--no-exemplars"],
    "handover_wait_seconds": ["--handover-wait-seconds", "12.5"],
    "per_trainjob_series": ["--per-trainjob-series"],
    "per_trainjob_namespaces": ["--per-trainjob-namespaces", "team-a"],
    "per_trainjob_max_jobs": ["--per-trainjob-max-jobs", "250"],
    "per_trainjob_max_trainer_metrics": ["--per-trainjob-max-trainer-metrics", "4"],
    "pod_series": ["--no-pod-series"],
    "pod_series_max_pods": ["--pod-series-max-pods", "250"],
    "simulate": ["--simulate"],
}
EXPECTED: dict[str, Any] = {
    "namespaces": ["team-a", "team-b"],
    "probe_port": None,
    "accelerator_resource_patterns": ["nvidia.com/gpu", "example.com/npu-*"],
    "per_trainjob_namespaces": ["team-a"],
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def _actions() -> dict[str, Any]:
    return {a.dest: a for a in _parser()._actions}


def test_every_setting_is_a_flag_with_help() -> None:
    assert set(FLAG_SAMPLE) == set(Settings.model_fields), "a setting without a flag sample here"
    actions = _actions()
    for name, field in Settings.model_fields.items():
        action = actions[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.help and f"[{ENV_PREFIX}{name.upper()}" in action.help, name
        assert (field.description or "").strip()[:30] in action.help, name
        if field.annotation in (bool, bool | None):
            assert "--no-" + name.replace("_", "-") in action.option_strings, name
    # The workload flags of --simulate, with the bounds of their settings.
    for name, field in SimSettings.model_fields.items():
        help_text = actions["sim_" + name].help
        assert f"{ENV_PREFIX}SIM_{name.upper()}" in help_text
        bounds = {type(m).__name__: m for m in field.metadata}
        if "Ge" in bounds and "Le" in bounds:
            assert f"{bounds['Ge'].ge:.0f} to {bounds['Le'].le:.0f}" in help_text, help_text


def test_log_flags_have_help_text() -> None:
    actions = _actions()
    level, fmt = actions["log_level"], actions["log_format"]
    assert level.metavar == "{DEBUG,INFO,WARNING,ERROR}" and "default INFO" in level.help
    assert fmt.metavar == "{text,json}" and "log collectors" in fmt.help and "default text" in fmt.help


def test_help_shows_bounds_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--lease-duration-seconds SECONDS How long a Lease is valid." in text
    assert "[TRAINER_METRICS_LEASE_DURATION_SECONDS; 1 to 3600; default 15]" in text
    assert "--probe-port N|off" in text and "--no-leader-election" in text
    for section in ("Kubernetes access:", "leader election:", "logging:", "simulated cluster:"):
        assert section in text


def test_every_flag_reaches_its_setting() -> None:
    argv = [arg for args in FLAG_SAMPLE.values() for arg in args]
    overrides, sim = parse_flags(argv)
    assert sim == {}
    settings = load_settings(**overrides)
    for name, args in FLAG_SAMPLE.items():
        got = getattr(settings, name)
        if name in EXPECTED:
            assert got == EXPECTED[name], name
        elif len(args) == 1:
            assert got is (not args[0].startswith("--no-")), name
        else:
            assert str(got) == args[1] or got == type(got)(args[1]), (name, got)


def test_a_flag_wins_over_its_variable_and_unset_flags_leave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PREFIX + "PORT", "9000")
    monkeypatch.setenv(ENV_PREFIX + "LOG_LEVEL", "WARNING")
    monkeypatch.setenv(ENV_PREFIX + "LEADER_ELECTION", "false")
    overrides, _ = parse_flags(["--port", "9001", "--leader-election"])
    settings = load_settings(**overrides)
    assert (settings.port, settings.log_level, settings.leader_election) == (9001, "WARNING", True)
    overrides, sim = parse_flags(["--sim-rate", "2.5", "--sim-seed", "7"])
    assert overrides == {} and sim == {"rate": "2.5", "seed": "7"}
    assert (SimSettings(**sim).rate, SimSettings(**sim).seed) == (2.5, 7)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--port", "abc"], "invalid setting port (TRAINER_METRICS_PORT)"),
        (["--log-level", "LOUD"], "invalid setting log_level (TRAINER_METRICS_LOG_LEVEL)"),
        (["--namespaces", "a,,b"], "invalid setting namespaces (TRAINER_METRICS_NAMESPACES)"),
        (["--zero-hold-seconds", "nan"], "invalid setting zero_hold_seconds"),
    ],
)
def test_a_bad_flag_value_is_one_line_naming_the_setting(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("trainer-metrics: ") and needle in line


# --- --version and the revision ------------------------------------------------------------------------


REVISION = re.compile(r"[0-9a-f]{40}(-dirty)?")


def test_version_prints_the_version_and_the_revision(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    line = capsys.readouterr().out.strip()
    match = re.fullmatch(rf"trainer-metrics {re.escape(__version__)} \(revision (.+)\)", line)
    assert match, line
    if GIT and (ROOT / ".git").exists():  # running from the checkout: git's answer
        assert REVISION.fullmatch(match[1]), line
        assert (
            match[1].split("-")[0]
            == subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True).strip()
        )


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_git_revision_of_a_work_tree(tmp_path: Path) -> None:
    assert version.git_revision(tmp_path) is None  # not a work tree
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"

    def git(*args: str) -> str:
        return subprocess.check_output(["git", "-C", str(tmp_path), *args], text=True, env=env).strip()

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert version.git_revision(tmp_path) == head
    (tmp_path / "f").write_text("2")
    assert version.git_revision(tmp_path) == head + "-dirty"
    (tmp_path / "untracked").write_text("x")
    git("checkout", "-q", "f")
    assert version.git_revision(tmp_path) == head  # untracked files do not make it dirty


def test_revision_from_the_file_the_build_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site-packages" / "app"  # an installed package: no .git beside it
    package.mkdir(parents=True)
    monkeypatch.setattr(version, "PACKAGE", package)
    monkeypatch.setattr(version, "REVISION_FILE", package / "REVISION")
    version.revision.cache_clear()
    try:
        assert version.revision() == "unknown"
        version.revision.cache_clear()
        (package / "REVISION").write_text("0123abcd\n")
        assert version.revision() == "0123abcd"
        assert version.version_line() == f"trainer-metrics {__version__} (revision 0123abcd)"
    finally:
        version.revision.cache_clear()


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_wheel_built_from_a_checkout_carries_its_revision(tmp_path: Path) -> None:
    """The build hook (app/_build.py): the wheel holds app/REVISION, which an install without .git reads;
    BUILD_REVISION wins (a build from a copy of the sources, without .git)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "REVISION")
    )
    env = {k: v for k, v in os.environ.items() if k != "BUILD_REVISION"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "src"]):
        subprocess.run(["git", "-C", str(src), *args], check=True, env=env, capture_output=True)
    head = subprocess.check_output(["git", "-C", str(src), "rev-parse", "HEAD"], text=True).strip()

    def build(**extra: str) -> str:
        out = tmp_path / f"wheel-{len(extra)}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out),
                str(src),
            ],
            check=True,
            env={**env, **extra},
            capture_output=True,
            timeout=300,
        )
        (wheel,) = out.glob("trainer_metrics-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(out / "site")
            return archive.read("app/REVISION").decode().strip()

    assert build() == head
    assert build(BUILD_REVISION="v0.1.0-rc1") == "v0.1.0-rc1"
    # Installed (no .git beside app/): --version reads the file.
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main(['--version']))"],
        cwd=tmp_path,
        check=False,
        env={**env, "PYTHONPATH": str(tmp_path / "wheel-1" / "site")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == f"trainer-metrics {__version__} (revision v0.1.0-rc1)", result.stderr
