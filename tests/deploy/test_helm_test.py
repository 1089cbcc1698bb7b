"""The chart's `helm test` hook (templates/tests/endpoints.yaml): the Pod it renders for each way Prometheus
can be told to scrape (token and TLS check of the ServiceMonitor), and the check it runs (files/helm_test.py),
run here as the Pod runs it, against the real exporter serving HTTPS with bearer-token auth."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.replica.simulate import DEMO_SCRAPER_TOKEN
from image import build
from tests.support.replica_process import SIMULATED_ALONE, running

from .chart import CHART_DIR, FULLNAME, NAMESPACE, ROOT, Obj, Rendered, RenderFn, production_values

SCRIPT = (CHART_DIR / "files" / "helm_test.py").read_text()
OPENSSL = shutil.which("openssl")


def hook_pod(rendered: Rendered) -> Obj:
    pod = rendered.one("Pod", f"{FULLNAME}-test")
    return pod


def pod_env(pod: Obj) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def volumes(pod: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod["spec"].get("volumes", [])}


def test_default_pod_is_a_hook_that_no_selector_takes_for_a_replica(render: RenderFn) -> None:
    rendered = render()
    pod = hook_pod(rendered)
    meta = pod["metadata"]
    assert meta["namespace"] == NAMESPACE
    assert meta["annotations"]["helm.sh/hook"] == "test"
    assert meta["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    service_selector = rendered.one("Service")["spec"]["selector"]
    assert not service_selector.items() <= meta["labels"].items()  # never an endpoint of the Service
    pdb_selector = rendered.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert not pdb_selector.items() <= meta["labels"].items()
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    # The exporter's own image and its Python: nothing else to pull; the script is files/helm_test.py.
    assert container["image"] == rendered.container["image"]
    assert container["command"] == ["/opt/venv/bin/python", "-c", SCRIPT]
    assert container["securityContext"] == rendered.container["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert pod_env(pod) == {
        "TM_URL": f"http://{FULLNAME}.{NAMESPACE}.svc:8080",
        "TM_AUTH": "false",
        "TM_EXPECT": "trainer_metrics_build_info",
        "TM_READY_TIMEOUT": "120",
    }
    assert "volumes" not in spec and "volumeMounts" not in container
    assert "Pod" not in render({"testFramework": {"enabled": False}}).kinds()


def test_pod_runs_the_python_of_the_exporters_image(render: RenderFn) -> None:
    """The hook runs the image's own interpreter: the one beside the entrypoint (image/build.py makes it; the
    Dockerfile runs build.py, and image/check.py checks the image has it)."""
    (container,) = hook_pod(render())["spec"]["containers"]
    python = Path(container["command"][0])
    assert python == Path(build.VENV) / "bin" / "python"
    assert python.parent == Path(build.ENTRYPOINT[0]).parent, build.ENTRYPOINT
    check = (ROOT / "image" / "check.py").read_text()
    assert 'hook_python = rootfs / VENV.lstrip("/") / "bin" / "python"' in check


def test_production_pod_scrapes_with_the_scrape_token_and_the_monitors_tls_check(render: RenderFn) -> None:
    rendered = render(production_values())
    pod = hook_pod(rendered)
    endpoint = rendered.one("ServiceMonitor")["spec"]["endpoints"][0]
    env = pod_env(pod)
    assert env["TM_URL"] == f"https://{FULLNAME}.{NAMESPACE}.svc:8080"
    assert env["TM_AUTH"] == "true" and env["TM_INSECURE"] == "false"
    assert env["TM_SERVER_NAME"] == endpoint["tlsConfig"]["serverName"]
    vols = volumes(pod)
    credentials = endpoint["authorization"]["credentials"]
    assert vols["token"]["secret"] == {
        "secretName": credentials["name"],
        "items": [{"key": credentials["key"], "path": "token"}],
    }
    ca = endpoint["tlsConfig"]["ca"]["secret"]
    assert vols["ca"]["secret"] == {
        "secretName": ca["name"],
        "optional": True,
        "items": [{"key": ca["key"], "path": "ca.crt"}],
    }
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert env["TM_TOKEN_FILE"] == mounts["token"] + "/token"
    assert env["TM_CA_FILE"] == mounts["ca"] + "/ca.crt"
    # The NetworkPolicy of production admits it (ingressFrom names the monitoring namespace only).
    peers = [rule["from"] for rule in rendered.one("NetworkPolicy")["spec"]["ingress"]]
    test_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": pod["metadata"]["labels"]["app.kubernetes.io/name"],
                "app.kubernetes.io/instance": "tm",
            }
        },
    }
    assert [test_peer] in peers


def test_pod_runs_beside_a_monitor_in_another_namespace(render: RenderFn) -> None:
    values = {"auth": {"enabled": True}, "serviceMonitor": {"enabled": True, "namespace": "monitoring"}}
    rendered = render(values)
    pod = hook_pod(rendered)
    # Where the Operator reads the token Secret from, and so can the Pod.
    assert pod["metadata"]["namespace"] == "monitoring"
    assert rendered.one("Secret")["metadata"]["namespace"] == "monitoring"
    assert volumes(pod)["token"]["secret"]["secretName"] == f"{FULLNAME}-scraper-token"
    assert pod_env(pod)["TM_URL"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8080"


@pytest.mark.parametrize(
    ("monitor", "secret"),
    [
        (
            {"authorization": {"type": "Bearer", "credentials": {"name": "prom-token", "key": "t"}}},
            {"secretName": "prom-token", "items": [{"key": "t", "path": "token"}]},
        ),
        (
            {"bearerTokenSecret": {"name": "old-token", "key": "token"}},
            {"secretName": "old-token", "items": [{"key": "token", "path": "token"}]},
        ),
        ({"bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, None),
        ({"enabled": False}, None),  # auth without a monitor: no scrape token to check with
    ],
    ids=["authorization", "bearer-token-secret", "bearer-token-file", "no-monitor"],
)
def test_pod_token_is_the_one_the_monitor_presents(
    render: RenderFn, monitor: dict[str, Any], secret: Obj | None
) -> None:
    pod = hook_pod(render({"auth": {"enabled": True}, "serviceMonitor": {"enabled": True, **monitor}}))
    env = pod_env(pod)
    assert env["TM_AUTH"] == "true"
    if secret is None:
        # Only checked to refuse a scrape without a token (401).
        assert "TM_TOKEN_FILE" not in env and "token" not in volumes(pod)
    else:
        assert volumes(pod)["token"]["secret"] == secret


def test_pod_follows_a_custom_tls_config(render: RenderFn) -> None:
    values = copy.deepcopy(production_values())
    values["serviceMonitor"]["tlsConfig"] = {
        "serverName": "metrics.example.com",
        "ca": {"configMap": {"name": "corp-ca", "key": "bundle.pem"}},
    }
    pod = hook_pod(render(values))
    assert pod_env(pod)["TM_SERVER_NAME"] == "metrics.example.com"
    assert volumes(pod)["ca"]["configMap"] == {
        "name": "corp-ca",
        "optional": True,
        "items": [{"key": "bundle.pem", "path": "ca.crt"}],
    }
    values["serviceMonitor"]["tlsConfig"] = {"insecureSkipVerify": True}
    pod = hook_pod(render(values))
    assert pod_env(pod)["TM_INSECURE"] == "true" and "ca" not in volumes(pod)


# --- the check itself ---------------------------------------------------------------------------------------


def run_check(env: dict[str, str], script: str = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class _Plain(BaseHTTPRequestHandler):
    ready = False

    def do_GET(self) -> None:
        if self.path == "/readyz":
            status, body = (200, b"ok") if _Plain.ready else (503, b"informer trainjobs has not synced")
            _Plain.ready = True  # ready from the second probe on: the check waits for it
        elif self.path == "/metrics":
            status, body = 200, b'trainer_metrics_build_info{version="0.1.0"} 1.0\n'
        else:
            status, body = 404, b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def plain_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_check_waits_for_readiness_over_plain_http(render: RenderFn, plain_server: int) -> None:
    env = pod_env(hook_pod(render()))
    env["TM_URL"] = f"http://127.0.0.1:{plain_server}"
    result = run_check(env, hook_pod(render())["spec"]["containers"][0]["command"][2])
    assert result.returncode == 0, result.stderr
    assert "/readyz 200" in result.stdout and "/metrics 200 without a token" in result.stdout
    env["TM_EXPECT"] = "kubeflow_trainer_runtime_info"
    result = run_check(env)
    assert result.returncode == 1 and "no 'kubeflow_trainer_runtime_info'" in result.stderr


def test_check_reports_a_replica_that_never_gets_ready(tmp_path: Path) -> None:
    result = run_check({"TM_URL": "http://127.0.0.1:9", "TM_READY_TIMEOUT": "1"})
    assert result.returncode == 1
    assert "FAILED: /readyz did not answer 200 within 1 s (last: ConnectionRefusedError" in result.stderr


@pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not available")
def test_check_against_the_exporter_with_tls_and_auth(render: RenderFn, tmp_path: Path) -> None:
    """The production Pod's check, pointed at the real exporter (simulated cluster, auth and TLS on): it
    passes with the scrape token, and fails on a wrong token, a missing token, or a wrong server name."""
    assert OPENSSL is not None
    server_name = f"{FULLNAME}.{NAMESPACE}.svc"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={server_name}",
            "-addext", f"subjectAltName=DNS:{server_name},IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    token = tmp_path / "token"
    token.write_text(DEMO_SCRAPER_TOKEN + "\n")
    pod = hook_pod(render(production_values()))
    script = pod["spec"]["containers"][0]["command"][2]
    settings = {"auth_enabled": "true", "tls_cert_file": str(cert), "tls_key_file": str(key)}
    with running(tmp_path / "exporter.log", {**SIMULATED_ALONE, **settings}, timeout=60) as ex:
        env = pod_env(pod)
        env.update(TM_URL=f"https://127.0.0.1:{ex.port}", TM_CA_FILE=str(cert), TM_TOKEN_FILE=str(token))
        result = run_check(env, script)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines() == [
            f"ok: https://127.0.0.1:{ex.port}/readyz 200",
            f"ok: https://127.0.0.1:{ex.port}/metrics 200 with the scrape token"
            f" ({result.stdout.split('(')[1].split(' bytes')[0]} bytes, trainer_metrics_build_info present)",
            f"ok: https://127.0.0.1:{ex.port}/metrics 401 without a token",
        ]

        token.write_text("not-a-token")
        result = run_check(env, script)
        assert result.returncode == 1 and "FAILED: /metrics with the scrape token: 401" in result.stderr

        result = run_check({**env, "TM_TOKEN_FILE": str(tmp_path / "absent")}, script)
        assert result.returncode == 0, result.stderr  # no token: only the refusal is checked
        assert "401 without a token" in result.stdout and "with the scrape token" not in result.stdout

        result = run_check({**env, "TM_AUTH": "false", "TM_TOKEN_FILE": ""}, script)
        assert result.returncode == 1 and "/metrics without a token: 401" in result.stderr

        # A certificate that does not verify is not waited for.
        result = run_check({**env, "TM_SERVER_NAME": "elsewhere.example.com"}, script)
        assert result.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in result.stderr
