"""Settings are validated for meaning, not only type: every bad value stops start-up with one line naming
the setting and exit code 2, before anything is bound or started. Kubeconfig problems included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main as cli_main
from app.config import ENV_PREFIX, Settings
from app.replica.preflight import check_kube_access


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config unless a test writes one


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


def assert_one_line(code: int, err: list[str], *needles: str) -> None:
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("trainer-metrics: "), err
    for needle in needles:
        assert needle in err[0], err[0]


BAD_VALUES = [
    # namespaces: DNS-1123 labels, no empty entries, no duplicates
    ("NAMESPACES", "Bad_NS", "not a valid namespace"),
    ("NAMESPACES", "a b", "not a valid namespace"),
    ("NAMESPACES", "../../../api/v1", "not a valid namespace"),
    ("NAMESPACES", ",", "empty namespace in the list"),
    ("NAMESPACES", "team-a,,team-b", "empty namespace in the list"),
    ("NAMESPACES", "team-a,", "empty namespace in the list"),
    ("NAMESPACES", "team-a,team-a", "listed twice"),
    ("NAMESPACES", "x" * 64, "at most 63 characters"),
    ("WATCH_CLUSTER_RUNTIMES", "maybe", "valid boolean"),
    # leader election: finite, within bounds
    ("LEASE_DURATION_SECONDS", "inf", "finite number"),
    ("LEASE_DURATION_SECONDS", "nan", "finite number"),
    ("LEASE_DURATION_SECONDS", "0.5", "greater than or equal to 1"),
    ("LEASE_DURATION_SECONDS", "86400", "less than or equal to 3600"),
    ("RENEW_DEADLINE_SECONDS", "0.1", "greater than or equal to 0.5"),
    ("RETRY_PERIOD_SECONDS", "1e-9", "greater than or equal to 0.1"),
    ("RETRY_PERIOD_SECONDS", "-inf", "finite number"),
    ("LEASE_NAME", "Not_A_Name", "not a valid Lease name"),
    ("LEASE_NAMESPACE", "Kube System", "not a valid namespace"),
    ("IDENTITY", "pod\x1b[31m", "printable"),
    # HTTP server
    ("PROBE_PORT", "70000", "less than or equal to 65535"),
    ("PROBE_PORT", "maybe", "valid integer"),
    ("MAX_CONNECTIONS", "1", "greater than or equal to 16"),
    ("MAX_CONNECTIONS_PER_CLIENT", "0", "greater than or equal to 1"),
    ("HTTP_HEADER_TIMEOUT_SECONDS", "0", "greater than or equal to 0.5"),
    ("HTTP_HEADER_TIMEOUT_SECONDS", "inf", "finite number"),
    ("HTTP_KEEP_ALIVE_TIMEOUT_SECONDS", "0", "greater than or equal to 1"),
    # auth
    ("AUTH_CACHE_SECONDS", "inf", "finite number"),
    ("AUTH_CACHE_SECONDS", "1e6", "less than or equal to 3600"),
    ("AUTH_REVIEWS_PER_SECOND", "0", "greater than or equal to 0.1"),
    ("AUTH_REVIEWS_PER_CLIENT_PER_SECOND", "nan", "finite number"),
    # informers and limits
    ("WATCH_INACTIVITY_TIMEOUT_SECONDS", "inf", "finite number"),
    ("WATCH_INACTIVITY_TIMEOUT_SECONDS", "0", "greater than or equal to 1"),
    ("WATCH_TIMEOUT_MAX_SECONDS", "100000", "less than or equal to 3600"),
    ("MAX_OBJECT_BYTES", str(1 << 30), "less than or equal to 268435456"),
    ("HANDOVER_JOURNAL_SIZE", str(10**9), "less than or equal to 10000000"),
    ("TERMINAL_PAGE_MAX", str(10**9), "less than or equal to 100000"),
    # pod series
    ("POD_SERIES", "sometimes", "valid boolean"),
    ("POD_SERIES_MAX_PODS", "-1", "greater than or equal to 0"),
    ("POD_SERIES_MAX_PODS", str(10**7), "less than or equal to 1000000"),
]


@pytest.mark.parametrize(
    ("env", "value", "needle"), BAD_VALUES, ids=[f"{e}={v[:20]}" for e, v, _ in BAD_VALUES]
)
def test_bad_value_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(ENV_PREFIX + env, value)
    code, err = run_cli(capsys)
    assert_one_line(code, err, f"invalid setting {env.lower()} ({ENV_PREFIX}{env}):", needle)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"PORT": "9000", "PROBE_PORT": "9000"}, "probe_port must differ from port"),
        (
            {"HTTP_HEADER_TIMEOUT_SECONDS": "2", "HTTP_KEEP_ALIVE_TIMEOUT_SECONDS": "5"},
            "http_keep_alive_timeout_seconds must not exceed http_header_timeout_seconds",
        ),
        ({"LEASE_DURATION_SECONDS": "10"}, "lease_duration_seconds must be greater than renew_deadline"),
    ],
)
def test_contradicting_settings_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], needle: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(ENV_PREFIX + name, value)
    code, err = run_cli(capsys)
    assert_one_line(code, err, "invalid settings: ", needle)


def test_good_values_at_the_bounds() -> None:
    s = Settings(
        namespaces="team-a,b,x" + "y" * 61,
        lease_duration_seconds=1.5,
        renew_deadline_seconds=1.0,
        retry_period_seconds=0.2,
        probe_port="off",
        http_header_timeout_seconds=1,
        http_keep_alive_timeout_seconds=1,
    )
    assert s.namespaces == ["team-a", "b", "x" + "y" * 61]
    assert s.probe_port is None
    assert Settings(probe_port="0").probe_port == 0
    assert Settings(namespaces="").namespaces == []


def test_pod_series_are_on_by_default_and_the_env_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().pod_series is True
    assert Settings().pod_series_max_pods == 50_000
    monkeypatch.setenv(ENV_PREFIX + "POD_SERIES", "false")
    monkeypatch.setenv(ENV_PREFIX + "POD_SERIES_MAX_PODS", "0")
    s = Settings()
    assert (s.pod_series, s.pod_series_max_pods) == (False, 0)


# ---------------------------------------------------------------------------------------------- kubeconfig

GOOD = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: token
  user: {token: abc}
- name: cert
  user: {client-certificate: /nonexistent/cert.pem, client-key: /nonexistent/key.pem}
- name: exec
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: /nonexistent/credential-plugin}
contexts:
- name: ok
  context: {cluster: c, user: token}
- name: cert
  context: {cluster: c, user: cert}
- name: exec
  context: {cluster: c, user: exec}
- name: dangling
  context: {cluster: c, user: nobody}
current-context: ok
"""


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def directory(path: Path) -> str:
    path.mkdir(parents=True)
    return str(path)


KUBECONFIG_CASES = [
    ("missing", lambda d: str(d / "nope.yaml"), None, "kubeconfig", "does not exist"),
    ("directory", directory, None, "kubeconfig", "is not a file"),
    ("garbage", lambda d: write(d / "k", "clusters: [\n"), None, "kubeconfig", "is not valid YAML at line"),
    ("text", lambda d: write(d / "k", "just some text\n"), None, "kubeconfig", "is not a kubeconfig"),
    ("empty", lambda d: write(d / "k", ""), None, "kubeconfig", "is not a kubeconfig"),
    ("unknown-context", lambda d: write(d / "k", GOOD), "nope", "kube_context", "context 'nope' is not in"),
    (
        "no-current-context",
        lambda d: write(d / "k", GOOD.replace("current-context: ok\n", "")),
        None,
        "kube_context",
        "has no current-context",
    ),
    ("dangling-user", lambda d: write(d / "k", GOOD), "dangling", "kube_context", "names user 'nobody'"),
    ("client-cert-missing", lambda d: write(d / "k", GOOD), "cert", "kubeconfig", "/nonexistent/cert.pem"),
    ("exec-plugin-missing", lambda d: write(d / "k", GOOD), "exec", "kubeconfig", "credential-plugin"),
]


@pytest.mark.parametrize(
    ("make", "context", "setting", "needle"),
    [c[1:] for c in KUBECONFIG_CASES],
    ids=[c[0] for c in KUBECONFIG_CASES],
)
def test_kubeconfig_problem_is_one_line_and_exit_2(  # noqa: PLR0917
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    make: object,
    context: str | None,
    setting: str,
    needle: str,
) -> None:
    path = make(tmp_path / "kc")  # type: ignore[operator]
    args = ["--kubeconfig", path] + (["--kube-context", context] if context else [])
    code, err = run_cli(capsys, *args)
    assert_one_line(code, err, f"invalid setting {setting} ({ENV_PREFIX}{setting.upper()})", needle)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_kubeconfig(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = Path(write(tmp_path / "k", GOOD))
    path.chmod(0)
    code, err = run_cli(capsys, "--kubeconfig", str(path))
    assert_one_line(code, err, "kubeconfig", "cannot read")


def test_default_locations_are_named_when_unset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run_cli(capsys)  # no $KUBECONFIG, an empty $HOME
    assert_one_line(
        code, err, "kubeconfig (TRAINER_METRICS_KUBECONFIG): unset, so ~/.kube/config", "does not exist"
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "a.yaml") + os.pathsep + str(tmp_path / "b.yaml"))
    code, err = run_cli(capsys)
    assert_one_line(code, err, "unset, so $KUBECONFIG", "a.yaml", "does not exist")


def test_in_cluster_without_a_token_names_the_service_account(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running in a pod")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    code, err = run_cli(capsys)
    assert_one_line(code, err, "the in-cluster service account: cannot load", "set kubeconfig")


async def test_good_kubeconfig_passes(tmp_path: Path) -> None:
    await check_kube_access(Settings(kubeconfig=write(tmp_path / "k", GOOD)))
    await check_kube_access(Settings(kubeconfig=write(tmp_path / "k", GOOD), kube_context="ok"))


def test_real_process_exits_2_with_one_line(tmp_path: Path) -> None:
    """As a user runs it: no traceback, exit code 2 (uvicorn's lifespan failure used to be 3)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k != "KUBECONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "--kubeconfig", str(tmp_path / "missing.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainer-metrics: invalid setting kubeconfig (TRAINER_METRICS_KUBECONFIG): "
        f"{tmp_path / 'missing.yaml'} does not exist"
    ]
